"""The job's part of the fabric as its agents report it, and the checks of its leaves'
uplinks: which leaf port each of the job's ports is cabled to and which spine port each of
those leaves' uplinks lands on (:func:`topology`, from ``fabricscope_infiniband_peer_info``
and ``fabricscope_infiniband_switch_link_info``), and the uplinks' evidence at both ends
(:data:`UPLINK_CHECKS`, :func:`evaluate_uplinks`). :mod:`exporter.explain.switches` groups
the evidence by switch.

Imports the checks' type, the client, the evidence comparison and the query plan.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from exporter.explain.checks import Check
from exporter.explain.client import PrometheusClient, Sample
from exporter.explain.evidence import CheckResult, Periods, Window, _alternation, compare
from exporter.explain.plan import MAX_NAMES_PER_QUERY, groups

Port = tuple[str, str, str]  # (instance, device, port)
SwitchPort = tuple[str, str]  # (switch GUID, port)
_SWITCH_KEY = ("switch_guid", "switch_port")


def _sw(counter: str) -> str:
    return (
        "max by (switch_guid, switch_port) "
        f"(rate(fabricscope_infiniband_switch_port_{counter}_total{{{{{{sel}}}}}}[{{d}}]))"
    )


def _sw_or_zero(counter: str) -> str:
    """:func:`_sw`, and 0 for every uplink end the fabric map knows in the range (below full
    detail an end's error counter is exported only once non-zero): the leaf ends from
    ``switch_link_info`` as labelled (``{sel}``), the far ends from the same series'
    ``peer_*`` labels (``{peers}``: the far end's selector)."""
    link = "fabricscope_infiniband_switch_link_info"
    far = (
        f"label_replace(label_replace(last_over_time({link}{{{{{{peers}}}}}}[{{d}}]), "
        '"switch_guid", "$1", "peer_guid", "(.*)"), "switch_port", "$1", "peer_port", "(.*)")'
    )
    return (
        f"{_sw(counter)} "
        f"or 0 * max by (switch_guid, switch_port) (last_over_time({link}{{{{{{sel}}}}}}[{{d}}])) "
        f"or 0 * max by (switch_guid, switch_port) ({far})"
    )


def _uplink_check(name: str, cause: str, what: str, template: str, significant: float) -> Check:
    per_min = cause != "ib_congestion"
    return Check(
        name,
        cause,
        what,
        template,
        "rate" if per_min else "rise",
        significant,
        "port",
        _SWITCH_KEY,
        unit="/min" if per_min else "",
        scale=60.0 if per_min else 1.0,
        far_labels=("peer_guid", "peer_port"),
    )


#: evidence on the uplinks of the job's leaves, at each end (the series of both ends are
#: labelled by the switch and port they were read at); ``max by`` folds the readers
UPLINK_CHECKS: tuple[Check, ...] = (
    _uplink_check(
        "uplink_symbol_errors",
        "ib_link",
        "uplink symbol errors",
        _sw_or_zero("symbol_errors"),
        1 / 60,
    ),
    _uplink_check(
        "uplink_receive_errors",
        "ib_link",
        "uplink receive errors",
        _sw_or_zero("receive_errors"),
        1 / 60,
    ),
    _uplink_check(
        "uplink_transmit_discards",
        "drops",
        "uplink transmit discards",
        _sw_or_zero("transmit_discards"),
        1 / 60,
    ),
    _uplink_check(
        "uplink_xmit_wait_share",
        "ib_congestion",
        "uplink xmit_wait share (wait ticks / (wait ticks + 4-byte words sent))",
        f"{_sw('transmit_wait')} / ({_sw('transmit_wait')} + {_sw('transmitted_bytes')} / 4)",
        0.05,
    ),
)


@dataclass(frozen=True, slots=True)
class Cable:
    """A job port's cable: the leaf switch (GUID, description) and leaf port it lands on."""

    switch_guid: str
    switch_port: str
    switch_description: str


@dataclass(frozen=True, slots=True)
class Topology:
    """The job's part of the fabric, as its agents last reported it in the window."""

    cables: Mapping[Port, Cable] = field(default_factory=dict)
    #: uplink (leaf GUID, leaf port) -> (far switch GUID, far port)
    uplinks: Mapping[SwitchPort, SwitchPort] = field(default_factory=dict)
    #: switch GUID -> node description
    names: Mapping[str, str] = field(default_factory=dict)

    @property
    def leaves(self) -> list[str]:
        return sorted({c.switch_guid for c in self.cables.values()})

    def switch_name(self, guid: str) -> str:
        desc = self.names.get(guid, "")
        return f"{desc} ({guid})" if desc else guid

    def short(self, guid: str) -> str:
        return self.names.get(guid, "") or guid

    def cable_names(self) -> dict[Port, str]:
        """Each port's far end as explain names a cable: ``leaf3 port 2``."""
        return {
            k: f"{self.short(c.switch_guid)} port {c.switch_port}" for k, c in self.cables.items()
        }


def topology(
    client: PrometheusClient,
    instances: Sequence[str],
    start: float,
    end: float,
    *,
    max_names: int = MAX_NAMES_PER_QUERY,
) -> Topology:
    """The leaves under the job's ports and those leaves' uplinks, from the last value of
    the info series in the window; queries scoped by the job's instances, then by its
    leaves' GUIDs, in groups of ``max_names``."""
    window = max(1, int(end - start))

    def last(metric: str, sel: str) -> str:
        return f"last_over_time({metric}{{{sel}}}[{window}s])"

    exprs = [
        last(
            "fabricscope_infiniband_peer_info",
            f'instance=~"{_alternation(g)}",node_type="switch"',
        )
        for g in groups(instances, max_names)
    ]
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(lambda e: client.query(e, end), exprs))
    cables: dict[Port, Cable] = {}
    names: dict[str, str] = {}
    for s in (x for a in answers for x in a):
        lb = s.labels
        key = (lb.get("instance", ""), lb.get("device", ""), lb.get("port", ""))
        guid = lb.get("peer_guid", "")
        if not all(key) or not guid:
            continue
        cables[key] = Cable(guid, lb.get("peer_port", ""), lb.get("peer_description", ""))
        names.setdefault(guid, lb.get("peer_description", ""))
    leaves = sorted({c.switch_guid for c in cables.values()})
    uplinks: dict[SwitchPort, SwitchPort] = {}
    if leaves:
        exprs = [
            last("fabricscope_infiniband_switch_link_info", f'switch_guid=~"{_alternation(g)}"')
            for g in groups(leaves, max_names)
        ]
        with ThreadPoolExecutor(max_workers=4) as pool:
            answers = list(pool.map(lambda e: client.query(e, end), exprs))
        for s in (x for a in answers for x in a):
            lb = s.labels
            near = (lb.get("switch_guid", ""), lb.get("switch_port", ""))
            far = (lb.get("peer_guid", ""), lb.get("peer_port", ""))
            if all(near) and all(far):
                uplinks[near] = far
                names.setdefault(near[0], lb.get("switch_description", ""))
                names.setdefault(far[0], lb.get("peer_description", ""))
    return Topology(cables, uplinks, names)


def evaluate_uplinks(
    client: PrometheusClient,
    topo: Topology,
    periods: Periods,
    *,
    checks: Sequence[Check] = UPLINK_CHECKS,
    max_names: int = MAX_NAMES_PER_QUERY,
) -> list[CheckResult]:
    """Every uplink check over both periods, scoped to both ends of the job's leaves' uplinks
    by exact GUIDs (two instant queries per check and group of ``max_names`` switches)."""
    guids = sorted({g for near, far in topo.uplinks.items() for g in (near[0], far[0])})
    if not guids:
        return [CheckResult(c) for c in checks]
    sels = [f'switch_guid=~"{_alternation(g)}"' for g in groups(guids, max_names)]
    base_d = f"{periods.base_seconds}s"
    slow_d = f"{periods.slow_seconds}s"
    jobs = [(c, sel) for c in checks for sel in sels]

    def run(job: tuple[Check, str]) -> tuple[list[Sample], list[Sample]]:
        check, sel = job
        far = sel.replace("switch_guid=~", "peer_guid=~", 1)
        base = client.query(check.expr(sel, base_d, far), periods.base_end)
        slow = client.query(check.expr(sel, slow_d, far), periods.slow_end)
        return base, slow

    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(run, jobs))
    base_of: dict[str, list[Sample]] = defaultdict(list)
    slow_of: dict[str, list[Sample]] = defaultdict(list)
    for (check, _), (base, slow) in zip(jobs, answers, strict=True):
        base_of[check.name] += base
        slow_of[check.name] += slow
    ratio = periods.slow_seconds / periods.base_seconds
    return [
        compare(
            c,
            base_of[c.name],
            slow_of[c.name],
            ratio,
            base_window=Window(periods.base_seconds, periods.base_end),
            slow_window=Window(periods.slow_seconds, periods.slow_end),
        )
        for c in checks
    ]
