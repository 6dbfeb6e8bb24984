"""Find the job: its throughput series, its pods, nodes, GPUs and HCAs, and the names that
turn label sets into readable device names.

A job is a ``job_name`` (the throughput series' label) in a namespace, plus pods named with
a prefix (the pods that print no throughput are found by attribution), or, on bare metal,
a list of nodes. Every query here is scoped by namespace and exact pod names, or by the
job's instances.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from exporter.explain.checks import Check, _escape
from exporter.explain.client import PrometheusClient, PrometheusError, Sample, Series
from exporter.explain.evidence import _alternation
from exporter.explain.plan import MAX_NAMES_PER_QUERY, groups

#: throughput metrics in order of preference; step_seconds is inverted to steps per second
THROUGHPUT_METRICS = (
    ("fabricscope_throughput_tokens_per_second", "tokens/s"),
    ("fabricscope_throughput_samples_per_second", "samples/s"),
    ("fabricscope_throughput_iterations_per_second", "iterations/s"),
    ("fabricscope_throughput_step_seconds", "steps/s"),
)


class JobNotFoundError(Exception):
    """The job has no series in the window; ``str()`` says what was looked for."""


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What the user named: a job (``job_name``), its namespace, a pod-name prefix
    (default: the job's name and a dash) and/or bare-metal nodes."""

    job: str
    namespace: str = ""
    pod_prefix: str | None = None
    nodes: tuple[str, ...] = ()

    def matchers(self) -> str:
        parts = [f'job_name="{_escape(self.job)}"']
        if self.namespace:
            parts.insert(0, f'namespace="{_escape(self.namespace)}"')
        return ",".join(parts)


@dataclass(frozen=True, slots=True)
class Throughput:
    metric: str
    unit: str
    expr: str
    series: Series | None  # the job's throughput over the window (None: not found)
    pods: tuple[str, ...]
    instances: tuple[str, ...]
    #: (pod, instance) of every throughput series that names both
    pod_instances: tuple[tuple[str, str], ...] = ()
    #: the namespaces the job's throughput series carry (its pods' namespace)
    namespaces: tuple[str, ...] = ()


def throughput(
    client: PrometheusClient, job: JobSpec, start: float, end: float, step: float
) -> Throughput:
    names = "|".join(m for m, _ in THROUGHPUT_METRICS)
    found = client.series([f'{{__name__=~"{names}",{job.matchers()}}}'], start, end)
    present = {s.get("__name__", "") for s in found}
    for metric, unit in THROUGHPUT_METRICS:
        if metric not in present:
            continue
        rows = [s for s in found if s.get("__name__") == metric]
        pods = tuple(sorted({s["pod"] for s in rows if s.get("pod")}))
        instances = tuple(sorted({s["instance"] for s in rows if s.get("instance")}))
        placed = tuple(
            sorted({(s["pod"], s["instance"]) for s in rows if s.get("pod") and s.get("instance")})
        )
        namespaces = tuple(sorted({s["namespace"] for s in rows if s.get("namespace")}))
        inner = f"avg({metric}{{{job.matchers()}}})"
        expr = f"1 / {inner}" if metric.endswith("_step_seconds") else inner
        result = client.query_range(expr, start, end, step)
        series = result[0] if result else None
        if series is not None and series.values and not any(map(math.isfinite, series.values)):
            raise PrometheusError(
                f"Prometheus answered only NaN or infinite values for the job's throughput "
                f"({expr}): no slowdown can be judged from them"
            )
        return Throughput(metric, unit, expr, series, pods, instances, placed, namespaces)
    return Throughput("", "", "", None, (), ())


def with_namespace(job: JobSpec, tp: Throughput) -> JobSpec:
    """``job`` with the namespace its throughput series carry, when none was given and they
    carry exactly one (the pods are found, and the pod checks run, as with it given)."""
    if job.namespace or len(tp.namespaces) != 1:
        return job
    return replace(job, namespace=tp.namespaces[0])


def scope_gaps(job: JobSpec, tp: Throughput, fp: Footprint) -> tuple[str, ...]:
    """The classes of checks that cannot run for lack of scope, one line each: the job runs
    in pods (its throughput series name them) and explain cannot say in which namespace
    (its series carry several), or finds none of their GPUs and HCAs (no attribution series
    for them)."""
    if not tp.pods:
        return ()
    if not job.namespace:  # series without a namespace: not a Kubernetes pod's (no gap)
        if len(tp.namespaces) < 2:
            return ()
        return (
            f"could not judge NCCL, placement and the pods' GPUs: the job's throughput series "
            f"carry namespaces {', '.join(tp.namespaces)}; give --namespace",
        )
    if not fp.gpus and not fp.hcas:
        return (
            f"could not judge placement and the pods' GPUs and HCAs: no pods found for job "
            f"{job.job!r} in namespace {job.namespace!r} in the attribution series "
            "(fabricscope_pod_gpu_info, fabricscope_pod_rdma_info)",
        )
    return ()


