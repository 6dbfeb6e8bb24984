"""Which RAS services this node's agent asks, and why not the others. Pure: the workload
sampler's GPU processes and the pod watch's pods in, :class:`Endpoint` records out.

Where a process's RAS service listens
    ``NCCL_RAS_ADDR`` from the environment it was started with (default ``localhost:28028``;
    ``NCCL_RAS_ENABLE=0`` turns the service off). Every process of a job on a node listens on
    the same address (``SO_REUSEPORT``), so the processes that share an endpoint are one job
    as far as this node can tell.

How the agent may reach it (the security decision, docs/deploy.md)
    * A process in the host's network namespace (a ``hostNetwork`` pod, or no container) that
      listens on loopback or on every address: on the host's loopback, which the agent (on the
      host network) shares; nothing is opened that the node's own processes could not reach.
    * A process in a pod's own network namespace: only where the job opted in, by listening on
      an address the node can route to: ``NCCL_RAS_ADDR=<pod IP>:<port>`` (or ``0.0.0.0:<port>``
      with the pod's IP from the pod watch), or the pod annotation
      ``fabricscope.io/nccl-ras-port: "<port>"`` (the job set ``NCCL_RAS_ADDR`` to listen there
      in a way the agent cannot read, e.g. from the training script). A RAS service on a
      pod's loopback is ``not_reachable``: the agent never enters a pod's namespaces.
    * A name instead of an address in ``NCCL_RAS_ADDR`` is never resolved, and an address that
      is not the process's own (loopback or this node's in the host network, its pod's IP in
      a pod network) is never asked (``not_reachable``): the job writes its environment.

Which node asks (a ``STATUS`` gathers from every process of the job, so one node per job)
    The node of the process whose launcher rank (``RANK``, ``OMPI_COMM_WORLD_RANK`` ...) is 0;
    a node whose processes state other ranks leaves it to that node (``other_node``). Without
    a launcher rank (environ unreadable: ``capabilities.workloadEnviron`` off) the pod may say
    so: annotation ``fabricscope.io/nccl-ras-leader: "true"``, or the Indexed Job label
    ``batch.kubernetes.io/job-completion-index: "0"``; else nobody can tell (``no_leader``) and
    the job is not asked. ``--ras.leader=always`` makes every node ask (single-node jobs,
    bare metal). ``--ras.endpoint HOST:PORT[=JOB]`` names an endpoint to ask outright.

States (``fabricscope_nccl_ras_endpoint_processes``): :data:`ENDPOINT_STATES`.
"""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from agent.config import RAS_DEFAULT_PORT, RasEndpointFlag, parse_hostport
from agent.kubernetes.pods import PodIndex, PodMeta
from agent.workload.records import WorkloadProcess, WorkloadSnapshot

DEFAULT_PORT = RAS_DEFAULT_PORT
LEADER_ANNOTATION = "fabricscope.io/nccl-ras-leader"
PORT_ANNOTATION = "fabricscope.io/nccl-ras-port"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
LEADER_POLICIES = ("rank0", "always")
ENDPOINT_STATES: tuple[str, ...] = (
    "disabled",  # NCCL_RAS_ENABLE is not 1
    "no_leader",  # no local process states a launcher rank and no pod marks the asking node
    "not_reachable",  # on a pod's loopback, a name, or the network namespace unknown
    "other_node",  # another node of the job asks (its rank-0 process runs there)
    "queried",  # this node asks
    "shared",  # processes of several jobs (pods with other job names) on one endpoint
)


@dataclass(frozen=True, slots=True, order=True)
class LocalProcess:
    """A GPU process of this node, as the RAS answer names it: ``ns_pid`` (its own pid),
    ``address`` (its pod's IP when it runs in a pod network; None: the node's addresses),
    its GPUs as (NVML index, PCI bus id)."""

    host_pid: int
    ns_pid: int | None
    gpus: tuple[tuple[int, str], ...]
    namespace: str = ""
    pod: str = ""
    address: str | None = None


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A RAS service of a job with processes on this node (``host`` empty and ``port`` 0
    when there is none to reach), the job's labels and what this node does about it."""

    host: str
    port: int
    namespace: str
    job_name: str
    state: str
    processes: tuple[LocalProcess, ...]

    @property
    def label(self) -> str:
        """``127.0.0.1:28028``, ``[fd00::1]:28028``; empty when unreachable."""
        if not self.host:
            return ""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if host == "localhost":
        return ipaddress.ip_address("127.0.0.1")
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _pod_meta(proc: WorkloadProcess, index: PodIndex | None) -> PodMeta | None:
    if proc.pod is None or index is None:
        return None
    for meta in index.pods():
        if meta.namespace == proc.pod.namespace and meta.name == proc.pod.pod:
            return meta
    return None


