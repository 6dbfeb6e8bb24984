"""Group measurements into findings (a cause on a device) and rank them."""

from __future__ import annotations

import urllib.parse
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from exporter.explain.checks import CAUSES, THRESHOLD, Check, _escape
from exporter.explain.discover import Inventory, JobSpec
from exporter.explain.evidence import (
    NCCL_ENV_DIFF_SCORE,
    CheckResult,
    EnvDifference,
    Measurement,
    Periods,
    queries,
)


@dataclass(frozen=True, slots=True)
class Finding:
    cause: str
    title: str
    device: str
    instance: str
    score: float
    evidence: tuple[str, ...]  # strongest first, with numbers; blind evidence last
    #: the strongest evidence's slow figure: this PromQL, evaluated at ``promql_at``,
    #: returns it (its baseline's: :func:`exporter.explain.evidence.queries`)
    promql: str
    link: str  # the dashboard panel ("" without --grafana.url)
    peer: str = ""  # probe findings: the pair's other node
    #: what each evidence line says, in the same order (job-wide findings: none; a switch
    #: finding: the measurements of its port and uplink lines, strongest first, after its
    #: lines that say what crowded there)
    measurements: tuple[Measurement, ...] = ()
    promql_at: float = 0.0


def display_range(step: float) -> str:
    seconds = max(60, int(4 * step))
    return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"


def device_selector(check: Check, labels: Mapping[str, str]) -> str:
    return check.device_selector(labels)


def panel_link(grafana: str, cause: str, node: str, periods: Periods, job: JobSpec) -> str:
    """The cause's panel on the generated dashboards, at the job's window, with the
    dashboards' own variables (node, namespace, job)."""
    if not grafana:
        return ""
    c = CAUSES[cause]
    params = {
        "orgId": "1",
        "from": str(int(periods.base_start * 1000)),
        "to": str(int(periods.slow_end * 1000)),
    }
    if node:
        params["var-node"] = node
    if c.dashboard == "fabricscope-job":
        params["var-namespace"] = job.namespace
        params["var-job"] = job.job
    if c.panel:
        params["viewPanel"] = str(c.panel)
    return f"{grafana.rstrip('/')}/d/{c.dashboard}/?{urllib.parse.urlencode(params)}"


@dataclass(frozen=True, slots=True)
class Unavailable:
    """A device's evidence that went blind, where the device has no finding to carry it."""

    device: str
    instance: str
    measurement: Measurement

    @property
    def text(self) -> str:
        return f"{self.device}: {self.measurement.text}"


def rank(
    results: Sequence[CheckResult],
    env_differences: Sequence[EnvDifference],
    env_sel: str,
    inventory: Inventory,
    *,
    periods: Periods,
    step: float,
    job: JobSpec,
    grafana: str = "",
) -> tuple[list[Finding], list[Unavailable]]:
    """Every (cause, device) with a positive score, best first; and the blind evidence of
    devices without one (blind evidence of a device with findings is their last lines)."""
    groups: dict[tuple[str, str], list[Measurement]] = defaultdict(list)
    blind: dict[str, list[Measurement]] = defaultdict(list)
    for result in results:
        for m in result.measurements:
            if m.unavailable:
                blind[inventory.name(m.check, m.labels)].append(m)
            elif m.score > 0:
                groups[(m.check.cause, inventory.name(m.check, m.labels))].append(m)
            elif result.tally is not None:
                break  # as compared: worst first and none blind, so the rest score 0 too
    out = []
    # one link per cause and node (a 1,024-node job's thousands of candidates share them)
    links: dict[tuple[str, str], str] = {}
    for (cause, device), ms in groups.items():
        ms.sort(key=lambda m: -m.score)
        top = ms[0]
        lines = [*ms, *blind.get(device, [])]
        inst = top.labels.get("instance", "")
        _, slow = queries(top, env_sel)
        link = links.get((cause, inst))
        if link is None:
            link = links[(cause, inst)] = panel_link(grafana, cause, inst, periods, job)
        out.append(
            Finding(
                cause,
                CAUSES[cause].title,
                device,
                inst,
                round(top.score, 2),
                tuple(m.text for m in lines),
                slow.promql if slow else "",
                link,
                peer=top.labels.get("peer", "") if top.check.key == "probe" else "",
                measurements=tuple(lines),
                promql_at=slow.at if slow else periods.slow_end,
            )
        )
    carried = {device for _, device in groups}
    alone = [
        Unavailable(device, m.labels.get("instance", ""), m)
        for device, ms in sorted(blind.items())
        if device not in carried
        for m in ms
    ]
    for diff in env_differences:
        parts = [f"{diff.variable}={value} on {_pods(pods)}" for value, pods in diff.values.items()]
        out.append(
            Finding(
                "nccl_config",
                CAUSES["nccl_config"].title,
                f"{diff.variable} across the job's pods",
                "",
                NCCL_ENV_DIFF_SCORE,
                ("; ".join(parts),),
                f"fabricscope_workload_nccl_env_info{{{env_sel},"
                f'variable="{_escape(diff.variable)}"}}',
                panel_link(grafana, "nccl_config", "", periods, job),
                promql_at=periods.slow_end,
            )
        )
    out = join_node_evidence(corroborate(out))
    out.sort(key=order)
    return out, alone


