"""Builds the enabled samplers from the configuration: the one place that knows them all."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from agent.config import AgentConfig
from agent.core.runner import SamplerSpec, SamplerStatus
from agent.core.sampler import Sampler, Snapshot
from agent.core.sysfs import SysfsReader
from agent.core.tools import check_tools
from agent.ibpeer.child import isolated_sampler as isolated_ibpeer
from agent.ibpeer.sampler import IbPeerSampler
from agent.infiniband.pma import PmaReader
from agent.infiniband.records import InfinibandSnapshot
from agent.infiniband.sampler import InfinibandSampler
from agent.kubernetes.allocation import GpuAllocation
from agent.kubernetes.attribution import AttributionSampler, AttributionSnapshot, gpu_allocation
from agent.kubernetes.pods import PodIndex
from agent.netdev.stats import DEFAULT_ETHTOOL_INCLUDE
from agent.nvml.api import NvmlApi
from agent.nvml.sampler import NvmlSampler, isolated_sampler
from agent.nvml.snapshot import NvmlSnapshot
from agent.nvml.topology import nvlinks_by_address
from agent.pci.sampler import PciSampler, PciSnapshot
from agent.ras.sampler import RasSampler
from agent.workload.records import WorkloadSnapshot
from agent.workload.sampler import WorkloadSampler, pod_identities

S = TypeVar("S")

#: samplers that join other samplers' latest snapshots; ``--once`` runs them after the rest
DEPENDENT = ("attribution", "workload", "throughput", "ras")


class Latest:
    """The runner's latest snapshots, for samplers that join other samplers' data
    (attribution needs NVML's and InfiniBand's; workload needs NVML's, PCI's and
    attribution's). Bound after the runner exists; unbound, everything is absent."""

    def __init__(self) -> None:
        self._get: Callable[[str], Snapshot | None] = lambda name: None
        self._status: Callable[[str], SamplerStatus | None] = lambda name: None

    def bind(
        self,
        get: Callable[[str], Snapshot | None],
        status: Callable[[str], SamplerStatus | None] | None = None,
    ) -> None:
        """``get``: a sampler's latest snapshot; ``status``: what the runner knows of its
        latest attempt (whether it ran at all, found no hardware, failed)."""
        self._get = get
        if status is not None:
            self._status = status

    def status(self, name: str) -> SamplerStatus | None:
        """The runner's status of sampler ``name``; None while unbound."""
        return self._status(name)

    def of(self, name: str, kind: type[S]) -> Callable[[], S | None]:
        """A callable returning sampler ``name``'s latest snapshot if it is a ``kind``."""

        def latest() -> S | None:
            snap = self._get(name)
            return snap if isinstance(snap, kind) else None

        return latest


def build_samplers(
    config: AgentConfig,
    sysfs: SysfsReader,
    *,
    nvml_api: Callable[[], NvmlApi] | None = None,
    watch_xid: bool = True,
    run_probes: bool = True,
    latest: Latest | None = None,
    once: bool = False,
    pod_index: Callable[[], PodIndex | None] | None = None,
) -> list[Sampler]:
    """The enabled samplers, sorted by name, all reading sysfs through ``sysfs``.

    ``nvml_api`` builds the NVML adapter (default: the live library, run in a child process
    unless ``config.nvml.isolate`` is off; a replayed recording for ``--snapshot``, a
    recording one for ``fabricscope snapshot``: both in this process); ``watch_xid``
    registers for XID events (off for ``--once``).
    ``run_probes``: build the probe sampler when ``--probe`` is on; it starts the probe
    service, which binds the rendezvous port (off for ``--once``: probes run on their own
    schedule, never in one pass). ``once``: the throughput sampler reads its logs whole
    (``--once``). ``latest`` feeds the joining samplers (attribution,
    workload) and the probe's view of pod-allocated GPUs; bind it to the runner.
    ``pod_index``: the pods whose logs the throughput sampler reads (default: the
    attribution sampler's watch of the API server; the scenario lab, which has none, gives
    its own).
    """
    latest = latest or Latest()
    out: list[Sampler] = []
    enabled = config.sampling.enabled
    limit = config.sampling.memory_limit_bytes  # each child's memory ceiling is a share
    procfs = SysfsReader(config.paths.procfs)
    nvml_snap = latest.of("nvml", NvmlSnapshot)
    pods = latest.of("attribution", AttributionSnapshot)
    attribution: AttributionSampler | None = None
    if "attribution" in enabled:
        k8s = config.kubernetes
        attribution = AttributionSampler(
            gpus=nvml_snap,
            rdma=latest.of("infiniband", InfinibandSnapshot),
            procfs=procfs,
            socket_path=k8s.pod_resources_socket,
            node_name=k8s.node_name,
            sysfs=sysfs,
            cdi_root=k8s.cdi_dir,
            rdma_unanswered=unanswered(latest, "infiniband"),
            gpus_unanswered=unanswered(latest, "nvml"),
        )
        out.append(attribution)
    if "workload" in enabled:
        out.append(
            WorkloadSampler(
                procfs,
                sysfs,
                nvml_snap,
                latest.of("pci", PciSnapshot),
                lambda: pod_identities(nvml_snap(), pods()),
            )
        )
    if "infiniband" in enabled:
        ib = config.infiniband
        if ib.perfquery == "on":
            check_tools(ib.command_prefix, ("perfquery",), "--infiniband.perfquery=on")
        pma = PmaReader(
            sysfs,
            mode=ib.perfquery,
            reset=ib.reset_saturated,
            prefix=ib.command_prefix,
            state_file=ib.state_file,
            # well inside the pass: the sysfs counters are exported whatever perfquery does
            pass_budget=min(5.0, max(config.sampling.timeout_seconds / 2, 0.5)),
        )
        out.append(InfinibandSampler(sysfs, ib.expected_rates, pma))
    if "ibpeer" in enabled:
        ip = config.ibpeer
        # on by default: without InfiniBand ports or infiniband-diags it has no data (checked
        # in the agent, before a child is started), never a configuration error
        if type(sysfs) is SysfsReader:  # the live tree: the tools run in a supervised child
            out.append(
                isolated_ibpeer(
                    ip, str(sysfs.root), ibpeer_timeout(config), one_shot=once, memory_limit=limit
                )
            )
        else:  # a recording reader (fabricscope snapshot) records what it reads, here
            out.append(
                IbPeerSampler(
                    sysfs,
                    prefix=ip.command_prefix,
                    tool_timeout=ip.tool_timeout_seconds,
                    # the sampler's own deadline, inside the runner's: its verdict is the
                    # one counted, and the last tool is killed before the runner gives up
                    pass_budget=max(ibpeer_timeout(config) - 1.0, 0.5),
                    topology_interval=ip.topology_interval_seconds,
                    uplinks_max=ip.uplinks_max,
                    extended=ip.extended_counters,
                    spine_links=ip.spine_links,
                    # one pass is all --once has: every leaf's table in it
                    tables_per_pass=64 if once else 1,
                    spread=not once,
                )
            )
    if "netdev" in enabled:
        # netlink (pyroute2) is imported only when the netdev sampler runs
        from agent.netdev.sampler import NetdevSampler

        nd = config.netdev
        ethtool = nd.ethtool_include or DEFAULT_ETHTOOL_INCLUDE
        out.append(
            NetdevSampler(
                sysfs,
                include=nd.include,
                ethtool_include=ethtool if nd.ethtool else None,
                ethtool_rotation=nd.ethtool_rotation,
            )
        )
    if "nvml" in enabled:
        nv = config.nvml
        settings = {
            "watch_xid": watch_xid,
            "link_error_rotation": nv.link_error_rotation,
            "slow_error_rotation": nv.slow_error_rotation,
        }
        if nv.isolate and nvml_api is None:  # the live library: in a child process
            out.append(
                isolated_sampler(settings, config.sampling.timeout_seconds, memory_limit=limit)
            )
        else:  # a replay (pure Python), a recording, or --no-nvml.isolate
            out.append(NvmlSampler(nvml_api, **settings))  # type: ignore[arg-type]
    if "pci" in enabled:
        out.append(PciSampler(sysfs))
    watcher = attribution.watcher if attribution is not None else None

    def watched() -> PodIndex | None:
        return watcher.index if watcher is not None else None

    index = pod_index or watched
    if "ras" in enabled:
        out.append(
            RasSampler(
                config.ras,
                procfs,
                latest.of("workload", WorkloadSnapshot),
                index,
                isolate=config.ras.isolate and not once,
                memory_limit=limit,
            )
        )
    if "throughput" in enabled:
        from agent.throughput.child import isolated_sampler as isolated_throughput
        from agent.throughput.records import ThroughputInputs

        pci_snap = latest.of("pci", PciSnapshot)
        ib_snap = latest.of("infiniband", InfinibandSnapshot)

        def numa() -> tuple[tuple[str, int], ...] | None:
            return numa_nodes(pci_snap(), ib_snap())

        started = time.time()  # lines written before the agent started are not counted
        nvml_snap = latest.of("nvml", NvmlSnapshot)

        def nvlinks() -> tuple[tuple[str, str, int], ...] | None:
            return nvlink_pairs(nvml_snap())

        if config.throughput.isolate and not once:  # parsed in a child: never stalls a scrape
            out.append(
                isolated_throughput(
                    config.throughput,
                    config.sampling.timeout_seconds,
                    lambda: ThroughputInputs(gpu_pods(pods()), index(), numa(), nvlinks()),
                    count_from=started,
                    memory_limit=limit,
                )
            )
        else:  # --once (one pass, nothing served), or --no-throughput.isolate
            # the parsers (and RE2) in this process only then: else the child's alone
            from agent.throughput.sampler import ThroughputSampler

            out.append(
                ThroughputSampler(
                    config.throughput,
                    gpu_pods=lambda: gpu_pods(pods()),
                    pod_index=index,
                    numa=numa,
                    nvlinks=nvlinks,
                    once=once,
                    count_from=started,
                    # --once reads whole, and ends before the runner gives up on the pass
                    pass_seconds=config.sampling.timeout_seconds * 0.8 if once else None,
                )
            )
    if config.probe.enabled and run_probes:
        # the probe's machinery (its service, rendezvous, workers) only where it runs
        from agent.probe.sampler import build_probe_sampler

        out.append(
            build_probe_sampler(
                config.probe,
                allocated=lambda: probe_allocation(
                    "attribution" in enabled, config.kubernetes.node_name, latest
                ),
                memory_limit=limit,
            )
        )
    return sorted(out, key=lambda s: s.name)


def unanswered(latest: Latest, name: str) -> Callable[[], bool]:
    """True while sampler ``name`` runs but has no current answer: no pass yet, or its last
    pass failed (a pass past its timeout on a busy node); False once its last pass answered
    with data or with no data, and when it is not running at all."""

    def pending() -> bool:
        status = latest.status(name)
        return status is not None and not status.success

    return pending


def probe_allocation(attribution_on: bool, node_name: str | None, latest: Latest) -> GpuAllocation:
    """The GPUs pods hold, for the probe, failing closed (:mod:`agent.kubernetes.allocation`):
    known and empty only where no pod can hold a GPU (attribution off on a node that is not a
    Kubernetes node, or attribution finding neither a kubelet socket nor a node name);
    unknown while attribution has not answered, or its last pass failed."""
    if not attribution_on:
        return gpu_allocation(None, bare_metal=not node_name)
    status = latest.status("attribution")
    if status is None or status.attempts_total == 0:
        return gpu_allocation(None)
    nodata = status.success and not status.hardware_present
    return gpu_allocation(latest.of("attribution", AttributionSnapshot)(), bare_metal=nodata)


def numa_nodes(
    pci: PciSnapshot | None, ib: InfinibandSnapshot | None
) -> tuple[tuple[str, int], ...] | None:
    """The NUMA node of each GPU (PCI address) and RDMA device (name) the PCI and InfiniBand
    samplers last saw, sorted; None when neither has answered. A device whose platform
    reports no node (-1, or no numa_node file) is left out: nothing is judged against it."""
    if pci is None and ib is None:
        return None
    out: dict[str, int] = {}
    for d in pci.by_role("gpu") if pci is not None else ():
        if d.numa_node is not None and d.numa_node >= 0:
            out[d.address] = d.numa_node
    for dev in ib.devices if ib is not None else ():
        if dev.numa_node is not None and dev.numa_node >= 0:
            out[dev.name] = dev.numa_node
    return tuple(sorted(out.items()))


def nvlink_pairs(snap: NvmlSnapshot | None) -> tuple[tuple[str, str, int], ...] | None:
    """Pairs of this node's GPUs (PCI addresses, the lower first) joined by active NVLinks and
    how many (``nvidia-smi topo -m``'s NV#), from NVML's latest snapshot; None without one."""
    if snap is None:
        return None
    return tuple(sorted((a, b, n) for (a, b), n in nvlinks_by_address(snap).items() if a < b))


def gpu_pods(snap: AttributionSnapshot | None) -> frozenset[tuple[str, str]] | None:
    """(namespace, pod) of the pods holding a GPU of this node; None without attribution."""
    if snap is None:
        return None
    return frozenset((a.namespace, a.pod) for a in snap.gpus)


def build_specs(
    config: AgentConfig,
    sysfs: SysfsReader,
    *,
    nvml_api: Callable[[], NvmlApi] | None = None,
    watch_xid: bool = True,
    run_probes: bool = True,
    latest: Latest | None = None,
    once: bool = False,
    pod_index: Callable[[], PodIndex | None] | None = None,
) -> list[SamplerSpec]:
    samplers = build_samplers(
        config,
        sysfs,
        nvml_api=nvml_api,
        watch_xid=watch_xid,
        run_probes=run_probes,
        latest=latest,
        once=once,
        pod_index=pod_index,
    )
    # a RAS query is a gather across the whole job, the ibpeer sampler asks the fabric, an
    # NVML pass costs the most CPU a GPU (--nvml.interval): each keeps its own interval
    return [_spec(config, sampler) for sampler in samplers]


def _spec(config: AgentConfig, sampler: Sampler) -> SamplerSpec:
    s = config.sampling
    if sampler.name == "ibpeer":
        return SamplerSpec(sampler, config.ibpeer.interval_seconds, ibpeer_timeout(config))
    if sampler.name == "ras":
        return SamplerSpec(sampler, config.ras.interval_seconds, s.timeout_seconds)
    if sampler.name == "nvml":
        every = config.nvml.interval_seconds
        return SamplerSpec(sampler, every, min(s.timeout_seconds, every))
    return SamplerSpec(sampler, s.interval_seconds, s.timeout_seconds)


def ibpeer_timeout(config: AgentConfig) -> float:
    """The ibpeer sampler's pass timeout: the sampling timeout, or its own interval when that
    is shorter (a pass ends before the next starts)."""
    return min(config.sampling.timeout_seconds, config.ibpeer.interval_seconds)
