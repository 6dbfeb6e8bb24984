"""The pairing schedule (circle method) and localise(), over many cluster sizes."""

from __future__ import annotations

import itertools
import random

import pytest

from agent.probe.schedule.circle import Pair, full_cycle_rounds, meeting_round, members_of
from agent.probe.schedule.localise import TUNING, FindingKind, Outcome, Tuning, assess, localise
from agent.probe.schedule.pairing import pairs_for_round, partner_of, plan_round

SIZES = [*range(2, 65), 1000, 1023, 1024]


def names(n: int) -> list[str]:
    return [f"h{i:04d}" for i in range(n)]


def check_round(pairs: tuple[Pair, ...], ms: list[str]) -> set[str]:
    """Disjoint pairs of members, host sorted first, pairs ordered by host; returns nodes."""
    seen: set[str] = set()
    members = set(ms)
    for p in pairs:
        assert p.host < p.guest
        assert p.host in members and p.guest in members
        assert p.host not in seen and p.guest not in seen
        seen |= {p.host, p.guest}
    assert [p.host for p in pairs] == sorted(p.host for p in pairs)
    return seen


@pytest.mark.parametrize("n", SIZES)
def test_a_full_cycle_meets_every_pair_exactly_once_in_disjoint_rounds(n: int) -> None:
    ms = names(n)
    cycle = full_cycle_rounds(n)
    assert cycle == (n - 1 if n % 2 == 0 else n)
    met: set[tuple[str, str]] = set()
    total = 0
    idle_count = dict.fromkeys(ms, 0)
    for r in range(cycle):
        pairs = pairs_for_round(ms, r)
        assert len(pairs) == n // 2
        busy = check_round(pairs, ms)
        for x in set(ms) - busy:
            idle_count[x] += 1
        met.update((p.host, p.guest) for p in pairs)
        total += len(pairs)
    assert total == len(met) == n * (n - 1) // 2
    # odd N: exactly one bye per round, and each node sits out exactly once per cycle
    assert set(idle_count.values()) == ({1} if n % 2 else {0})


@pytest.mark.parametrize("n", [2, 3, 4, 7, 16, 33, 128])
def test_round_numbers_wrap_modulo_the_cycle_including_negative_ones(n: int) -> None:
    ms = names(n)
    cycle = full_cycle_rounds(n)
    for r in range(-cycle, 2 * cycle):
        assert pairs_for_round(ms, r) == pairs_for_round(ms, r % cycle)
    big = 29_000_000  # floor(unix_time / 60) today
    assert pairs_for_round(ms, big) == pairs_for_round(ms, big % cycle)