def order(f: Finding) -> tuple[float, str, bool, str]:
    """Best first; equal scores by cause, an endpoint before the bridge above it, device."""
    return (-f.score, f.cause, "(bridge" in f.device, f.device)


def merged(findings: Sequence[Finding], extra: Sequence[Finding]) -> list[Finding]:
    """``findings`` and ``extra`` (findings made outside :func:`rank`, the switches') in one
    ranking."""
    return sorted([*findings, *extra], key=order)


#: added to a hardware finding that a probe's bandwidth drop on its node corroborates
CORROBORATION_BONUS = 0.25


def corroborate(findings: Sequence[Finding]) -> list[Finding]:
    """A probe's bandwidth drop is a symptom: when a hardware finding that stands out sits
    on one of the pair's nodes, the drop becomes that finding's evidence (and a small
    bonus) instead of a finding of its own. A drop no hardware finding explains stays, as
    "probe bus bandwidth below the pair's baseline"."""
    hardware = [f for f in findings if f.cause != "probe" and f.score >= THRESHOLD]
    explained: dict[int, list[Finding]] = defaultdict(list)
    rest = [f for f in findings if f.cause != "probe"]
    for p in findings:
        if p.cause != "probe":
            continue
        nodes = {p.instance, p.peer} - {""}
        owners = [h for h in hardware if h.instance in nodes]
        if not owners or p.score < THRESHOLD:
            rest.append(p)
            continue
        # an endpoint (NIC, GPU) before the bridge above it: the same link, named better
        best = max(owners, key=lambda h: (h.score, "(bridge" not in h.device))
        explained[id(best)].append(p)
    out = []
    for f in rest:
        drops = explained.get(id(f))
        if not drops:
            out.append(f)
            continue
        drops.sort(key=lambda p: -p.score)
        line = (
            f"probe bus bandwidth fell on {len(drops)} pair(s) with this node, worst "
            f"{drops[0].device}: {drops[0].evidence[0].split(': ', 1)[-1]}"
        )
        out.append(
            replace(
                f,
                score=round(f.score + CORROBORATION_BONUS, 2),
                evidence=(*f.evidence, line),
                measurements=(*f.measurements, *drops[0].measurements[:1]),
            )
        )
    return out


#: the hardware causes that may explain why a rank NCCL names stopped or lags on its node
NODE_EVIDENCE_CAUSES = ("gpu", "nvlink", "pcie", "ib_link", "port_rate", "gpu_throttle")


def join_node_evidence(findings: Sequence[Finding]) -> list[Finding]:
    """A rank NCCL's RAS names (cause ``nccl_rank``) is a symptom with a place: its node and
    GPU. The hardware findings that stand out on that node (the same GPU's first: an XID, a
    lost GPU, its NVLinks; then the node's links) join it as evidence, with the small bonus
    a corroborated finding gets; they keep their own place in the ranking too."""
    on_node: dict[str, list[Finding]] = defaultdict(list)
    for h in findings:
        if h.cause in NODE_EVIDENCE_CAUSES and h.score >= THRESHOLD:
            on_node[h.instance].append(h)
    out = []
    for f in findings:
        own = list(on_node.get(f.instance, ())) if f.cause == "nccl_rank" else []
        if not own:
            out.append(f)
            continue
        own.sort(key=lambda h: (h.device != f.device, -h.score))
        lines = tuple(f"on its node: {h.title}, {h.device}: {h.evidence[0]}" for h in own[:3])
        out.append(
            replace(
                f, score=round(f.score + CORROBORATION_BONUS, 2), evidence=(*f.evidence, *lines)
            )
        )
    return out


def _pods(pods: Sequence[str]) -> str:
    if len(pods) <= 3:
        return ", ".join(pods)
    return f"{len(pods)} pods ({', '.join(pods[:2])}, ...)"


def standing_out(findings: Sequence[Finding]) -> list[Finding]:
    return [f for f in findings if f.score >= THRESHOLD]