@dataclass(frozen=True, slots=True)
class Footprint:
    instances: tuple[str, ...]
    pods: tuple[str, ...]
    gpus: tuple[tuple[str, str], ...]  # (instance, gpu)
    hcas: tuple[tuple[str, str], ...]  # (instance, device) allocated to the job's pods


def footprint(
    client: PrometheusClient, job: JobSpec, tp: Throughput, start: float, end: float
) -> Footprint:
    """The job's pods and their GPUs and RDMA devices from the attribution series."""
    rows: list[dict[str, str]] = []
    if job.namespace:
        pod_patterns = []
        if tp.pods:
            pod_patterns.append(_alternation(tp.pods))
        prefix = job.pod_prefix if job.pod_prefix is not None else f"{job.job}-"
        if prefix:
            pod_patterns.append(_escape(re.escape(prefix)) + ".*")
        pods_re = "|".join(pod_patterns)
        sel = f'namespace="{_escape(job.namespace)}",pod=~"{pods_re}"'
        rows = client.series(
            [f"fabricscope_pod_gpu_info{{{sel}}}", f"fabricscope_pod_rdma_info{{{sel}}}"],
            start,
            end,
        )
    # nodes the user named are the job's nodes; otherwise where its series come from
    instances = set(job.nodes) or (
        set(tp.instances) | {r["instance"] for r in rows if r.get("instance")}
    )
    pods = set(tp.pods) | {r["pod"] for r in rows if r.get("pod")}
    gpus = {
        (r.get("instance", ""), r.get("gpu", ""))
        for r in rows
        if r.get("__name__") == "fabricscope_pod_gpu_info"
    }
    # an SR-IOV VF's fabric is its physical function's port (pf_device): both are the job's
    hcas = {
        (r.get("instance", ""), r.get(key, ""))
        for r in rows
        if r.get("__name__") == "fabricscope_pod_rdma_info"
        for key in ("device", "pf_device")
        if r.get(key)
    }
    if not instances:
        where = f" in namespace {job.namespace}" if job.namespace else ""
        raise JobNotFoundError(
            f"found no nodes for job {job.job!r}{where}: no throughput series with that "
            "job_name carries an instance, no fabricscope_pod_gpu_info/pod_rdma_info series "
            "match its pods, and no --nodes were given"
        )
    return Footprint(
        tuple(sorted(instances)), tuple(sorted(pods)), tuple(sorted(gpus)), tuple(sorted(hcas))
    )


@dataclass(frozen=True, slots=True)
class Inventory:
    """Names for devices: netdev -> RDMA port, PCI address -> role and name."""

    ports: Mapping[tuple[str, str], tuple[str, str]]  # (instance, netdev) -> (device, port)
    netdevs: Mapping[tuple[str, str, str], str]  # (instance, device, port) -> netdev
    pci_roles: Mapping[tuple[str, str], str]  # (instance, pci_bus_id) -> role
    pci_names: Mapping[tuple[str, str], str]  # (instance, pci_bus_id) -> mlx5_0 / GPU 3
    port_count: int
    #: instances with any hardware identity series (ports, PCI devices, HCAs, GPUs)
    instances: frozenset[str] = frozenset()
    #: (instance, device, port) -> the switch port its cable lands on (``leaf3 port 2``),
    #: where the agents' ibpeer sampler says (exporter.explain.switches.topology)
    cables: Mapping[tuple[str, str, str], str] = field(default_factory=dict)

    def name(self, check: Check, labels: Mapping[str, str]) -> str:
        inst = labels.get("instance", "")
        if check.key == "port":
            dev, port = labels.get("device", ""), labels.get("port", "")
            nd = self.netdevs.get((inst, dev, port))
            cable = self.cables.get((inst, dev, port))
            return (
                f"{inst} {dev}/{port}"
                + (f" ({nd})" if nd else "")
                + (f", cable to {cable}" if cable else "")
            )
        if check.key == "netdev":
            nd = labels.get("netdev", "")
            mapped = self.ports.get((inst, nd))
            return f"{inst} {mapped[0]}/{mapped[1]} ({nd})" if mapped else f"{inst} {nd}"
        if check.key == "pci":
            bus = labels.get("pci_bus_id", "")
            role = self.pci_roles.get((inst, bus), "")
            nm = self.pci_names.get((inst, bus), "")
            extra = " ".join(x for x in (role, nm) if x)
            return f"{inst} {bus}" + (f" ({extra})" if extra else "")
        if check.key == "gpu":
            return f"{inst} GPU {labels.get('gpu', '')}"
        if check.key == "probe":
            collective = labels.get("collective", "")
            if not labels.get("peer"):
                return f"{inst} intra-node ({collective})"
            return (
                f"{inst} GPU {labels.get('gpu', '')} <-> {labels.get('peer', '')} GPU "
                f"{labels.get('peer_gpu', '')} ({collective})"
            )
        if not labels.get("pod"):  # bare metal: the job's own series on the node
            return f"job {labels.get('job_name', '')} on {inst}"
        return f"{labels.get('pod', '')} on {inst}"


