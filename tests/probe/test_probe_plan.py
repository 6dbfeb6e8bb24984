"""The simulation of the probe schedule against faults, its text report and its command line."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

import pytest

from agent.probe.schedule.circle import Pair, full_cycle_rounds
from agent.probe.schedule.localise import FindingKind, Tuning
from agent.probe.schedule.plan import (
    FaultModel,
    PlanReport,
    RoundRecord,
    format_plan,
    main_plan,
    node_names,
    run_rounds,
    simulate,
)

SETTLES = [Tuning(settle_rounds=0), Tuning(settle_rounds=1)]


def sim(
    n: int, node: str | None = None, link: tuple[str, str] | None = None, **kw: Tuning
) -> PlanReport:
    return simulate(n, node, link, 60.0, 30.0, **kw)


def rounds_taken(r: PlanReport) -> int:
    assert r.first_seen_round is not None and r.localised_round is not None
    return r.localised_round - r.first_seen_round


def assert_node_localised(r: PlanReport, x: str, within: int) -> None:
    assert r.first_seen_round is not None and r.localised_round is not None
    assert r.localised_round - r.first_seen_round <= within
    assert r.verdict.bad_nodes == (x,) and r.verdict.bad_links == ()
    assert r.wrong_blame == ()


def assert_link_localised(r: PlanReport, link: tuple[str, str], within: int) -> None:
    assert r.first_seen_round is not None and r.localised_round is not None
    assert r.localised_round - r.first_seen_round <= within
    assert r.verdict.bad_links == (link,) and r.verdict.bad_nodes == ()
    assert r.wrong_blame == ()  # neither end was blamed as a bad node in any round


def test_node_names_sort_numerically() -> None:
    assert node_names(3) == ("node0000", "node0001", "node0002")
    big = node_names(12345)
    assert big[0] == "node00000" and big[-1] == "node12344" and list(big) == sorted(big)


@pytest.mark.parametrize("tuning", SETTLES, ids=["settle0", "settle1"])
def test_n1024_a_bad_node_is_localised_one_round_after_its_first_failure(tuning: Tuning) -> None:
    ms = node_names(1024)
    for x in (ms[0], ms[1], ms[511], ms[512], ms[1022], ms[1023]):
        r = sim(1024, x, tuning=tuning)
        assert r.first_seen_round == 0  # every node plays every round of an even circle
        assert_node_localised(r, x, within=1)
        assert len(r.verdict.findings[0].partners) == 2


@pytest.mark.parametrize("tuning", SETTLES, ids=["settle0", "settle1"])
def test_n1024_a_bad_link_is_localised_and_not_blamed_on_either_end(tuning: Tuning) -> None:
    ms = node_names(1024)
    for a, b in [(ms[0], ms[1023]), (ms[5], ms[6]), (ms[100], ms[777]), (ms[1021], ms[1022])]:
        r = sim(1024, link=(a, b), tuning=tuning)
        assert_link_localised(r, (a, b), within=tuning.settle_rounds + 2)


def test_every_fault_of_small_clusters_is_localised_without_wrong_blame() -> None:
    worst_node = worst_link = 0
    for n in range(3, 13):
        ms = node_names(n)
        for x in ms:
            r = sim(n, x)
            assert_node_localised(r, x, within=3)
            worst_node = max(worst_node, rounds_taken(r))
        for link in itertools.combinations(ms, 2):
            r = sim(n, link=link)
            # n = 3 runs one probe a round, so clearing both ends takes 2 rounds
            assert_link_localised(r, link, within=5 if n == 3 else 4)
            worst_link = max(worst_link, rounds_taken(r))
    assert worst_node == 2 and worst_link == 5  # the bounds above are reached, not loose


def test_sampled_faults_up_to_n128_are_localised_without_wrong_blame() -> None:
    rng = random.Random(2024)
    for n in [*range(13, 65), 100, 127, 128]:
        ms = node_names(n)
        for x in rng.sample(ms, 2):
            assert_node_localised(sim(n, x), x, within=3)
        for _ in range(2):
            a, b = sorted(rng.sample(ms, 2))
            assert_link_localised(sim(n, link=(a, b)), (a, b), within=5)


@pytest.mark.parametrize("n", [2, 3, 4, 17, 1024])
def test_no_fault_no_verdict(n: int) -> None:
    r = sim(n)
    assert r.first_seen_round is None and r.localised_round is None
    assert r.verdict.clean and r.wrong_blame == () and len(r.rounds) > 0
    assert all(not rec.failed and rec.verdict.clean for rec in r.rounds)


def test_n2_says_node_and_link_cannot_be_told_apart() -> None:
    both = ("node0000", "node0001")
    for r in [sim(2, "node0000"), sim(2, "node0001"), sim(2, link=both)]:
        assert r.first_seen_round == 0 and r.localised_round is None and r.wrong_blame == ()
        assert [(f.kind, f.nodes) for f in r.verdict.findings] == [(FindingKind.NODE_OR_LINK, both)]
        assert "cannot be told apart" in format_plan(r)


def test_n3_node_and_link_are_told_apart() -> None:
    assert_node_localised(sim(3, "node0000"), "node0000", within=2)
    r = sim(3, link=("node0000", "node0001"))
    assert_link_localised(r, ("node0000", "node0001"), within=4)
    # the link is seen in the round the circle pairs its ends, not earlier
    assert r.first_seen_round == 2


def collect(it: Iterator[RoundRecord], rounds: int) -> list[RoundRecord]:
    return [rec for rec, _ in zip(it, range(rounds), strict=False)]


def test_verdicts_hold_while_the_fault_lasts_and_clear_after_repair() -> None:
    ms = node_names(16)
    link = ("node0002", "node0005")

    def broken_until_200(r: int, p: Pair) -> bool:
        return not (r < 200 and (p.host, p.guest) == link)

    recs = collect(run_rounds(ms, broken_until_200), 300)
    localised = next(rec.round_no for rec in recs if rec.verdict.bad_links)
    for rec in recs[localised:200]:
        assert rec.verdict.bad_links == (link,) and rec.verdict.bad_nodes == ()
    assert all(rec.verdict.clean for rec in recs[200 + 2 * Tuning().window_rounds :])

    def node_bad_40_to_100(r: int, p: Pair) -> bool:
        return not (40 <= r < 100 and "node0007" in (p.host, p.guest))

    recs = collect(run_rounds(ms, node_bad_40_to_100), 200)
    assert all(rec.verdict.clean for rec in recs[:40])
    assert recs[41].verdict.bad_nodes == ("node0007",)  # onset after passes: one round
    assert all(rec.verdict.bad_nodes == ("node0007",) for rec in recs[41:100])
    assert all(rec.verdict.bad_nodes == () and not rec.verdict.bad_links for rec in recs[100:])
    assert recs[100].verdict.clean  # its first pass clears it and explains its old failures


def test_a_one_off_failure_blames_nothing() -> None:
    ms = node_names(16)

    def glitch(r: int, p: Pair) -> bool:
        return not (r == 5 and "node0004" in (p.host, p.guest))

    recs = collect(run_rounds(ms, glitch), 40)
    assert all(not rec.verdict.bad_nodes and not rec.verdict.bad_links for rec in recs)
    assert all(rec.verdict.clean for rec in recs[10:])


def test_two_faults_at_once_are_both_localised() -> None:
    ms = node_names(64)
    a, b = "node0003", "node0040"

    def two_nodes(r: int, p: Pair) -> bool:
        return not ({a, b} & {p.host, p.guest})

    recs = collect(run_rounds(ms, two_nodes), 4)
    assert recs[-1].verdict.bad_nodes == (a, b) and recs[-1].verdict.unresolved == ()

    link = ("node0010", "node0020")

    def node_and_link(r: int, p: Pair) -> bool:
        return not (a in (p.host, p.guest) or (p.host, p.guest) == link)

    recs = collect(run_rounds(ms, node_and_link), 40)
    assert recs[-1].verdict.bad_nodes == (a,) and recs[-1].verdict.bad_links == (link,)
    assert all(set(rec.verdict.bad_nodes) <= {a} for rec in recs)


def test_runs_from_a_later_start_match_a_run_from_round_0() -> None:
    ms = node_names(20)
    link = FaultModel(bad_link=("node0004", "node0011"))
    full = collect(run_rounds(ms, link.probe_ok), 30)
    start = 12
    late = collect(run_rounds(ms, link.probe_ok, start=start), 30 - start)
    assert [(x.pairs, x.failed, x.verdict.findings) for x in full[start:]] == [
        (x.pairs, x.failed, x.verdict.findings) for x in late
    ]


def test_fault_model_and_bad_arguments() -> None:
    f = FaultModel(bad_link=("b", "a"))
    assert f.bad_link == ("a", "b")
    assert not f.probe_ok(0, Pair("a", "b")) and f.probe_ok(0, Pair("a", "c"))
    with pytest.raises(ValueError):
        FaultModel(bad_node="a", bad_link=("a", "b"))
    with pytest.raises(ValueError):
        FaultModel(bad_link=("a", "a"))
    with pytest.raises(ValueError):
        simulate(1, None, None, 60, 30)
    with pytest.raises(ValueError):
        simulate(4, None, None, 10, 30)
    with pytest.raises(ValueError, match="not a member"):
        simulate(4, "node0004", None, 60, 30)


def test_format_plan_has_the_figures() -> None:
    r = sim(1024, "node0042")
    text = format_plan(r, show_rounds=2)
    assert "1024 nodes" in text
    assert "1023 rounds per full cycle" in text and "512 probes per round" in text
    assert "full cycle 1023 x 60 s = 61380 s (17 h 3 min)" in text
    assert "round 0: node0000-node1023 node0001-node1022" in text and "(+506 more)" in text
    assert "round 1: " in text and "round 2: node0000" not in text
    assert "first seen:  round 0" in text and "localised:   round 1" in text
    assert "verdict:     bad node node0042" in text and "wrong blame: none" in text
    odd = format_plan(sim(5, link=("node0001", "node0003")), show_rounds=10)
    assert "5 rounds per full cycle" in odd and "one node sits out each round" in odd
    assert "round 4: " in odd and "round 5: node" not in odd.split("simulated")[0]
    assert "bad link node0001:node0003" in odd.splitlines()[-1]
    clean = format_plan(sim(8))
    assert "no failure" in clean and clean.endswith("verdict:     no fault")


def test_main_plan_prints_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main_plan(["--nodes", "16", "--bad-link", "node0003:node0009"]) == 0
    out = capsys.readouterr().out
    assert "16 nodes" in out and "bad link node0003:node0009" in out.splitlines()[-1]
    assert main_plan(["--nodes", "16", "--bad-node", "node0005", "--settle-rounds", "0"]) == 0
    assert "round r is planned from rounds <= r - 1" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nodes", "1"], "--nodes must be >= 2"),
        (["--nodes", "8", "--bad-node", "node0008"], "node0008 is not a member"),
        (["--nodes", "8", "--bad-node", "n1"], "members are node0000..node0007"),
        (["--nodes", "8", "--bad-link", "node0001"], "must be X:Y"),
        (["--nodes", "8", "--bad-link", "node0001:node0009"], "node0009 is not a member"),
        (["--nodes", "8", "--bad-link", "node0001:node0001"], "two different members"),
        (
            ["--nodes", "8", "--bad-node", "node0001", "--bad-link", "node0001:node0002"],
            "not allowed",
        ),
        (["--nodes", "8", "--probe-seconds", "6m"], "--probe-seconds <= --round-seconds"),
        (["--nodes", "8", "--window-rounds", "3"], "window_rounds must be"),
    ],
)
def test_main_plan_rejects_bad_arguments(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        main_plan(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_cycle_figures_match_the_schedule() -> None:
    for n in (2, 3, 16, 17, 128, 1024):
        r = sim(n)
        assert r.cycle_rounds == full_cycle_rounds(n) and r.probes_per_round == n // 2
        assert r.cycle_seconds == r.cycle_rounds * 60.0
