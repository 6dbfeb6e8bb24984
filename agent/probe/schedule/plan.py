"""Simulate the cross-node probe schedule against a fault, and print the plan.

``fabricscope probe plan --nodes N [--bad-node X | --bad-link X:Y]`` answers, before a single
probe runs: how many rounds a full cycle of pairs takes, how many probes run in parallel, how
long a cycle lasts, and how many rounds the schedule needs to first see and then localise a
bad node or a bad link. The fault model: a probe fails iff it involves the bad node or is
exactly the bad link. Members are ``node0000 .. node<N-1>``, zero-padded so they sort
numerically. Pure apart from :func:`main_plan`, which prints.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import NoReturn

from agent.config import ProbeSettings, format_duration, parse_duration
from agent.probe.schedule.circle import (
    Pair,
    full_cycle_rounds,
    meeting_round,
    members_of,
    plain_pairs,
)
from agent.probe.schedule.localise import (
    TUNING,
    Assessment,
    Finding,
    FindingKind,
    Outcome,
    Tuning,
    Verdict,
    assess,
)
from agent.probe.schedule.pairing import partner_of, plan_round

__all__ = [
    "FaultModel",
    "PlanReport",
    "ProbeModel",
    "RoundRecord",
    "describe_finding",
    "format_plan",
    "main_plan",
    "node_names",
    "run_rounds",
    "simulate",
]

GIVE_UP_ROUNDS = 32
"""simulate stops this many rounds after the fault is first seen if it is not localised."""
CLEAN_ROUNDS = 8
"""Rounds simulate runs when there is no fault."""
PAIRS_SHOWN = 6
"""Pairs printed per round before the rest are counted."""
INVESTIGATION_SHOWN = 8
"""Simulated rounds printed after the fault is first seen."""


def node_names(n: int) -> tuple[str, ...]:
    """``node0000 .. node<n-1>``, zero-padded (at least 4 digits) so they sort numerically."""
    if n < 0:
        raise ValueError(f"node count must be >= 0, got {n}")
    width = max(4, len(str(n - 1)))
    return tuple(f"node{i:0{width}d}" for i in range(n))


@dataclass(frozen=True, slots=True)
class FaultModel:
    """At most one fault: a probe fails iff it involves ``bad_node`` or is ``bad_link``."""

    bad_node: str | None = None
    bad_link: tuple[str, str] | None = None
    """Sorted."""

    def __post_init__(self) -> None:
        if self.bad_node is not None and self.bad_link is not None:
            raise ValueError("give a bad node or a bad link, not both")
        if self.bad_link is not None:
            a, b = self.bad_link
            if a == b:
                raise ValueError(f"a bad link needs two nodes, got {a!r} twice")
            if a > b:
                object.__setattr__(self, "bad_link", (b, a))

    def probe_ok(self, round_no: int, pair: Pair) -> bool:
        """The fault model; ``round_no`` is unused (the fault is permanent)."""
        del round_no
        if self.bad_node is not None and self.bad_node in (pair.host, pair.guest):
            return False
        return self.bad_link != (pair.host, pair.guest)

    def expects(self, verdict: Verdict) -> bool:
        """The verdict blames exactly this fault (a clean verdict for no fault)."""
        if self.bad_node is not None:
            return verdict.bad_nodes == (self.bad_node,) and not verdict.bad_links
        if self.bad_link is not None:
            return verdict.bad_links == (self.bad_link,) and not verdict.bad_nodes
        return verdict.clean

    def wrong_blame(self, verdict: Verdict) -> tuple[Finding, ...]:
        """Bad-node and bad-link findings that blame something other than this fault."""
        wrong_node = tuple(n for n in verdict.bad_nodes if n != self.bad_node)
        wrong_link = tuple(link for link in verdict.bad_links if link != self.bad_link)
        return tuple(
            f
            for f in verdict.findings
            if (f.kind is FindingKind.BAD_NODE and f.nodes[0] in wrong_node)
            or (f.kind is FindingKind.BAD_LINK and (f.nodes[0], f.nodes[1]) in wrong_link)
        )

    def describe(self) -> str:
        if self.bad_node is not None:
            return f"bad node {self.bad_node}"
        if self.bad_link is not None:
            return f"bad link {self.bad_link[0]}:{self.bad_link[1]}"
        return "none"


@dataclass(frozen=True, slots=True)
class RoundRecord:
    round_no: int
    pairs: tuple[Pair, ...]
    failed: tuple[Pair, ...]
    verdict: Verdict
    """localise's verdict at the end of this round."""


