"""explain's switch grouping (exporter/explain/switches.py), pure: the crowding test, which
crowds name a leaf or a spine, and which stay a node's or a cable's own."""

from __future__ import annotations

import math
from collections.abc import Iterable

import pytest

from exporter.explain.checks import CHECKS_BY_NAME, Check
from exporter.explain.crowd import crowding, leaf_scan, spine_scan
from exporter.explain.evidence import CheckResult, Measurement, Periods
from exporter.explain.switches import (
    UPLINK_CHECKS,
    Cable,
    Topology,
    binomial_tail,
    group,
    spine_chance,
    without,
)

PERIODS = Periods(0.0, 600.0, 615.0, 1200.0)
ERRORS = CHECKS_BY_NAME["peer_symbol_errors"]
WAIT = CHECKS_BY_NAME["xmit_wait_share"]
UPLINK_ERRORS = UPLINK_CHECKS[0]


def leaf(i: int) -> str:
    return f"0x{0x200000 + i:016x}"


def spine(i: int) -> str:
    return f"0x{0x300000 + i:016x}"


def tree(leaves: int, hosts_per_leaf: int, devices: int = 2, uplinks_to: int = 2) -> Topology:
    """Every device of a host under its leaf; each leaf cabled once to each of
    ``uplinks_to`` spines (leaf port after its hosts' ports, spine port = leaf number)."""
    cables = {}
    names = {}
    uplinks = {}
    h = 0
    for lf in range(leaves):
        names[leaf(lf)] = f"leaf{lf + 1}"
        for _ in range(hosts_per_leaf):
            h += 1
            for d in range(devices):
                port = (h - 1) % hosts_per_leaf * devices + d + 1
                cables[(f"host{h}", f"mlx5_{d}", "1")] = Cable(leaf(lf), str(port), f"leaf{lf + 1}")
        for s in range(uplinks_to):
            names[spine(s)] = f"spine{s + 1}"
            uplinks[(leaf(lf), str(hosts_per_leaf * devices + s + 1))] = (spine(s), str(lf + 1))
    return Topology(cables, uplinks, names)


def result(check: Check, scores: dict[tuple[str, ...], float]) -> CheckResult:
    out = CheckResult(check, series=len(scores))
    for key, sc in scores.items():
        labels = dict(zip(("instance", *check.identity), key, strict=True))
        out.measurements.append(Measurement(check, labels, 0.0, 1.0, sc))
    return out


def ports(hosts: Iterable[int], devices: Iterable[int] = (0, 1)) -> list[tuple[str, str, str]]:
    return [(f"host{h}", f"mlx5_{d}", "1") for h in hosts for d in devices]


def named(topo: Topology, *results: CheckResult, uplinks: Iterable[CheckResult] = ()) -> dict:
    g = group(list(results), list(uplinks), topo, periods=PERIODS, step=15)
    return {f.device: f for f in g.findings}


def test_crowding_is_the_hypergeometric_tail() -> None:
    # 16 ports, 4 under the leaf, 4 with evidence, all 4 under it: 1 / C(16, 4)
    assert crowding(4, 16, 4, 4) == pytest.approx(1 / math.comb(16, 4))
    # one extra evidence port elsewhere: C(12, 1) / C(16, 5)
    assert crowding(4, 16, 4, 5) == pytest.approx(12 / math.comb(16, 5))
    assert crowding(0, 16, 4, 5) == 1.0
    assert crowding(5, 16, 4, 5) == 0.0
    # the job on one leaf: whatever crowds there is as likely as not
    assert crowding(4, 8, 8, 4) == 1.0
    # a large job: 8,000 ports, 32 under the leaf, 10 of 80 evidence ports there
    assert crowding(10, 8000, 32, 80) < 1e-12


def test_a_leaf_whose_hosts_all_err_is_named_with_its_ports() -> None:
    topo = tree(4, 2)
    bad = {(*k[:1], *k[1:]): 2.0 for k in ports([1, 2])}
    found = named(topo, result(ERRORS, bad))
    assert list(found) == ["leaf1 (0x0000000000200000)"]
    f = found["leaf1 (0x0000000000200000)"]
    assert f.cause == "switch"
    assert "link errors on 4 of the job's 4 ports under it (host1, host2)" in f.evidence[0]
    assert len(f.evidence) == 1 + 4
    # the score: the strongest port's plus half a bit per doubling of the nodes
    assert f.score == pytest.approx(2.0 + 0.5)


def test_the_named_ports_fold_into_the_switch() -> None:
    topo = tree(4, 2)
    r = result(ERRORS, {k: 2.0 for k in [*ports([1, 2]), ("host5", "mlx5_0", "1")]})
    g = group([r], [], topo, periods=PERIODS, step=15)
    kept = without([r], g.folded)[0].measurements
    assert [m.labels["instance"] for m in kept] == ["host5"]


