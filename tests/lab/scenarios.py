"""The lab's scenarios: what each one plants, as data tests can assert on.

Every scenario plays the same cluster: ``nodes`` DGX-class nodes (``node-00`` ..), all
running one training job (namespace ``training``, pods ``llm-<n>``, job ``llm``) on all
eight GPUs and the eight 400G compute rails of every node. A scenario plants at most one
cause, from ``start_fraction`` of the run on; ``throughput_ratio`` is what the job's
tokens/s fall to while it is active (1.0: the cause does not slow the job).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

#: the founding story's figures: tokens/s of the job before and after the bad link
GOOD_TOKENS_PER_SECOND = 55803.1245
BAD_TOKENS_PER_SECOND = 36769.6582

NAMESPACE = "training"
JOB_NAME = "llm"
#: the job's container in each pod
CONTAINER = "trainer"


def node_name(i: int) -> str:
    return f"node-{i:02d}"


def pod_name(i: int) -> str:
    return f"{JOB_NAME}-{i}"


@dataclass(frozen=True, slots=True)
class Cause:
    """The planted cause. ``kind`` names it; the rest locate it, each in the label
    vocabulary its series carry (``instance`` is the node): ``device``/``port`` an RDMA
    port, ``netdev`` its interface, ``gpu`` an NVML index, ``pci_bus_id`` a PCI function,
    ``finding`` the agent finding (or workload finding) it should raise, ``transport`` the NCCL
    transport a run chose."""

    kind: str
    node: str
    finding: str
    device: str | None = None
    port: str | None = None
    netdev: str | None = None
    gpu: str | None = None
    pci_bus_id: str | None = None
    transport: str | None = None  # the NCCL transport the faulty run chose (fabricscope_nccl_*)


@dataclass(frozen=True, slots=True)
class Noisy:
    """A link that counts symbol errors at a steady rate from the start of the run (a
    marginal link its FEC corrects): unchanged, so not a cause of anything."""

    node: str
    device: str
    per_second: float


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    summary: str
    cause: Cause | None
    throughput_ratio: float = 1.0
    nodes: int = 4
    start_fraction: float = 0.4
    #: links with a steady symbol error rate from the start, whatever the cause
    noisy: tuple[Noisy, ...] = ()
    #: (RDMA device, ticks): that device's 32-bit port_xmit_wait starts this far below its
    #: maximum on every node (it saturates when its port starts waiting hard)
    xmit_wait_headroom: tuple[str, int] | None = None
    #: (node, RDMA device) whose link stands DOWN from the start (no traffic, no change)
    down: tuple[tuple[str, str], ...] = ()
    #: what the job prints: "composer" (tokens/s) or "deepspeed" (samples/s only, as
    #: DeepSpeed's throughput timer does)
    job_format: str = "composer"
    #: how the job's pods got their GPUs and NICs: "device_plugin" (nvidia.com/gpu and an RDMA
    #: plugin's pool) or "dra" (ResourceClaims only, with the drivers' CDI specs:
    #: tests/lab/dra.py)
    allocation: str = "device_plugin"

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(node_name(i) for i in range(self.nodes))


#: compute rail (400G ConnectX-7) of each GPU of the DGX tree, by NVML index, and its netdev
RAILS: tuple[tuple[str, str], ...] = (
    ("mlx5_0", "ens38np0"),
    ("mlx5_3", "ens39np0"),
    ("mlx5_4", "ens37np0"),
    ("mlx5_5", "ens36np0"),
    ("mlx5_6", "ens32np0"),
    ("mlx5_9", "ens33np0"),
    ("mlx5_10", "ens34np0"),
    ("mlx5_11", "ens35np0"),
)

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "healthy",
            "4-node job at full speed; a few symbol errors per hour on healthy links",
            None,
        ),
        Scenario(
            "ib_link_bad",
            "one marginal link on node-01's rail mlx5_4 (a RoCE port of the DGX tree; "
            "the same PMA counters as InfiniBand): symbol errors, two link-downs (the port "
            "goes DOWN and comes back), port_xmit_wait up; the job's tokens/s fall 34 % "
            "from the fault's start",
            Cause(
                "ib_link_errors",
                "node-01",
                "port_errors",
                device="mlx5_4",
                port="1",
                netdev="ens37np0",
                gpu="2",
            ),
            throughput_ratio=BAD_TOKENS_PER_SECOND / GOOD_TOKENS_PER_SECOND,
        ),
        Scenario(
            "roce_incast",
            "incast onto node-02's rail mlx5_9: it sends PFC pause and CNPs, senders are "
            "paused; the job slows 15 %; the rail's 32-bit port_xmit_wait counters, long "
            "unreset, saturate on every node within a minute of the incast (that evidence "
            "goes blind)",
            Cause(
                "roce_incast",
                "node-02",
                "congestion",
                device="mlx5_9",
                port="1",
                netdev="ens33np0",
                gpu="5",
            ),
            throughput_ratio=0.85,
            xmit_wait_headroom=("mlx5_9", 2_000_000),
        ),
        Scenario(
            "nvlink_errors",
            "NVLink replay, recovery and CRC-flit errors on GPU 5 of node-03 (NVML replay); "
            "the job slows 6 %; node-00's rail mlx5_0 counts 10 symbol errors a second "
            "from the start to the end (a marginal link its FEC corrects: not the cause)",
            Cause("nvlink_errors", "node-03", "nvlink_errors", gpu="5"),
            throughput_ratio=0.94,
            noisy=(Noisy("node-00", "mlx5_0", 10.0),),
        ),
        Scenario(
            "pcie_x8_nic",
            "node-02's ConnectX-7 mlx5_3 (0000:3c:00.0, the rail of GPU 1) retrains at "
            "PCIe x8; its rail caps at half bandwidth and the job slows 20 %",
            Cause(
                "pcie_width_degraded",
                "node-02",
                "pci_link_width_degraded",
                pci_bus_id="0000:3c:00.0",
                device="mlx5_3",
                port="1",
                netdev="ens39np0",
                gpu="1",
            ),
            throughput_ratio=0.80,
        ),
        Scenario(
            "nccl_socket_fallback",
            "the job's next run: at the fault every pod's container restarts and its NCCL finds "
            "no RDMA device in the pod, so it connects the nodes over NET/Socket where the "
            "previous run used NET/IB with GPUDirect RDMA on each GPU's rail; no hardware fault "
            "at all; the job's tokens/s fall 34 %",
            Cause(
                "nccl_socket_fallback", "node-00", "nccl_socket_transport", transport="NET/Socket"
            ),
            throughput_ratio=BAD_TOKENS_PER_SECOND / GOOD_TOKENS_PER_SECOND,
        ),
        Scenario(
            "nccl_hca_off_numa",
            "the job's next run: at the fault every pod's container restarts with NCCL_IB_HCA "
            "naming, for each GPU, the rail of the GPU four places on (on the other socket): "
            "NCCL still uses NET/IB with GPUDirect RDMA, now through an HCA on another NUMA "
            "node than the GPU for every GPU; no hardware fault; the job slows 20 %",
            Cause("nccl_hca_off_numa", "node-00", "nccl_hca_off_gpu_numa", transport="NET/IB"),
            throughput_ratio=0.80,
        ),
        Scenario(
            "ib_rate_drop",
            "node-01's rail mlx5_5 (GPU 3) retrains from 400 Gb/sec (4X NDR) to 100 Gb/sec "
            "(1X NDR): the port stays ACTIVE, every error counter flat, its data counters "
            "grow at a quarter of their rate; the job slows 34 %; node-01's rail mlx5_11 "
            "stands DOWN from the start (a cable pulled before the run: no traffic, no change)",
            Cause(
                "ib_rate_drop",
                "node-01",
                "port_rate_degraded",
                device="mlx5_5",
                port="1",
                netdev="ens36np0",
                gpu="3",
            ),
            throughput_ratio=0.66,
            down=(("node-01", "mlx5_11"),),
        ),
        Scenario(
            "pcie_speed_nic",
            "node-03's ConnectX-7 mlx5_10 (0000:cc:00.0, the rail of GPU 6) retrains its PCIe "
            "link from 32 to 8 GT/s, width unchanged (x16 at Gen3: about 16 GB/s, under a "
            "third of the 400G rail); the job slows 30 %",
            Cause(
                "pcie_speed_degraded",
                "node-03",
                "pci_link_speed_degraded",
                pci_bus_id="0000:cc:00.0",
                device="mlx5_10",
                port="1",
                netdev="ens34np0",
                gpu="6",
            ),
            throughput_ratio=0.70,
        ),
        Scenario(
            "wrong_numa",
            "node-03's pod is pinned to the CPUs of the other NUMA node than its GPUs; no "
            "fabric fault at all; the job slows 10 %",
            Cause("wrong_numa", "node-03", "process_cpus_off_gpu_numa"),
            throughput_ratio=0.90,
        ),
    )
}


#: Scenarios the parametrized tests do not run: the ``ib_link_bad`` fault under a job that
#: prints samples/s only (DeepSpeed), for the Job dashboard's samples/s preview; and under
#: Dynamic Resource Allocation, which its own test runs.
VARIANTS: dict[str, Scenario] = {
    "ib_link_bad_samples": replace(
        SCENARIOS["ib_link_bad"],
        name="ib_link_bad_samples",
        summary=SCENARIOS["ib_link_bad"].summary + "; the job prints DeepSpeed's samples/s only",
        job_format="deepspeed",
    ),
    # the same fault on a cluster where the job's GPUs and rails come only from
    # ResourceClaims (Dynamic Resource Allocation): explain and the Job board read the same
    "ib_link_bad_dra": replace(
        SCENARIOS["ib_link_bad"],
        name="ib_link_bad_dra",
        summary=SCENARIOS["ib_link_bad"].summary
        + "; the GPUs and rails are ResourceClaims' (Dynamic Resource Allocation)",
        allocation="dra",
    ),
}

#: every scenario by name, the variants included (what a lab build can play)
ALL_SCENARIOS: dict[str, Scenario] = {**SCENARIOS, **VARIANTS}