ProbeModel = Callable[[int, Pair], bool]
"""Whether the probe of a pair in a round passes."""


def run_rounds(
    members: Sequence[str],
    probe_ok: ProbeModel,
    *,
    tuning: Tuning = TUNING,
    start: int = 0,
) -> Iterator[RoundRecord]:
    """Run the schedule (with localisation) from round ``start`` on, forever, each probe
    passing iff ``probe_ok(round, pair)``.

    Rounds before ``start`` (from round 0) are taken to have run the plain circle schedule
    with every probe passing, which is what happens when no probe fails before ``start``.
    Each round is judged once; the judgement of round r also plans round r + 1 +
    settle_rounds, as in production.
    """
    ms = members_of(members)
    window = tuning.window_rounds
    settle = tuning.settle_rounds
    rounds: dict[int, tuple[Outcome, ...]] = {}
    for r in range(max(0, start - window - settle - 1), start):
        rounds[r] = tuple(Outcome(r, p.host, p.guest, True) for p in plain_pairs(ms, r))
    cache: dict[int, Assessment] = {}

    def judged(upto: int) -> Assessment:
        if upto not in cache:
            obs = [o for r in range(upto - window + 1, upto + 1) for o in rounds.get(r, ())]
            cache[upto] = assess(ms, obs, upto=upto, tuning=tuning)
        return cache[upto]

    round_no = start
    while True:
        pairs = plan_round(judged(round_no - 1 - settle), round_no)
        outcomes = tuple(Outcome(round_no, p.host, p.guest, probe_ok(round_no, p)) for p in pairs)
        rounds[round_no] = outcomes
        verdict = judged(round_no).verdict
        failed = tuple(p for p, o in zip(pairs, outcomes, strict=True) if not o.ok)
        yield RoundRecord(round_no, pairs, failed, verdict)
        for r in [r for r in rounds if r <= round_no - window - settle - 1]:
            del rounds[r]
        for r in [r for r in cache if r < round_no - settle]:
            del cache[r]
        round_no += 1


@dataclass(frozen=True, slots=True)
class PlanReport:
    members: tuple[str, ...]
    fault: FaultModel
    round_seconds: float
    probe_seconds: float
    tuning: Tuning
    rounds: tuple[RoundRecord, ...]
    """The rounds simulated; earlier rounds ran the plain circle and all passed."""
    first_seen_round: int | None
    localised_round: int | None
    """The first round at whose end the verdict blames exactly the fault."""
    wrong_blame: tuple[tuple[int, Finding], ...]
    """(round, finding) for every round whose verdict blamed something else."""

    @property
    def n(self) -> int:
        return len(self.members)

    @property
    def cycle_rounds(self) -> int:
        return full_cycle_rounds(self.n)

    @property
    def probes_per_round(self) -> int:
        return self.n // 2

    @property
    def cycle_seconds(self) -> float:
        return self.cycle_rounds * self.round_seconds

    @property
    def verdict(self) -> Verdict:
        return self.rounds[-1].verdict if self.rounds else Verdict(())


def _first_exercised(members: tuple[str, ...], fault: FaultModel) -> int | None:
    if fault.bad_link is not None:
        return meeting_round(members, *fault.bad_link)
    if fault.bad_node is not None:
        # a node sits out at most one round in a row (odd N), so round 0 or 1
        return 0 if partner_of(fault.bad_node, members, 0) is not None else 1
    return None