#: the identity series the names come from, and the labels the names use. Their label sets
#: are asked of the index (``/api/v1/series`` over the window), not of the samples: a
#: ``count by (...) (last_over_time(...[window]))`` of the same families read every sample
#: of every one of them (5.7 M of 58 M for a 1,024-node hour, about a tenth of Prometheus's
#: work for the whole answer) to learn nothing but labels. The series API answers with each
#: series' whole label set (firmware, model, GUIDs ...), which doubles the answer's bytes
#: (about 11 MB uncompressed for a 1,024-node job, 1 MB gzip'd). What it counts as "in the
#: window" is the store's: Prometheus, a chunk of samples overlapping it; VictoriaMetrics,
#: by day (docs/explain.md)
_INFO = (
    ("fabricscope_infiniband_port_info", ("instance", "netdev", "device", "port")),
    ("fabricscope_pci_device_info", ("instance", "pci_bus_id", "role")),
    ("fabricscope_infiniband_device_info", ("instance", "pci_bus_id", "device")),
    ("fabricscope_gpu_info", ("instance", "pci_bus_id", "gpu")),
)


def _grouped(rows: Sequence[Mapping[str, str]], labels: Sequence[str]) -> list[Sample]:
    """``count by (labels)`` of ``rows``: each label set once, its value the rows that have
    it (empty labels left out, as Prometheus leaves them out), in the order first seen."""
    counts: dict[tuple[str, ...], int] = {}
    for r in rows:
        k = tuple(r.get(n, "") for n in labels)
        counts[k] = counts.get(k, 0) + 1
    return [
        Sample({n: v for n, v in zip(labels, k, strict=True) if v}, float(n))
        for k, n in counts.items()
    ]


def inventory(
    client: PrometheusClient,
    instances: Sequence[str],
    start: float,
    end: float,
    *,
    max_names: int = MAX_NAMES_PER_QUERY,
) -> Inventory:
    """Device names of the job's instances, in groups of ``max_names`` (the query plan)."""
    window = max(1, int(end - start))
    selectors = [f'instance=~"{_alternation(g)}"' for g in groups(instances, max_names)]
    found: list[list[Sample]] = [[] for _ in _INFO]
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(
            pool.map(
                lambda sel: client.series([f"{f}{{{sel}}}" for f, _ in _INFO], end - window, end),
                selectors,
            )
        )
    for answer in answers:
        for k, (family, labels) in enumerate(_INFO):
            found[k] += _grouped([r for r in answer if r.get("__name__") == family], labels)
    port_info, pci_info, dev_info, gpu_info = found
    ports: dict[tuple[str, str], tuple[str, str]] = {}
    netdevs: dict[tuple[str, str, str], str] = {}
    for s in port_info:
        inst, nd = s.labels.get("instance", ""), s.labels.get("netdev", "")
        dev, port = s.labels.get("device", ""), s.labels.get("port", "")
        if nd:
            ports[(inst, nd)] = (dev, port)
            netdevs[(inst, dev, port)] = nd
    roles = {_ib(s, "pci_bus_id"): s.labels.get("role", "") for s in pci_info}
    names = {_ib(s, "pci_bus_id"): s.labels.get("device", "") for s in dev_info}
    names.update({_ib(s, "pci_bus_id"): f"GPU {s.labels.get('gpu', '')}" for s in gpu_info})
    seen = {
        s.labels.get("instance", "")
        for group in (port_info, pci_info, dev_info, gpu_info)
        for s in group
    }
    ports_seen = round(sum(s.value for s in port_info))
    return Inventory(ports, netdevs, roles, names, ports_seen, frozenset(seen - {""}))


def unknown_warning(job: JobSpec, tp: Throughput, inv: Inventory) -> str:
    """One line naming the ``--nodes`` and the job's pods (by the node they print from) that
    have no fabricscope hardware series in the window; "" when there are none."""
    parts = []
    nodes = [n for n in job.nodes if n not in inv.instances]
    if nodes:
        parts.append(f"--nodes {', '.join(nodes)} (a typo, or no agent scraped there)")
    pods = [f"{pod} (on {inst})" for pod, inst in tp.pod_instances if inst not in inv.instances]
    if pods:
        shown = ", ".join(pods[:8]) + (f" and {len(pods) - 8} more" if len(pods) > 8 else "")
        parts.append(f"pods {shown}, whose nodes have none")
    if not parts:
        return ""
    return (
        "warning: no fabricscope hardware series in the window for "
        + "; for ".join(parts)
        + ": not checked"
    )


def _ib(sample: Sample, label: str) -> tuple[str, str]:
    return sample.labels.get("instance", ""), sample.labels.get(label, "")