def test_one_nodes_fault_stays_the_nodes() -> None:
    """Both ports of one host under a leaf of two hosts: as crowded as can be, one node."""
    topo = tree(2, 2)
    assert named(topo, result(ERRORS, dict.fromkeys(ports([1]), 3.0))) == {}


def test_a_job_on_one_leaf_never_names_it() -> None:
    topo = tree(1, 4)
    assert named(topo, result(ERRORS, dict.fromkeys(ports([1, 2, 3, 4]), 3.0))) == {}


def test_evidence_spread_over_the_fabric_names_no_leaf() -> None:
    """One port of each of 6 hosts on 3 leaves: no leaf holds more than placement gives."""
    topo = tree(3, 2)
    spread = {p: 2.0 for p in ports(range(1, 7), [0])}
    assert named(topo, result(ERRORS, spread)) == {}


def test_two_hosts_of_eight_on_a_two_host_leaf_is_not_enough() -> None:
    """Single-port hosts, two per leaf: both of a leaf's ports erring happens by chance one
    time in seven; not named (the simulated fat tree gives each host two HCAs for this)."""
    topo = tree(4, 2, devices=1)
    assert named(topo, result(ERRORS, dict.fromkeys(ports([1, 2], [0]), 3.0))) == {}


def test_weak_evidence_that_crowds_still_names_the_leaf() -> None:
    """No port stands out alone (0.6 < 1), the crowd does: at least the threshold."""
    topo = tree(8, 2)
    found = named(topo, result(WAIT, dict.fromkeys(ports([3, 4]), 0.6)))
    assert list(found) == ["leaf2 (0x0000000000200001)"]
    assert found["leaf2 (0x0000000000200001)"].score == pytest.approx(1.5)


def placed(sizes: Iterable[int], devices: int = 8) -> Topology:
    """Nodes ``node-0001`` on, in order, under leaves of ``sizes`` nodes; ``devices`` ports
    each (``mlx5_0`` on), as the accuracy benchmark cables them."""
    cables, names, first = {}, {}, 1
    for lf, size in enumerate(sizes):
        names[leaf(lf)] = f"leaf{lf + 1}"
        for slot, node in enumerate(range(first, first + size)):
            for d in range(devices):
                port = str(slot * devices + d + 1)
                cables[(f"node-{node:04d}", f"mlx5_{d}", "1")] = Cable(
                    leaf(lf), port, f"leaf{lf + 1}"
                )
        first += size
    return Topology(cables, {}, names)


def test_two_background_trickles_under_a_leaf_are_not_a_leaf() -> None:
    """The accuracy benchmark's false cause (seed 25, case 67: a healthy 64-node window): the
    job's only two evidence ports of link errors, trickles scoring 0.65 ("symbol errors at
    the switch end of the cable: 0.18 -> 0.75/min") and 0.58 ("0 -> 0.5/min"), both under
    the leaf holding 48 of its 512 ports: by placement p = 0.043 after the 5 leaves, which
    named the leaf at 1.50. Neither stands out alone, so the crowd is held to the chance of
    one port standing out (0.00135): not a leaf."""
    topo = placed([8, 18, 17, 6, 15])
    errors = CHECKS_BY_NAME["symbol_errors"]
    trickles = [
        result(ERRORS, {("node-0048", "mlx5_4", "1"): 0.649}),
        result(errors, {("node-0044", "mlx5_0", "1"): 0.585}),
    ]
    assert named(topo, *trickles) == {}
    # the same two ports standing out (a port of each errs): the crowd's placement is as
    # unlikely, and one of them stands out, so the leaf is named at the placement's bar
    strong = [
        result(ERRORS, {("node-0048", "mlx5_4", "1"): 1.6}),
        result(errors, {("node-0044", "mlx5_0", "1"): 0.585}),
    ]
    found = named(topo, *strong)
    assert list(found) == ["leaf4 (0x0000000000200003)"]
    assert (
        "p = 0.043 (hypergeometric, x1 strengths scanned, x5 leaves)"
        in found["leaf4 (0x0000000000200003)"].evidence[0]
    )


def test_a_crowd_of_weak_ports_names_its_leaf_when_large_enough() -> None:
    """A leaf whose nodes each err a little (no port standing out): six of its ports at 0.6
    while the job's other 464 are clean is a leaf (p = 1.3e-5 after the scan and the
    5 leaves); two are not (0.043)."""
    topo = placed([8, 18, 17, 6, 15])
    six = {(f"node-{n:04d}", "mlx5_1", "1"): 0.6 for n in range(44, 50)}
    found = named(topo, result(ERRORS, six))
    assert list(found) == ["leaf4 (0x0000000000200003)"]
    line = found["leaf4 (0x0000000000200003)"].evidence[0]
    assert "no port stands out alone: held to 0.0013" in line
    two = dict(list(six.items())[:2])
    assert named(topo, result(ERRORS, two)) == {}