def simulate(
    n: int,
    bad_node: str | None,
    bad_link: tuple[str, str] | None,
    round_seconds: float,
    probe_seconds: float,
    *,
    tuning: Tuning = TUNING,
) -> PlanReport:
    """Run the schedule on ``node_names(n)`` until the fault is localised (or
    ``GIVE_UP_ROUNDS`` after it is first seen; ``CLEAN_ROUNDS`` rounds without a fault)."""
    if n < 2:
        raise ValueError(f"need at least 2 nodes, got {n}")
    if probe_seconds <= 0 or round_seconds < probe_seconds:
        raise ValueError(
            f"need 0 < probe_seconds <= round_seconds (the probes of a round run in parallel "
            f"within it), got probe {probe_seconds} s, round {round_seconds} s"
        )
    members = node_names(n)
    fault = FaultModel(bad_node, bad_link)
    for name in (bad_node, *(bad_link or ())):
        if name is not None and name not in members:
            raise ValueError(f"{name!r} is not a member ({members[0]}..{members[-1]})")
    start = _first_exercised(members, fault)
    stop = CLEAN_ROUNDS - 1 if start is None else start + GIVE_UP_ROUNDS
    records: list[RoundRecord] = []
    first_seen: int | None = None
    localised: int | None = None
    wrong: list[tuple[int, Finding]] = []
    for rec in run_rounds(members, fault.probe_ok, tuning=tuning, start=start or 0):
        records.append(rec)
        if first_seen is None and rec.failed:
            first_seen = rec.round_no
        wrong.extend((rec.round_no, f) for f in fault.wrong_blame(rec.verdict))
        if start is not None and fault.expects(rec.verdict):
            localised = rec.round_no
            break
        if rec.round_no >= stop:
            break
    return PlanReport(
        members=members,
        fault=fault,
        round_seconds=round_seconds,
        probe_seconds=probe_seconds,
        tuning=tuning,
        rounds=tuple(records),
        first_seen_round=first_seen,
        localised_round=localised,
        wrong_blame=tuple(wrong),
    )


# -- text -------------------------------------------------------------------------------------


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{seconds:g} s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if s >= size:
            parts.append(f"{s // size} {unit}")
            s %= size
    return " ".join(parts[:2])


def _plural(k: int, word: str) -> str:
    return f"{k} {word}" if k == 1 else f"{k} {word}s"


def _pairs_text(pairs: Sequence[Pair]) -> str:
    shown = " ".join(f"{p.host}-{p.guest}" for p in pairs[:PAIRS_SHOWN])
    rest = len(pairs) - PAIRS_SHOWN
    return f"{shown} ... (+{rest} more)" if rest > 0 else shown or "(none)"


def _rounds_text(rounds: Sequence[int]) -> str:
    if len(rounds) <= 4:
        return ", ".join(str(r) for r in rounds)
    return f"{rounds[0]}, {rounds[1]} .. {rounds[-1]}, {len(rounds)} failures"


def describe_finding(f: Finding) -> str:
    """One line for a finding, e.g. ``bad link node0003:node0009: failed in rounds 6, 9; ...``."""
    rounds = _rounds_text(f.failed_rounds)
    if f.kind is FindingKind.BAD_NODE:
        return (
            f"bad node {f.nodes[0]}: failed with healthy partners {', '.join(f.partners)} "
            f"(rounds {rounds})"
        )
    a, b = f.nodes
    if f.kind is FindingKind.BAD_LINK:
        return f"bad link {a}:{b}: failed in rounds {rounds}; both ends pass with other partners"
    if f.kind is FindingKind.NODE_OR_LINK:
        return (
            f"{a}, {b} or the link {a}:{b} (rounds {rounds}): with only 2 members a bad node "
            f"and a bad link cannot be told apart"
        )
    return f"unexplained failure {a}:{b} (rounds {rounds}), under investigation"


def _verdict_text(v: Verdict) -> str:
    if v.clean:
        return "no fault"
    return "; ".join(describe_finding(f) for f in v.findings)


