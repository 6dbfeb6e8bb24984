"""``fabricscope explain`` names the switch, on a simulated fat tree (``tests/fabric_lab.py``:
ibsim, OpenSM, the real infiniband-diags, one real agent per host in process, 15 steps of
15 s backfilled into a real Prometheus).

The job runs on all 8 hosts, asked as an operator would on bare metal (``--nodes``,
``--change-at``). Planted after 9 healthy steps, at once, each on its own leaf: (a) leaf1's
host ports err and discard at the switch end, (b) leaf2's uplinks err and wait and its
hosts congest, (c) host5's cable errs at the switch end, (d) leaf4 keeps the background
trickle of errors the whole run has. explain must name leaf1 and leaf2 (as switches),
host5's cable (as that cable, not leaf3), and nothing on leaf4 or the spines; over the
healthy part alone, nothing.

The spine fabric (``fabric_run(spine=True)``): 3 leaves of 3, 2 and 1 hosts under 3
spines, background trickles on host cables and on one uplink; spine2's own ends of its
cables to leaf1 and leaf3 start counting symbol errors. explain must name spine2 (not two
uplink cables, not a leaf), every figure of it reproducing; over the healthy part, nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

import pytest

from exporter.explain import render
from exporter.explain.checks import THRESHOLD
from exporter.explain.client import ClientSettings, PrometheusClient
from exporter.explain.discover import JobSpec
from exporter.explain.report import Report, explain
from tests.explain.reproduce import (
    assert_every_figure_reproduces,
    assert_every_printed_query_reproduces,
)
from tests.fabric_lab import HOSTS, SPINE_HOSTS, Served, fabric_run

STEP = 15.0
#: healthy steps (120 s: explain's shortest window), then faulty ones
HEALTHY = 9
FAULTY = 6
LEAF_GUIDS = {f"leaf{i}": f"0x{0x200000 + i - 1:016x}" for i in range(1, 5)}


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    work = tmp_path_factory.mktemp("fabric")
    with fabric_run(work, healthy=HEALTHY, faulty=FAULTY, step=STEP) as served:
        yield served


def _explain(
    served: Served, start: float, end: float, change: float, hosts: tuple[str, ...] = HOSTS
) -> Report:
    client = PrometheusClient(ClientSettings(served.url))
    job = JobSpec("fabric", nodes=hosts)
    return explain(client, job, start, end, change_at=change)


@pytest.fixture(scope="module")
def faulty(fabric: Served) -> Report:
    return _explain(fabric, fabric.start, fabric.end, fabric.change)


def test_the_agents_map_the_fabric(fabric: Served) -> None:
    """Every host port's leaf, and every leaf uplink's spine, as the agents exported them."""
    client = PrometheusClient(ClientSettings(fabric.url))
    window = int(fabric.end - fabric.start)
    info = client.query(
        f'last_over_time(fabricscope_infiniband_peer_info{{node_type="switch"}}[{window}s])',
        fabric.end,
    )
    seen = {
        (s.labels["instance"], s.labels["device"]): (
            s.labels["peer_description"],
            s.labels["peer_port"],
        )
        for s in info
    }
    assert seen == {key: (leaf, str(port)) for key, (leaf, port) in fabric.tree.leaf_of.items()}
    links = client.query(
        f"last_over_time(fabricscope_infiniband_switch_link_info[{window}s])", fabric.end
    )
    uplinks = {
        (s.labels["switch_description"], int(s.labels["switch_port"])): (
            s.labels["peer_description"],
            int(s.labels["peer_port"]),
        )
        for s in links
    }
    want = {(lf, k): far for lf, ups in fabric.tree.uplinks.items() for k, far in ups.items()}
    assert uplinks == want  # each uplink read by one of its leaf's hosts: none missing
    readers = defaultdict(set)
    for s in links:
        readers[(s.labels["switch_guid"], s.labels["switch_port"])].add(s.labels["instance"])
    assert all(len(r) == 1 for r in readers.values()), readers


def test_explain_names_the_leaves_and_the_cable(faulty: Report) -> None:
    causes = faulty.causes
    assert causes, "nothing stood out"
    switches = {f.device: f for f in causes if f.cause == "switch"}
    leaf1 = f"leaf1 ({LEAF_GUIDS['leaf1']})"
    leaf2 = f"leaf2 ({LEAF_GUIDS['leaf2']})"
    assert set(switches) == {leaf1, leaf2}, [(f.cause, f.device) for f in causes]
    # (a): the errors and the discards of all four ports, the hosts' own counters clean
    ev1 = "\n".join(switches[leaf1].evidence)
    assert "link errors on 4 of the job's 4 ports under it (host1, host2)" in ev1
    assert "drops on 4 of the job's 4 ports under it (host1, host2)" in ev1
    assert "symbol errors at the switch end of the cable" in ev1
    # (b): the uplinks and the congestion of its hosts
    ev2 = "\n".join(switches[leaf2].evidence)
    assert "2 of its uplinks show faults" in ev2
    assert "congestion on 4 of the job's 4 ports under it (host3, host4)" in ev2
    assert "uplink leaf2 port 5 -> spine1 port 2" in ev2
    # (c): the cable, not its leaf
    cable = [f for f in causes if f.instance == "host5"]
    assert [f.cause for f in cable] == ["ib_link"], [(f.cause, f.device) for f in causes]
    assert cable[0].device == "host5 mlx5_0/1, cable to leaf3 port 1"
    assert any("at the switch end of the cable" in e for e in cable[0].evidence)
    # the named switches' ports are their evidence, not findings of their own; leaf4's
    # background and the spines stand out nowhere
    named = {f.instance for f in causes if f.instance}
    assert named == {"host5"}, [(f.cause, f.device) for f in causes]
    assert not [f for f in causes if "leaf4" in f.device or "spine" in f.device]
    assert causes[0].cause == "switch"


def test_explain_finds_nothing_in_the_healthy_part(fabric: Served) -> None:
    healthy = _explain(fabric, fabric.start, fabric.change - STEP, fabric.start + 4 * STEP)
    assert healthy.causes == [], [(f.cause, f.device, f.score) for f in healthy.causes]
    # the background was there, and below the threshold
    assert max(c.worst for c in healthy.checked) < THRESHOLD


def test_every_figure_of_the_switch_findings_reproduces(fabric: Served, faulty: Report) -> None:
    """The switches' and the cable's evidence included: each printed query returns its
    figure (an uplink's, read at the spine end, selects the spine's GUID)."""
    client = PrometheusClient(ClientSettings(fabric.url))
    switches = [f for f in faulty.causes if f.cause == "switch"]
    assert switches and all(f.measurements and f.promql_at > 0 for f in switches)
    assert assert_every_figure_reproduces(client, faulty) >= 2 * len(faulty.causes)
    # and as the text output prints them: every uplink of a switch finding has its query
    out = render.text(faulty)
    uplinks = sum(len(f.measurements[: render.EVIDENCE]) for f in switches)
    assert assert_every_printed_query_reproduces(client, out) >= 2 * uplinks, out


@pytest.fixture(scope="module")
def spine_fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    work = tmp_path_factory.mktemp("spine")
    with fabric_run(work, healthy=HEALTHY, faulty=FAULTY, step=STEP, spine=True) as served:
        yield served


SPINE2 = f"spine2 (0x{0x200000 + 3 + 1:016x})"


def test_a_spine_with_few_spines_is_named(spine_fabric: Served) -> None:
    """3 spines: the placement test could not name one (p >= 1/5); the binomial test
    against the job's other uplinks does, as one switch, not two uplink cables."""
    served = spine_fabric
    report = _explain(served, served.start, served.end, served.change, SPINE_HOSTS)
    causes = report.causes
    assert [(f.cause, f.device) for f in causes] == [("switch", SPINE2)], [
        (f.cause, f.device, f.score, f.evidence) for f in report.findings[:5]
    ]
    ev = causes[0].evidence
    assert ev[0].startswith("2 of the job's leaves' 3 uplinks to it, from 2 leaves, show faults")
    assert sum("far end" in e for e in ev) == 2
    client = PrometheusClient(ClientSettings(served.url))
    assert assert_every_figure_reproduces(client, report) >= 2


def test_the_spine_fabric_is_healthy_before(spine_fabric: Served) -> None:
    served = spine_fabric
    healthy = _explain(
        served, served.start, served.change - STEP, served.start + 4 * STEP, SPINE_HOSTS
    )
    assert healthy.causes == [], [(f.cause, f.device, f.score) for f in healthy.causes]