def test_the_leaf_scan_rests_on_the_strongest_ports() -> None:
    """Four strong ports under a leaf and many weak ones spread over the job: counted, the
    weak ones make the four likely (p = 0.53 over 40 evidence ports); scanned from the
    strongest down, four of the job's four strongest under one leaf of 48 ports in 512 are
    not (p < 10^-3)."""
    hits = [(3.0, "a"), (2.5, "b"), (2.2, "c"), (2.0, "d")]
    weak = [0.6] * 36
    test = leaf_scan(hits, 48, [s for s, _ in hits] + weak, 512)
    assert test is not None
    assert (test.m, test.weakest, test.as_strong, test.tried) == (4, 2.0, 4, 3)
    assert test.p == pytest.approx(3 * crowding(4, 512, 48, 4))
    assert test.p < 1e-3 and crowding(4, 512, 48, 40) > 0.5
    # one node's ports alone never make a crowd
    assert leaf_scan([(3.0, "a"), (2.0, "a")], 48, [3.0, 2.0], 512) is None


def uplink(
    topo: Topology, score: float, *ups: tuple[str, str], check: Check = UPLINK_ERRORS
) -> CheckResult:
    return result(check, {("", *u): score for u in ups})


def test_one_erring_uplink_is_a_cable() -> None:
    topo = tree(4, 2)
    found = named(topo, uplinks=[uplink(topo, 2.0, (leaf(1), "5"))])
    assert list(found) == ["uplink cable leaf2 port 5 <-> spine1 port 2"]


def test_a_cable_erring_only_at_the_spine_end_is_found() -> None:
    topo = tree(4, 2)
    found = named(topo, uplinks=[uplink(topo, 2.0, (spine(1), "3"))])
    f = found["uplink cable leaf3 port 6 <-> spine2 port 3"]
    assert "far end" in f.evidence[0]


def test_two_uplinks_of_a_leaf_name_the_leaf() -> None:
    topo = tree(4, 2)
    found = named(topo, uplinks=[uplink(topo, 2.0, (leaf(1), "5"), (leaf(1), "6"))])
    assert list(found) == ["leaf2 (0x0000000000200001)"]
    assert found["leaf2 (0x0000000000200001)"].evidence[0].startswith("2 of its uplinks")


def test_uplinks_of_several_leaves_to_one_spine_name_the_spine() -> None:
    topo = tree(8, 2)
    four = [(leaf(i), "5") for i in range(4)]
    found = named(topo, uplinks=[uplink(topo, 2.0, *four)])
    assert list(found) == ["spine1 (0x0000000000300000)"]
    assert (
        found["spine1 (0x0000000000300000)"]
        .evidence[0]
        .startswith(
            "4 of the job's leaves' 8 uplinks to it, from 4 leaves, show faults, 0 of their 8"
        )
    )


@pytest.mark.parametrize(("leaves", "spines"), [(3, 3), (2, 2), (3, 4), (4, 8)])
def test_two_leaves_uplinks_to_one_spine_name_it_with_few_spines(leaves: int, spines: int) -> None:
    """The placement test could never name a spine of fewer than 11: p >= 1/(2S - 1). Two
    leaves' uplinks to one spine erring, the job's other uplinks clean, name the spine."""
    topo = tree(leaves, 2, uplinks_to=spines)
    target = spine(spines - 1)
    ups = [u for u, far in topo.uplinks.items() if far[0] == target][:2]
    found = named(topo, uplinks=[uplink(topo, 2.0, *ups)])
    assert list(found) == [f"spine{spines} ({target})"]


def test_a_spine_is_named_from_its_own_ends_of_the_cables() -> None:
    """The errors counted only at the spine's ports (the far ends) name it as well."""
    topo = tree(3, 2, uplinks_to=3)
    found = named(topo, uplinks=[uplink(topo, 2.0, (spine(1), "1"), (spine(1), "3"))])
    f = found["spine2 (0x0000000000300001)"]
    assert all("far end" in e for e in f.evidence[1:])
    assert [m.labels["switch_guid"] for m in f.measurements] == [spine(1), spine(1)]


def test_uplinks_erring_on_every_spine_name_no_spine() -> None:
    """A fabric-wide event (every spine's uplinks err): no spine is singled out."""
    topo = tree(3, 2, uplinks_to=3)
    ups = [u for u, far in topo.uplinks.items() if far[1] in ("1", "2")]
    found = named(topo, uplinks=[uplink(topo, 2.0, *ups)])
    assert not [d for d in found if d.startswith("spine")], list(found)