def format_plan(report: PlanReport, show_rounds: int = 3) -> str:
    """The plan as text: schedule figures, the first rounds' pairs, what the simulation saw."""
    ms = report.members
    t = report.tuning
    lines = [
        f"probe plan: {report.n} nodes ({ms[0]}..{ms[-1]})",
        f"  schedule:  circle method, {_plural(report.cycle_rounds, 'round')} per full cycle, "
        f"{_plural(report.probes_per_round, 'probe')} per round in parallel"
        + (", one node sits out each round" if report.n % 2 else ""),
        f"  timing:    round {report.round_seconds:g} s"
        + (
            " (the agent's default --probe.round-seconds)"
            if report.round_seconds == ProbeSettings().round_seconds
            else ""
        )
        + f", probe {report.probe_seconds:g} s; "
        f"full cycle {report.cycle_rounds} x {report.round_seconds:g} s = "
        f"{report.cycle_seconds:g} s ({_duration(report.cycle_seconds)})",
        f"  evidence:  round r is planned from rounds <= r - {t.settle_rounds + 1}; "
        f"window {t.window_rounds} rounds",
        f"  fault:     {report.fault.describe()}",
    ]
    if report.fault.bad_link is not None:
        lines.append(
            "             (a link is exercised once per cycle: first seen up to "
            f"{report.cycle_rounds} rounds = {_duration(report.cycle_seconds)} after it breaks)"
        )
    simulated = {rec.round_no: rec for rec in report.rounds}
    shown = min(show_rounds, report.cycle_rounds)
    if shown > 0:
        lines.append(f"first {_plural(shown, 'round')} (host-guest):")
        for r in range(shown):
            rec = simulated.get(r)
            pairs = rec.pairs if rec is not None else plain_pairs(ms, r)
            lines.append(f"  round {r}: {_pairs_text(pairs)}")
    if report.first_seen_round is not None:
        lines.append("simulated rounds from the first failure:")
        after = [rec for rec in report.rounds if rec.round_no >= report.first_seen_round]
        for rec in after[:INVESTIGATION_SHOWN]:
            plain = set(plain_pairs(ms, rec.round_no))
            moved = [p for p in rec.pairs if p not in plain]
            failed = _pairs_text(rec.failed) if rec.failed else "none"
            lines.append(
                f"  round {rec.round_no}: failed {failed}; "
                f"{_plural(len(moved), 'pair')} off the circle"
                + (f" ({_pairs_text(moved)})" if moved else "")
            )
            lines.append(f"    verdict: {_verdict_text(rec.verdict)}")
        if len(after) > INVESTIGATION_SHOWN:
            lines.append(f"  ... {len(after) - INVESTIGATION_SHOWN} more rounds")
        lines.append(f"first seen:  round {report.first_seen_round}")
    elif report.fault.describe() != "none":
        lines.append("first seen:  never (the fault was not exercised)")
    if report.localised_round is not None and report.first_seen_round is not None:
        k = report.localised_round - report.first_seen_round
        lines.append(
            f"localised:   round {report.localised_round} "
            f"({_plural(k, 'round')} after the first failure; the verdict stands at the end "
            f"of that round, {_duration((k + 1) * report.round_seconds)} after the failing "
            f"round started)"
        )
    elif report.first_seen_round is not None:
        if report.n == 2:
            lines.append(
                "localised:   no: with only 2 members a bad node and a bad link cannot be told "
                "apart"
            )
        else:
            k = report.rounds[-1].round_no - report.first_seen_round
            lines.append(f"localised:   no, not within {_plural(k, 'round')} of the failure")
    else:
        lines.append(f"simulated:   {_plural(len(report.rounds), 'round')}, no failure")
    if report.wrong_blame:
        r, f = report.wrong_blame[0]
        lines.append(
            f"wrong blame: {len(report.wrong_blame)} (first in round {r}: {describe_finding(f)})"
        )
    elif report.first_seen_round is not None:
        lines.append("wrong blame: none (no other node or link was blamed in any round)")
    lines.append(f"verdict:     {_verdict_text(report.verdict)}")
    return "\n".join(lines)