def _reach(
    proc: WorkloadProcess, meta: PodMeta | None, node: frozenset[str]
) -> tuple[str, str, int]:
    """(state, host, port) of one process's RAS service; state "" when reachable. An
    address in ``NCCL_RAS_ADDR`` is asked only when it is the process's own: loopback or one
    of ``node`` (this node's addresses) in the host network, its pod's IP in a pod network.
    The environment is the job's to write: anything else would let a job point the agent at
    any address of the cluster."""
    env = dict((s.name, s.value) for s in proc.nccl_env or ())
    enable = env.get("NCCL_RAS_ENABLE")
    if enable is not None and enable.strip() != "1":
        return "disabled", "", 0
    host_net = proc.host_network
    if host_net is None and meta is not None:
        host_net = meta.host_network
    annotated = meta.annotation(PORT_ANNOTATION) if meta is not None else None
    pod_ip = meta.ip if meta is not None and not host_net else None
    addr = env.get("NCCL_RAS_ADDR")
    if addr is not None:
        try:
            host, port = parse_hostport(addr)
        except ValueError:
            return "not_reachable", "", 0
        ip = _ip(host)
        if ip is None:
            return "not_reachable", "", 0  # a name: never resolved
        if ip.is_loopback:
            return ("", str(ip), port) if host_net else ("not_reachable", "", 0)
        if ip.is_unspecified:
            if host_net:
                return "", "127.0.0.1" if ip.version == 4 else "::1", port
            return ("", pod_ip, port) if pod_ip else ("not_reachable", "", 0)
        own = str(ip) in node if host_net else pod_ip is not None and _same(ip, pod_ip)
        return ("", str(ip), port) if own else ("not_reachable", "", 0)
    if annotated is not None and annotated.isdigit() and 0 < int(annotated) < 65536:
        if host_net:
            return "", "127.0.0.1", int(annotated)
        return ("", pod_ip, int(annotated)) if pod_ip else ("not_reachable", "", 0)
    if host_net:
        return "", "127.0.0.1", DEFAULT_PORT
    return "not_reachable", "", 0


def _same(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, text: str) -> bool:
    other = _ip(text)
    return other is not None and other == ip


def _marked_leader(metas: Sequence[PodMeta | None]) -> bool:
    for m in metas:
        if m is None:
            continue
        if (m.annotation(LEADER_ANNOTATION) or "").strip().lower() == "true":
            return True
        if m.label(COMPLETION_INDEX_LABEL) == "0":
            return True
    return False


def plan(
    workload: WorkloadSnapshot | None,
    index: PodIndex | None,
    *,
    leader: str = "rank0",
    static: Sequence[RasEndpointFlag] = (),
    node: frozenset[str] = frozenset(),
) -> tuple[Endpoint, ...]:
    """Every RAS endpoint of this node's GPU processes (and every static one), sorted;
    ``node``: this node's own addresses (:mod:`agent.ras.addresses`)."""
    groups: dict[tuple[str, str, int, str], list[tuple[WorkloadProcess, PodMeta | None]]] = (
        defaultdict(list)
    )
    for proc in workload.processes if workload is not None else ():
        meta = _pod_meta(proc, index)
        state, host, port = _reach(proc, meta, node)
        # unreachable processes are grouped per pod, reachable ones per endpoint
        who = f"{proc.pod.namespace}/{proc.pod.pod}" if proc.pod is not None and state else ""
        groups[(state, host, port, who)].append((proc, meta))
    out: dict[tuple[str, int, str, str], Endpoint] = {}
    for (why, host, port, who), members in groups.items():
        jobs = {_job(p, m) for p, m in members}
        namespace, job_name = sorted(jobs)[0]
        locals_ = tuple(sorted(_local(p, m) for p, m in members))
        state = why
        if not why:
            if len(jobs) > 1:
                state, namespace, job_name = "shared", "", ""
            elif leader == "always":
                state = "queried"
            else:
                state = _leader_state(members)
        key = (host, port, why, who)
        out[key] = Endpoint(host, port, namespace, job_name, state, locals_)
    all_locals = tuple(
        sorted(
            _local(p, _pod_meta(p, index))
            for p in (workload.processes if workload is not None else ())
        )
    )
    for s in static:
        mine = out.get((s.host, s.port, "", ""))
        out[(s.host, s.port, "", "")] = Endpoint(
            s.host,
            s.port,
            mine.namespace if mine is not None and not s.job_name else "",
            s.job_name or (mine.job_name if mine is not None else ""),
            "queried",
            mine.processes if mine is not None else all_locals,
        )
    return tuple(sorted(out.values(), key=lambda e: (e.host, e.port, e.namespace, e.job_name)))


def _leader_state(members: Sequence[tuple[WorkloadProcess, PodMeta | None]]) -> str:
    ranks = [p.launch_rank for p, _ in members if p.launch_rank is not None]
    if 0 in ranks:
        return "queried"
    if ranks:
        return "other_node"
    return "queried" if _marked_leader([m for _, m in members]) else "no_leader"


def _job(proc: WorkloadProcess, meta: PodMeta | None) -> tuple[str, str]:
    if proc.pod is None:
        return "", ""
    return proc.pod.namespace, meta.job_name() if meta is not None else ""


def _local(proc: WorkloadProcess, meta: PodMeta | None) -> LocalProcess:
    return LocalProcess(
        host_pid=proc.pid,
        ns_pid=proc.ns_pid,
        gpus=tuple((g.gpu, g.pci_bus_id or "") for g in proc.gpus),
        namespace=proc.pod.namespace if proc.pod is not None else "",
        pod=proc.pod.pod if proc.pod is not None else "",
        address=meta.ip if meta is not None and not meta.host_network else None,
    )