def test_spine_chance_is_the_binomial_tail_with_the_others_share() -> None:
    # 2 of a spine's 3 uplinks, none of the 6 others: q = 0.2 / 16
    p, q = spine_chance(2, 3, 0, 6)
    assert q == pytest.approx(0.0125)
    assert p == pytest.approx(3 * q**2 * (1 - q) + q**3)
    # many clean others: q falls towards what they show
    assert spine_chance(2, 32, 0, 224)[1] == pytest.approx(0.2 / 234)
    # most others err: 2 of 3 is what chance gives
    p, q = spine_chance(2, 3, 5, 6)
    assert q == pytest.approx(5.2 / 16) and p > 0.2
    assert binomial_tail(0, 3, 0.1) == 1.0 and binomial_tail(4, 3, 0.1) == 0.0


def test_the_spine_scan_weighs_how_strongly_its_uplinks_err() -> None:
    """71 leaves under 3 spines: two leaves' uplinks to one spine err at 6.6 and 5.5/min
    (scores 2.93 and 2.70), one uplink to another spine trickles at 1.1/min (1.07). The count
    alone says two of 213 erring uplinks share a spine one time in three; none of the other
    spines' 142 uplinks errs even half as strongly, which independent faults rarely give."""
    p_count, _ = spine_chance(2, 71, 1, 142)
    assert p_count * 3 > 0.3  # the count-only test: not named
    test = spine_scan([(2.93, "a"), (2.70, "b")], 71, [1.07], 142)
    assert test is not None and test.m == 2 and test.others_as_strong == 0
    assert test.q == pytest.approx(0.2 / 152)
    assert test.p == pytest.approx(binomial_tail(2, 71, 0.2 / 152))
    assert test.p * 3 < 0.05
    # the other spines' uplinks err as strongly: chance again
    same = spine_scan([(2.93, "a"), (2.70, "b")], 71, [3.1, 2.8, 3.0], 142)
    assert same is not None and same.others_as_strong == 3 and same.p * 3 > 0.05
    # weak hits among weak others (a trickle's noise): chance
    weak = spine_scan([(1.0, "a"), (0.6, "b")], 71, [0.7, 0.8, 0.9], 142)
    assert weak is not None and weak.p * 3 > 0.3
    # uplinks of one leaf only: a leaf's evidence, not the spine's
    assert spine_scan([(3.0, "a"), (2.0, "a")], 71, [], 142) is None
    # the scan's correction: three hits, two sizes tried
    three = spine_scan([(3.0, "a"), (2.0, "b"), (0.6, "c")], 71, [1.0], 142)
    assert three is not None and three.tried == 2


def test_two_leaves_of_seventy_one_name_their_spine() -> None:
    """The 1,024-node miss: 71 single-host leaves, 3 spines; spine2's ends of its cables
    to two leaves err strongly, one uplink to spine1 trickles. The spine, not two cables."""
    topo = tree(71, 1, devices=1, uplinks_to=3)
    found = named(
        topo,
        uplinks=[
            uplink(topo, 2.93, (spine(1), "10")),
            uplink(topo, 2.70, (spine(1), "40")),
            uplink(topo, 1.07, (spine(0), "5")),
        ],
    )
    assert "spine2 (0x0000000000300001)" in found, list(found)
    assert not [d for d in found if d.startswith("uplink cable") and "spine2" in d]
    first = found["spine2 (0x0000000000300001)"].evidence[0]
    assert "2 of its uplinks score 2.70 or more, 0 to other spines do" in first


def test_as_strong_errors_on_every_spine_name_no_spine_at_scale() -> None:
    """The same two strong uplinks, and as strong ones to the other spines: no spine."""
    topo = tree(71, 1, devices=1, uplinks_to=3)
    found = named(
        topo,
        uplinks=[
            uplink(topo, 2.93, (spine(1), "10")),
            uplink(topo, 2.70, (spine(1), "40")),
            *(uplink(topo, 3.0, (spine(s), str(lf))) for s, lf in ((0, 5), (0, 22), (2, 7))),
        ],
    )
    assert not [d for d in found if d.startswith("spine")], list(found)


def test_the_uplinks_and_the_ports_of_one_leaf_are_one_finding() -> None:
    topo = tree(4, 2)
    found = named(
        topo,
        result(WAIT, dict.fromkeys(ports([3, 4]), 2.0)),
        uplinks=[uplink(topo, 3.0, (leaf(1), "5"), (leaf(1), "6"))],
    )
    assert list(found) == ["leaf2 (0x0000000000200001)"]
    text = "\n".join(found["leaf2 (0x0000000000200001)"].evidence)
    assert "2 of its uplinks" in text and "congestion on 4 of the job's 4 ports" in text