def test_member_order_and_duplicates_do_not_matter() -> None:
    rng = random.Random(7)
    for n in [2, 3, 5, 8, 31, 64, 257]:
        ms = names(n)
        for _ in range(5):
            shuffled = ms + rng.sample(ms, min(3, n))
            rng.shuffle(shuffled)
            for r in (0, 1, n // 2, 10_001):
                assert pairs_for_round(shuffled, r) == pairs_for_round(ms, r)


def test_host_is_the_sorted_first_member_whatever_the_names() -> None:
    ms = ["gpu-b7", "gpu-a10", "gpu-a9", "gpu-c1", "10.0.0.2", "10.0.0.10"]
    for r in range(full_cycle_rounds(len(ms))):
        for p in pairs_for_round(ms, r):
            assert p.host == min(p.host, p.guest)
            assert sorted(ms).index(p.host) < sorted(ms).index(p.guest)
    with pytest.raises(ValueError, match="sort before"):
        Pair("b", "a")


@pytest.mark.parametrize("n", [*range(2, 41), 1023, 1024])
def test_partner_of_and_meeting_round_agree_with_the_round(n: int) -> None:
    ms = names(n)
    sample = ms if n <= 40 else ms[:3] + ms[-3:]
    for r in range(min(full_cycle_rounds(n), 40)):
        pairs = pairs_for_round(ms, r)
        by_node = {x: p for p in pairs for x in (p.host, p.guest)}
        for x in sample:
            assert partner_of(x, ms, r) == by_node.get(x)
        for p in pairs if n <= 40 else pairs[:3] + pairs[-3:]:
            assert meeting_round(ms, p.host, p.guest) == r


def test_degenerate_sizes_and_bad_arguments() -> None:
    assert full_cycle_rounds(0) == full_cycle_rounds(1) == 0
    assert pairs_for_round([], 3) == ()
    assert pairs_for_round(["solo", "solo"], 3) == ()
    assert partner_of("solo", ["solo"], 0) is None
    with pytest.raises(ValueError):
        full_cycle_rounds(-1)
    with pytest.raises(ValueError, match="not a member"):
        partner_of("x", ["a", "b"], 0)
    with pytest.raises(ValueError):
        meeting_round(["a", "b"], "a", "a")
    with pytest.raises(ValueError):
        Outcome(0, "a", "a", True)
    with pytest.raises(ValueError):
        Tuning(settle_rounds=-1)
    with pytest.raises(ValueError):
        Tuning(settle_rounds=3, window_rounds=9)


# -- localise on hand-made evidence ------------------------------------------------------------


def plain_outcomes(ms: list[str], rounds: range, fails: set[tuple[int, str, str]]) -> list[Outcome]:
    """The circle schedule's outcomes; (round, host, guest) in ``fails`` failed."""
    return [
        Outcome(r, p.host, p.guest, (r, p.host, p.guest) not in fails)
        for r in rounds
        for p in pairs_for_round(ms, r)
    ]


def test_no_failure_no_verdict() -> None:
    for n in range(2, 33):
        ms = names(n)
        obs = plain_outcomes(ms, range(full_cycle_rounds(n)), set())
        v = localise(ms, obs)
        assert v.clean and v.findings == ()
    assert localise(["a", "b"], []).clean


def test_a_node_failing_with_two_healthy_partners_is_bad() -> None:
    ms = names(8)
    x = "h0003"
    fails = {
        (r, p.host, p.guest)
        for r in (0, 1)
        for p in pairs_for_round(ms, r)
        if x in (p.host, p.guest)
    }
    obs = plain_outcomes(ms, range(2), fails)
    after_one = localise(ms, obs, upto=0)
    assert after_one.bad_nodes == () and len(after_one.unresolved) == 1
    v = localise(ms, obs)
    assert v.bad_nodes == (x,) and v.bad_links == () and v.unresolved == ()
    (f,) = v.findings
    assert f.kind is FindingKind.BAD_NODE and f.failed_rounds == (0, 1)
    assert set(f.partners) == {partner_of(x, ms, r).other(x) for r in (0, 1)}  # type: ignore[union-attr]


def test_a_link_needs_a_second_failure_after_both_ends_passed() -> None:
    ms = ["a", "b", "c", "d"]
    once = [Outcome(0, "a", "b", False), Outcome(0, "c", "d", True)]
    cleared = [*once, Outcome(1, "a", "c", True), Outcome(1, "b", "d", True)]
    retest = [*cleared, Outcome(2, "a", "b", False), Outcome(2, "c", "d", True)]
    assert [f.kind for f in localise(ms, once).findings] == [FindingKind.UNKNOWN]
    a = assess(ms, cleared, upto=1)
    assert a.retests == (("a", "b"),) and a.verdict.bad_links == ()
    v = localise(ms, retest)
    assert v.bad_links == (("a", "b"),) and v.bad_nodes == () and v.unresolved == ()
    # a retest that passes clears the first failure: a one-off timeout blames nothing
    transient = [*cleared, Outcome(2, "a", "b", True), Outcome(2, "c", "d", True)]
    assert localise(ms, transient).clean


def test_reports_are_merged_and_a_disagreement_counts_as_a_failure() -> None:
    ms = ["a", "b", "c", "d"]
    obs = [Outcome(0, "a", "b", True), Outcome(0, "b", "a", False), Outcome(0, "c", "d", True)]
    assert [f.nodes for f in localise(ms, obs).findings] == [("a", "b")]
    assert localise(ms, obs[:1] + obs[2:]).clean


def test_only_members_and_rounds_in_the_window_count() -> None:
    ms = ["a", "b", "c", "d"]
    t = Tuning(settle_rounds=0, window_rounds=4)
    old = [Outcome(0, "a", "b", False)]
    new = [Outcome(r, "c", "d", True) for r in range(1, 5)]
    assert not localise(ms, old + new, upto=3, tuning=t).clean
    assert localise(ms, old + new, upto=4, tuning=t).clean  # round 0 left the window
    assert localise(ms, [Outcome(0, "a", "zz", False)]).clean  # not a member
    assert localise(ms, [Outcome(5, "a", "b", False)], upto=4).clean  # later than upto


def test_with_two_members_node_and_link_cannot_be_told_apart() -> None:
    ms = ["a", "b"]
    obs = [Outcome(r, "a", "b", False) for r in range(10)]
    v = localise(ms, obs)
    assert v.bad_nodes == () and v.bad_links == ()
    assert [(f.kind, f.nodes) for f in v.findings] == [(FindingKind.NODE_OR_LINK, ("a", "b"))]


def test_findings_do_not_depend_on_observation_or_member_order() -> None:
    rng = random.Random(3)
    for n in (6, 12, 13):
        ms = names(n)
        fails = {
            (r, p.host, p.guest)
            for r in range(4)
            for p in pairs_for_round(ms, r)
            if rng.random() < 0.3
        }
        obs = plain_outcomes(ms, range(4), fails)
        reference = assess(ms, obs, upto=3)
        assert not reference.verdict.clean
        for _ in range(10):
            shuffled = obs[:]
            rng.shuffle(shuffled)
            assert assess(list(reversed(ms)), shuffled, upto=3) == reference


# -- the schedule reacting to failures ---------------------------------------------------------


@pytest.mark.parametrize("n", [6, 7, 8, 9, 64, 65, 1024])
def test_the_ends_of_a_failing_pair_meet_distinct_good_nodes_and_the_rest_keep_the_circle(
    n: int,
) -> None:
    ms = names(n)
    (p0,) = [p for p in pairs_for_round(ms, 0) if p.host == "h0001"]
    obs = plain_outcomes(ms, range(1), {(0, p0.host, p0.guest)})
    r = 1 + TUNING.settle_rounds  # the first round planned from round 0's results
    pairs = pairs_for_round(ms, r, obs)
    check_round(pairs, ms)
    assert len(pairs) >= n // 2 - 1
    by_node = {x: p for p in pairs for x in (p.host, p.guest)}
    x_partner = by_node[p0.host].other(p0.host)
    y_partner = by_node[p0.guest].other(p0.guest)
    assert len({p0.host, p0.guest, x_partner, y_partner}) == 4
    assert pairs == pairs_for_round(ms, r)  # their circle partners are good and new: no change
    if n < 64:
        return  # below, enough good referees for 6 suspects
    # make the circle partners of both ends suspects too: referees come from elsewhere
    fails = {(0, p0.host, p0.guest)}
    for end in (p0.host, p0.guest):
        q = partner_of(end, ms, r)
        assert q is not None
        mate = q.other(end)
        (their,) = [p for p in pairs_for_round(ms, 0) if mate in (p.host, p.guest)]
        fails.add((0, their.host, their.guest))
    obs = plain_outcomes(ms, range(1), fails)
    a = assess(ms, obs, upto=0)
    pairs = plan_round(a, r)
    check_round(pairs, ms)
    by_node = {x: p for p in pairs for x in (p.host, p.guest)}
    for end in (p0.host, p0.guest):
        partner = by_node[end].other(end)
        assert partner in a.good
        assert partner not in a.failed_with[end]
    assert len(set(pairs) - set(pairs_for_round(ms, r))) <= 3 * len(a.suspects)


def test_every_planned_round_is_disjoint_under_many_failure_patterns() -> None:
    rng = random.Random(11)
    for n in range(4, 41):
        ms = names(n)
        for _ in range(4):
            fails = set()
            for r in range(3):
                for p in pairs_for_round(ms, r):
                    if rng.random() < 0.15:
                        fails.add((r, p.host, p.guest))
            obs = plain_outcomes(ms, range(3), fails)
            for r in range(3, 6):
                pairs = pairs_for_round(ms, r, obs)
                check_round(pairs, ms)
                assert len(pairs) >= n // 2 - 1
                assert pairs == pairs_for_round(list(reversed(ms)), r, list(reversed(obs)))
                for x in ms[:3]:
                    mine = partner_of(x, ms, r, obs)
                    assert mine == next((p for p in pairs if x in (p.host, p.guest)), None)


def test_every_pair_of_a_small_cluster_can_be_a_bad_link_and_is_retested() -> None:
    for n in (4, 5, 6):
        ms = names(n)
        for a, b in itertools.combinations(ms, 2):
            r0 = meeting_round(ms, a, b)
            obs = plain_outcomes(ms, range(r0 + 2), {(r0, a, b)})
            plan = assess(ms, obs, upto=r0 + 1, tuning=Tuning(settle_rounds=0))
            if (a, b) in plan.retests:
                assert Pair(a, b) in plan_round(plan, r0 + 2)
            else:  # an end did not get a partner in round r0 + 1 (odd n)
                assert n % 2 == 1


def test_members_of_is_sorted_and_deduplicated() -> None:
    assert members_of(["b", "a", "b", "c"]) == ("a", "b", "c")
