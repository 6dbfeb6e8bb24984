"""Dynamic Resource Allocation, MIG, shared GPUs and SR-IOV VFs attributed end to end: the
kubelet's pod-resources ``List`` with ``dynamic_resources`` (a real gRPC server on a unix
socket), the claims' CDI specs and the driver's procfs from tests/fixtures/cdi-dra (curated:
its PROVENANCE.md says what is transcribed and what synthesized; the GPU's procfs file was
recorded on an H200), a sysfs tree with a VF's ``physfn`` link, the exported series and the
probe's view of which GPUs are taken."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from agent.core.sysfs import Issues, SysfsReader
from agent.infiniband.records import InfinibandSnapshot
from agent.kubernetes import podresources_pb2 as pb
from agent.kubernetes import podresources_pb2_grpc as pb_grpc
from agent.kubernetes.allocation import GpuAllocation
from agent.kubernetes.attribution import (
    AttributionSampler,
    AttributionSnapshot,
    GpuAttribution,
    RdmaAttribution,
    _physfn,
    attribute_allocations,
    gpu_allocation,
)
from agent.kubernetes.podresources import ContainerAllocation, DeviceAllocation, PodAllocation
from agent.nvml.snapshot import NvmlGpu, NvmlSnapshot
from exporter.metrics import attribution as render_attribution
from exporter.metrics.exposition import render_text
from exporter.metrics.spec import Families
from tests.kubernetes.test_attribution import Lister, ib_device
from tests.promharness import promtool_check_metrics

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cdi-dra"
H200 = "GPU-e0994de4-8084-3401-2ea6-a123360289e0"  # recorded: minor 0 at 0000:00:06.0
WHOLE_UID = "dab5ab50-d59a-42a6-af16-cfd4628c0f7a"
MIG_UID = "c8593c85-440d-4156-b199-aea592ff83df"
WHOLE = f"k8s.gpu.nvidia.com/claim={WHOLE_UID}-gpu-0"
MIG = f"k8s.gpu.nvidia.com/claim={MIG_UID}-gpu-0-mig-1g18gb-19-0"
VF_CDI = "rdma.example.com/vf=vf-0000-1a-00-2"

NVML = NvmlSnapshot(
    driver_version="580.159.04",
    gpus=(NvmlGpu(index=0, pci_bus_id="0000:00:06.0", uuid=H200),),
)
# the PF's RDMA device; the VF's own (mlx5_2) is visible on the host too (shared RDMA mode)
IB = InfinibandSnapshot(
    devices=(ib_device("mlx5_0", "0000:1a:00.0"), ib_device("mlx5_2", "0000:1a:00.2"))
)


def claim(name: str, driver: str, device: str, *cdi: str) -> pb.DynamicResource:
    return pb.DynamicResource(
        claim_name=name,
        claim_namespace="ml",
        claim_resources=[
            pb.ClaimResource(
                cdi_devices=[pb.CDIDevice(name=c) for c in cdi],
                driver_name=driver,
                pool_name="node-a",
                device_name=device,
            )
        ],
    )


def pod(name: str, container: str, *claims: pb.DynamicResource) -> pb.PodResources:
    return pb.PodResources(
        name=name,
        namespace="ml",
        containers=[pb.ContainerResources(name=container, dynamic_resources=list(claims))],
    )


GPU_CLAIM = claim("trainer-0-gpus-x7k2p", "gpu.nvidia.com", "gpu-0", WHOLE)
MIG_CLAIM = claim("tiny-0-slice-q9z4m", "gpu.nvidia.com", "gpu-0-mig-1g18gb-19-0", MIG)
NIC_CLAIM = claim("trainer-0-nic-5hh2w", "rdma.example.com", "vf-0000-1a-00-2", VF_CDI)
# one claim shared by two pods (DRA's own sharing): both hold the GPU
SHARED = claim("shared-gpu", "gpu.nvidia.com", "gpu-0", WHOLE)


@pytest.fixture
def sys_root(tmp_path: Path) -> Path:
    """The kernel's links for a VF on the host: ``physfn`` to its PF, and the verbs node's
    RDMA device (``class/infiniband_verbs/uverbs2/ibdev``)."""
    sys = tmp_path / "sys"
    vf = sys / "bus/pci/devices/0000:1a:00.2"
    vf.mkdir(parents=True)
    (sys / "bus/pci/devices/0000:1a:00.0").mkdir()
    (vf / "physfn").symlink_to("../0000:1a:00.0")
    verbs = sys / "class/infiniband_verbs/uverbs2"
    verbs.mkdir(parents=True)
    (verbs / "ibdev").write_text("mlx5_2\n")
    return sys


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[tuple[Lister, Path]]:
    path = tmp_path / "kubelet.sock"
    lister = Lister()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_PodResourcesListerServicer_to_server(lister, server)
    server.add_insecure_port("unix://" + str(path))
    server.start()
    yield lister, path
    server.stop(grace=None)


def sample(
    kubelet: tuple[Lister, Path],
    sys_root: Path,
    *pods: pb.PodResources,
    cdi: Path = FIXTURES / "cdi",
) -> AttributionSnapshot:
    lister, path = kubelet
    lister.pods = list(pods)
    s = AttributionSampler(
        gpus=lambda: NVML,
        rdma=lambda: IB,
        procfs=SysfsReader(FIXTURES / "proc"),
        sysfs=SysfsReader(sys_root),
        socket_path=str(path),
        cdi_root=str(cdi),
    )
    try:
        return s.sample()
    finally:
        s.close()


def test_claims_attribute_whole_gpus_mig_slices_and_vfs_with_their_physical_port(
    kubelet: tuple[Lister, Path], sys_root: Path
) -> None:
    snap = sample(
        kubelet,
        sys_root,
        pod("trainer-0", "worker", GPU_CLAIM, NIC_CLAIM),
        pod("tiny-0", "job", MIG_CLAIM),
    )
    assert snap.gpus == (
        GpuAttribution(
            "ml",
            "tiny-0",
            "job",
            H200,
            0,
            "0000:00:06.0",
            "podresources",
            "tiny-0-slice-q9z4m",
            "gi11/ci0",
        ),
        GpuAttribution(
            "ml",
            "trainer-0",
            "worker",
            H200,
            0,
            "0000:00:06.0",
            "podresources",
            "trainer-0-gpus-x7k2p",
        ),
    )
    assert snap.rdma == (
        RdmaAttribution(
            "ml",
            "trainer-0",
            "worker",
            "rdma.example.com",
            "vf-0000-1a-00-2",
            "mlx5_2",
            "0000:1a:00.2",
            "trainer-0-nic-5hh2w",
            "0000:1a:00.0",
            "mlx5_0",
        ),
    )
    assert snap.issues == () and snap.allocation_unknown is None
    # the probe: the GPU a claim (and a slice of it) holds is taken
    assert gpu_allocation(snap) == GpuAllocation(frozenset({0}))


def test_a_claim_shared_by_two_pods_is_attributed_to_both(
    kubelet: tuple[Lister, Path], sys_root: Path
) -> None:
    snap = sample(kubelet, sys_root, pod("a-0", "w", SHARED), pod("b-0", "w", SHARED))
    assert [(g.pod, g.gpu, g.claim) for g in snap.gpus] == [
        ("a-0", 0, "shared-gpu"),
        ("b-0", 0, "shared-gpu"),
    ]
    assert gpu_allocation(snap) == GpuAllocation(frozenset({0}))


def test_without_the_cdi_directory_nvidia_device_names_still_resolve(
    kubelet: tuple[Lister, Path], sys_root: Path, tmp_path: Path
) -> None:
    """No CDI dir mounted: ``gpu-<minor>`` and ``gpu-<minor>-mig-...`` (the driver's names,
    from the pod-resources API) are resolved through the driver's minors; the VF's driver
    names nothing resolvable, so it is not attributed."""
    snap = sample(
        kubelet,
        sys_root,
        pod("trainer-0", "worker", GPU_CLAIM, NIC_CLAIM),
        pod("tiny-0", "job", MIG_CLAIM),
        cdi=tmp_path / "absent",
    )
    assert [(g.pod, g.gpu, g.uuid, g.mig) for g in snap.gpus] == [
        ("tiny-0", 0, H200, "mig-1g18gb-19-0"),
        ("trainer-0", 0, H200, ""),
    ]
    assert snap.rdma == ()
    assert snap.allocation_unknown is None


def test_an_unresolvable_gpu_claim_fails_the_probe_closed(
    kubelet: tuple[Lister, Path], sys_root: Path
) -> None:
    lost = claim("x-0-gpus", "gpu.nvidia.com", "gpu-7", "k8s.gpu.nvidia.com/claim=gone-gpu-7")
    snap = sample(kubelet, sys_root, pod("x-0", "w", lost))
    assert [(g.uuid, g.gpu, g.claim) for g in snap.gpus] == [("gpu-7", None, "x-0-gpus")]
    assert snap.allocation_unknown == "unmapped_device"
    assert gpu_allocation(snap).unknown == "unmapped_device"


CD_UID = "5f0e4d7a-93c1-4c1e-8a1b-2b6c0e9d1f34"
#: a ComputeDomain's channel claim as the driver's source says it looks (PROVENANCE.md)
CHANNEL_CLAIM = claim(
    "trainer-0-imex-channel-4xk2q",
    "compute-domain.nvidia.com",
    "channel-0",
    f"k8s.compute-domain.nvidia.com/claim={CD_UID}-channel-0",
)


def test_a_compute_domain_channel_is_attributed_and_the_gpus_stay_as_they_are(
    kubelet: tuple[Lister, Path], sys_root: Path
) -> None:
    """A pod of a multi-node NVLink job: its GPU claim and its ComputeDomain's IMEX channel
    claim. The channel (from its CDI spec's device node) is the pod's, names no GPU, and the
    GPU claim resolves exactly as without it; the probe's view is unchanged."""
    alone = sample(kubelet, sys_root, pod("trainer-0", "worker", GPU_CLAIM))
    snap = sample(kubelet, sys_root, pod("trainer-0", "worker", GPU_CLAIM, CHANNEL_CLAIM))
    assert snap.gpus == alone.gpus and snap.rdma == alone.rdma == ()
    assert [(c.pod, c.container, c.claim, c.channel) for c in snap.imex_channels] == [
        ("trainer-0", "worker", "trainer-0-imex-channel-4xk2q", 0)
    ]
    assert gpu_allocation(snap) == gpu_allocation(alone) == GpuAllocation(frozenset({0}))
    out = Families("minimal")
    render_attribution.render(snap, out)
    text = render_text(out).decode()
    assert (
        'fabricscope_pod_imex_channel_info{channel="0",claim="trainer-0-imex-channel-4xk2q",'
        'container="worker",namespace="ml",pod="trainer-0"} 1.0'
    ) in text
    promtool_check_metrics(text)


def test_a_channel_resolves_by_its_name_without_the_cdi_directory(
    kubelet: tuple[Lister, Path], sys_root: Path, tmp_path: Path
) -> None:
    snap = sample(kubelet, sys_root, pod("x-0", "w", CHANNEL_CLAIM), cdi=tmp_path / "absent")
    assert [c.channel for c in snap.imex_channels] == [0]
    assert snap.gpus == () and snap.allocation_unknown is None


def test_other_drivers_devices_that_name_no_gpu_nic_or_channel_are_not_attributed(
    kubelet: tuple[Lister, Path], sys_root: Path
) -> None:
    fpga = claim("f-0", "fpga.example.com", "fpga-0", "fpga.example.com/claim=f0-fpga-0")
    # a name that only looks like a channel, from a driver that is not the ComputeDomain's
    other = claim("o-0", "example.com", "channel-3", "example.com/claim=o0-channel-3")
    snap = sample(kubelet, sys_root, pod("x-0", "w", fpga, other))
    assert snap.gpus == () and snap.rdma == () and snap.imex_channels == ()
    assert snap.allocation_unknown is None


def test_a_hostile_cdi_directory_costs_issues_not_the_pass(
    kubelet: tuple[Lister, Path], sys_root: Path, tmp_path: Path
) -> None:
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    for f in (FIXTURES / "cdi").iterdir():
        (cdi / f.name).write_bytes(f.read_bytes())
    (cdi / "evil.yaml").symlink_to("/etc/passwd")
    (cdi / "broken.yaml").write_text("kind: [\n")
    snap = sample(kubelet, sys_root, pod("trainer-0", "worker", GPU_CLAIM), cdi=cdi)
    assert [(g.pod, g.gpu) for g in snap.gpus] == [("trainer-0", 0)]
    assert sorted((i.path, i.reason) for i in snap.issues) == [
        (f"{cdi}/broken.yaml", "parse"),
        (f"{cdi}/evil.yaml", "permission"),
    ]


def test_hostile_device_names_cost_bounded_time_and_fail_closed(
    kubelet: tuple[Lister, Path], sys_root: Path
) -> None:
    """Device names no real kubelet sends (the API server holds a driver's device names to
    DNS labels): 110 KB of ``-gpu-1-mig-`` repeated as a GPU claim's device and CDI device
    name, and a channel-like one for the ComputeDomain driver. Before names were bounded the
    GPU name pattern scanned to the end from every ``-gpu-<n>-mig-`` in it (a 44 KB name took
    11 s, this one about a minute). Now the pass is quick, the hostile GPU claim is a GPU no
    lookup resolved (the probe takes none), and the honest claim beside it resolves."""
    evil = "-gpu-1-mig-" * 10_000 + "!"
    chan = "-channel-1" * 11_000 + "!"
    hostile = claim("x-0-gpus", "gpu.nvidia.com", evil, f"k8s.gpu.nvidia.com/claim=u{evil}")
    domain = claim(
        "x-0-cd", "compute-domain.nvidia.com", chan, f"k8s.compute-domain.nvidia.com/claim={chan}"
    )
    started = time.monotonic()
    snap = sample(kubelet, sys_root, pod("x-0", "w", hostile, domain, GPU_CLAIM))
    assert time.monotonic() - started < 5.0
    assert sorted((g.claim, g.gpu, len(g.uuid)) for g in snap.gpus) == [
        ("trainer-0-gpus-x7k2p", 0, len(H200)),
        ("x-0-gpus", None, len(evil)),
    ]
    assert snap.imex_channels == ()
    assert gpu_allocation(snap).unknown == "unmapped_device"


def test_exported_series_carry_claim_mig_and_the_physical_function(
    kubelet: tuple[Lister, Path], sys_root: Path
) -> None:
    snap = sample(
        kubelet,
        sys_root,
        pod("trainer-0", "worker", GPU_CLAIM, NIC_CLAIM),
        pod("tiny-0", "job", MIG_CLAIM),
    )
    out = Families()
    render_attribution.render(snap, out)
    text = render_text(out).decode()
    assert (
        'fabricscope_pod_gpu_info{claim="tiny-0-slice-q9z4m",container="job",gpu="0",'
        'method="podresources",mig="gi11/ci0",namespace="ml",pci_bus_id="0000:00:06.0",'
        f'pod="tiny-0",uuid="{H200}"}} 1.0'
    ) in text.splitlines()
    assert (
        'fabricscope_pod_rdma_info{claim="trainer-0-nic-5hh2w",container="worker",'
        'device="mlx5_2",device_id="vf-0000-1a-00-2",namespace="ml",pci_bus_id="0000:1a:00.2",'
        'pf_device="mlx5_0",pf_pci_bus_id="0000:1a:00.0",pod="trainer-0",'
        'resource="rdma.example.com"} 1.0'
    ) in text.splitlines()
    promtool_check_metrics(text)


# --- device plugins: time-slicing, MPS, SR-IOV ------------------------------------------------


def test_time_slicing_replicas_attribute_every_pod_once_and_the_gpu_is_taken(
    sys_root: Path,
) -> None:
    """The device plugin's time-slicing ids (``<uuid>::<replica>``): two replicas given to
    one container are one series; each pod sharing the GPU gets its own."""
    pods = [
        PodAllocation(
            "ml",
            "a-0",
            (
                ContainerAllocation(
                    "w", (DeviceAllocation("nvidia.com/gpu", (f"{H200}::0", f"{H200}::3")),)
                ),
            ),
        ),
        PodAllocation(
            "ml",
            "b-0",
            (
                ContainerAllocation(
                    "w", (DeviceAllocation("nvidia.com/gpu.shared", (f"{H200}::1",)),)
                ),
            ),
        ),
    ]
    gpus, _, _ = attribute_allocations(pods, NVML, IB)
    assert [(g.pod, g.gpu, g.uuid) for g in gpus] == [("a-0", 0, H200), ("b-0", 0, H200)]
    snap = AttributionSnapshot(gpus=tuple(gpus))
    assert gpu_allocation(snap) == GpuAllocation(frozenset({0}))


def test_a_device_plugin_vf_gets_its_physical_function(sys_root: Path) -> None:
    pods = [
        PodAllocation(
            "ml",
            "t-0",
            (
                ContainerAllocation(
                    "w",
                    (
                        DeviceAllocation("intel.com/mlnx_sriov_rdma", ("0000:1a:00.2",)),
                        DeviceAllocation("rdma/hca_shared_devices_a", ("mlx5_0",)),
                    ),
                ),
            ),
        ),
    ]
    issues = Issues(SysfsReader(sys_root))
    _, rdma, _ = attribute_allocations(pods, NVML, IB, physfn=lambda pci: _physfn(pci, issues))
    assert [(r.device, r.pci_bus_id, r.pf_device, r.pf_pci_bus_id) for r in rdma] == [
        ("mlx5_2", "0000:1a:00.2", "mlx5_0", "0000:1a:00.0"),
        ("mlx5_0", "0000:1a:00.0", None, None),  # a PF has no physfn
    ]


def test_an_unreadable_verbs_node_is_an_issue_and_the_pci_address_still_resolves(
    kubelet: tuple[Lister, Path], sys_root: Path
) -> None:
    ibdev = sys_root / "class/infiniband_verbs/uverbs2/ibdev"
    ibdev.unlink()
    ibdev.mkdir()  # reading it fails with EISDIR
    snap = sample(kubelet, sys_root, pod("trainer-0", "worker", NIC_CLAIM))
    assert [(r.device, r.pci_bus_id, r.pf_device) for r in snap.rdma] == [
        ("mlx5_2", "0000:1a:00.2", "mlx5_0"),
    ]
    assert [(i.path, i.reason) for i in snap.issues] == [
        ("class/infiniband_verbs/uverbs2/ibdev", "io")
    ]
