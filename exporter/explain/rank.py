"""Group measurements into findings (a cause on a device) and rank them."""

from __future__ import annotations

import urllib.parse
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from exporter.explain.checks import CAUSES, THRESHOLD, Check
from exporter.explain.discover import Inventory
from exporter.explain.evidence import (
    NCCL_ENV_DIFF_SCORE,
    CheckResult,
    EnvDifference,
    Measurement,
    Periods,
    _escape,
)


@dataclass(frozen=True, slots=True)
class Finding:
    cause: str
    title: str
    device: str
    instance: str
    score: float
    evidence: tuple[str, ...]  # strongest first, with numbers
    promql: str  # shows the strongest evidence over time for this device
    link: str  # the dashboard panel ("" without --grafana.url)


def display_range(step: float) -> str:
    seconds = max(60, int(4 * step))
    return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"


def device_selector(check: Check, labels: Mapping[str, str]) -> str:
    names = ("namespace", "pod", "gpu") if check.scope == "pod" else ("instance", *check.identity)
    return ",".join(f'{n}="{_escape(labels.get(n, ""))}"' for n in names if n in labels)


def panel_link(
    grafana: str, cause: str, instance: str, periods: Periods, extra: Mapping[str, str]
) -> str:
    if not grafana:
        return ""
    c = CAUSES[cause]
    params = {
        "orgId": "1",
        "from": str(int(periods.base_start * 1000)),
        "to": str(int(periods.slow_end * 1000)),
        "var-instance": instance,
        **{f"var-{k}": v for k, v in extra.items() if v},
        "viewPanel": str(c.panel),
    }
    return f"{grafana.rstrip('/')}/d/{c.dashboard}/?{urllib.parse.urlencode(params)}"


def rank(
    results: Sequence[CheckResult],
    env_differences: Sequence[EnvDifference],
    env_sel: str,
    inventory: Inventory,
    *,
    periods: Periods,
    step: float,
    grafana: str = "",
    namespace: str = "",
) -> list[Finding]:
    """Every (cause, device) with a positive score, best first."""
    groups: dict[tuple[str, str], list[Measurement]] = defaultdict(list)
    for result in results:
        for m in result.measurements:
            if m.score > 0:
                groups[(m.check.cause, inventory.name(m.check, m.labels))].append(m)
    rng = display_range(step)
    out = []
    for (cause, device), ms in groups.items():
        ms.sort(key=lambda m: -m.score)
        top = ms[0]
        expr = top.check.template.format(sel=device_selector(top.check, top.labels), d=rng)
        extra = {k: top.labels.get(k, "") for k in ("device", "port", "gpu", "pod", "netdev")}
        if namespace:
            extra["namespace"] = namespace
        inst = top.labels.get("instance", "")
        out.append(
            Finding(
                cause,
                CAUSES[cause].title,
                device,
                inst,
                round(top.score, 2),
                tuple(m.text for m in ms),
                expr,
                panel_link(grafana, cause, inst, periods, extra),
            )
        )
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
                panel_link(grafana, "nccl_config", "", periods, {"namespace": namespace}),
            )
        )
    out.sort(key=lambda f: (-f.score, f.cause, f.device))
    return out


def _pods(pods: Sequence[str]) -> str:
    if len(pods) <= 3:
        return ", ".join(pods)
    return f"{len(pods)} pods ({', '.join(pods[:2])}, ...)"


def standing_out(findings: Sequence[Finding]) -> list[Finding]:
    return [f for f in findings if f.score >= THRESHOLD]