# -- command line -------------------------------------------------------------------------------


#: what the simulation assumes unless told: the agent's own round length
#: (``--probe.round-seconds``) and a probe's length within it
DEFAULT_ROUND_SECONDS = ProbeSettings().round_seconds
DEFAULT_PROBE_SECONDS = 30.0


def _duration_arg(text: str) -> float:
    try:
        value = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    """No abbreviations; an error is one line (as every fabricscope command's)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="fabricscope probe plan",
        description="Simulate the cross-node probe schedule: rounds per cycle, wall time, "
        "and how fast a bad node or bad link among node0000..node<N-1> is localised.",
        allow_abbrev=False,
    )
    p.add_argument("--nodes", type=int, required=True, metavar="N", help="cluster size, >= 2")
    fault = p.add_mutually_exclusive_group()
    fault.add_argument("--bad-node", metavar="X", help="member whose every probe fails")
    fault.add_argument("--bad-link", metavar="X:Y", help="pair of members whose probe fails")
    p.add_argument(
        "--round-seconds",
        type=_duration_arg,
        default=DEFAULT_ROUND_SECONDS,
        metavar="DURATION",
        help="round length (default: the agent's --probe.round-seconds, "
        f"{format_duration(DEFAULT_ROUND_SECONDS)})",
    )
    p.add_argument(
        "--probe-seconds",
        type=_duration_arg,
        default=DEFAULT_PROBE_SECONDS,
        metavar="DURATION",
        help=f"how long a round's probes take (default: {format_duration(DEFAULT_PROBE_SECONDS)})",
    )
    p.add_argument(
        "--settle-rounds",
        type=int,
        default=TUNING.settle_rounds,
        help=f"rounds to wait for results to publish ({TUNING.settle_rounds})",
    )
    p.add_argument(
        "--window-rounds",
        type=int,
        default=TUNING.window_rounds,
        help=f"evidence window in rounds ({TUNING.window_rounds})",
    )
    p.add_argument("--show-rounds", type=int, default=3, help="rounds of pairs to print (3)")
    return p


def main_plan(argv: Sequence[str]) -> int:
    """``fabricscope probe plan``: parse ``argv``, simulate, print the plan. Argument errors
    exit with status 2 through argparse."""
    parser = _parser()
    args = parser.parse_args(list(argv))
    n: int = args.nodes
    if n < 2:
        parser.error(f"--nodes must be >= 2, got {n}")
    members = node_names(n)
    span = f"members are {members[0]}..{members[-1]}"
    bad_node: str | None = args.bad_node
    if bad_node is not None and bad_node not in members:
        parser.error(f"--bad-node {bad_node} is not a member: {span}")
    bad_link: tuple[str, str] | None = None
    if args.bad_link is not None:
        x, sep, y = str(args.bad_link).partition(":")
        if not sep or not x or not y:
            parser.error(f"--bad-link must be X:Y, got {args.bad_link!r}")
        for name in (x, y):
            if name not in members:
                parser.error(f"--bad-link: {name} is not a member: {span}")
        if x == y:
            parser.error(f"--bad-link needs two different members, got {x} twice")
        bad_link = (x, y)
    round_s: float = args.round_seconds
    probe_s: float = args.probe_seconds
    if not 0 < probe_s <= round_s:
        parser.error(
            f"need 0 < --probe-seconds <= --round-seconds (a round's probes run in parallel "
            f"within it), got {probe_s:g} and {round_s:g}"
        )
    try:
        tuning = Tuning(settle_rounds=args.settle_rounds, window_rounds=args.window_rounds)
    except ValueError as e:
        parser.error(str(e))
    report = simulate(n, bad_node, bad_link, round_s, probe_s, tuning=tuning)
    print(format_plan(report, show_rounds=max(0, args.show_rounds)))
    return 0
