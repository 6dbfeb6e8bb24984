"""Bad-node / bad-link localisation from the shared outcomes of cross-node probes.

Each agent publishes the outcome of its own probes, and every agent reads everyone's
(:class:`Outcome`: round, the two nodes, ok), so every agent reaches the same verdict.

A probe that fails or falls below its baseline is an ``ok=False`` outcome (the runner
decides that; this module only reads the boolean). A pass proves both of its nodes fine; a
failure means the host, the guest or the link between them is bad. Because every node meets
a new partner every round, a bad node fails every round, and its partners pass with
everyone else, so two rounds of the plain schedule already separate it (:func:`localise`):

- **bad node** X: in a run of consecutive failures (no pass in between), X failed with at
  least 2 distinct partners that are each healthy without X (their newest outcome, ignoring
  failures with X or with nodes bad at the time, is a pass) and whose pairs with X failed
  nowhere else in the window (a pair failing again after X passed points at a link). If the
  run is still going, X is bad now; if X passed since, X was bad then and was repaired:
  either way those failures are explained and blame no link;
- **bad link** X:Y: X-Y failed at least twice since it last passed, and after the first of
  those failures X passed with someone other than Y, and Y with someone other than X (their
  other repeatedly failing pairs aside). The second failure is a deliberate retest, so a
  one-off timeout is not blamed on a link;
- **unknown**: any other failure not explained by the above (still under investigation);
  with only 2 members it is **node_or_link**: a bad node and a bad link cannot be told apart.

:func:`assess` also says what the schedule needs (:class:`Assessment`: suspects, good
referees, retests); :mod:`agent.probe.schedule.pairing` plans rounds from it.

Limits: a window edge can cut a repaired node's failure run and leave a one-round unknown;
a node with several bad links may read as a bad node for the round in which two of them
fail in a row.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from agent.probe.schedule.circle import members_of

__all__ = [
    "TUNING",
    "Assessment",
    "Finding",
    "FindingKind",
    "Outcome",
    "Tuning",
    "Verdict",
    "assess",
    "localise",
]


@dataclass(frozen=True, slots=True)
class Outcome:
    """One published probe result. Both sides of a probe may publish it; if their reports
    disagree, the probe counts as failed. ``ok`` is False for a failure and for a result below
    its baseline."""

    round_no: int
    a: str
    b: str
    ok: bool

    def __post_init__(self) -> None:
        if self.a == self.b:
            raise ValueError(f"an outcome needs two nodes, got {self.a!r} twice")


@dataclass(frozen=True, slots=True)
class Tuning:
    """How the schedule reads the shared evidence. Every agent must use the same values."""

    settle_rounds: int = 1
    """Rounds whose results may still be unpublished when a round starts: round r is planned
    from rounds <= r - 1 - settle_rounds. 0 is enough when results are visible to everyone
    within round_seconds - probe_seconds."""
    window_rounds: int = 32
    """Outcomes older than this many rounds are ignored, so a repaired fault stops being
    blamed. At least 2 * (settle_rounds + 2)."""

    def __post_init__(self) -> None:
        if self.settle_rounds < 0:
            raise ValueError(f"settle_rounds must be >= 0, got {self.settle_rounds}")
        if self.window_rounds < 2 * (self.settle_rounds + 2):
            raise ValueError(
                f"window_rounds must be >= 2 * (settle_rounds + 2) = "
                f"{2 * (self.settle_rounds + 2)}, got {self.window_rounds}"
            )

    @property
    def refresh_rounds(self) -> int:
        """A confirmed bad link whose newest failure is this many rounds old is retested, so
        two of its failures stay inside the window and the verdict holds until it is fixed."""
        return max(1, self.window_rounds // 2 - self.settle_rounds - 1)


TUNING = Tuning()


class FindingKind(StrEnum):
    BAD_NODE = "bad_node"
    BAD_LINK = "bad_link"
    NODE_OR_LINK = "node_or_link"
    """Only 2 members: a bad node and a bad link between them cannot be told apart."""
    UNKNOWN = "unknown"
    """A failure not (yet) explained by a bad node or a bad link."""


_KIND_ORDER = {k: i for i, k in enumerate(FindingKind)}


@dataclass(frozen=True, slots=True)
class Finding:
    kind: FindingKind
    nodes: tuple[str, ...]
    """The bad node (1 name), or the two ends of the link / failing pair, sorted."""
    partners: tuple[str, ...]
    """For a bad node: the healthy partners it failed with; empty otherwise."""
    failed_rounds: tuple[int, ...]
    """Rounds of the failures this finding rests on, ascending."""


@dataclass(frozen=True, slots=True)
class Verdict:
    findings: tuple[Finding, ...]
    """Sorted: bad nodes, bad links, node-or-link, unknown; then by name."""

    @property
    def clean(self) -> bool:
        """No finding: no failure in the window, or only failures of a node since repaired."""
        return not self.findings

    @property
    def bad_nodes(self) -> tuple[str, ...]:
        return tuple(f.nodes[0] for f in self.findings if f.kind is FindingKind.BAD_NODE)

    @property
    def bad_links(self) -> tuple[tuple[str, str], ...]:
        return tuple(
            (f.nodes[0], f.nodes[1]) for f in self.findings if f.kind is FindingKind.BAD_LINK
        )

    @property
    def unresolved(self) -> tuple[Finding, ...]:
        """Findings that blame nothing yet: unknown and node-or-link."""
        return tuple(
            f for f in self.findings if f.kind in (FindingKind.UNKNOWN, FindingKind.NODE_OR_LINK)
        )


@dataclass(frozen=True, slots=True)
class Assessment:
    """Everything the evidence up to round ``upto`` says: the verdict, and what the schedule
    of a later round needs. Built by :func:`assess`."""

    members: tuple[str, ...]
    upto: int
    verdict: Verdict
    good: frozenset[str]
    """Not judged bad, newest unexplained outcome a pass: fit to referee a suspect."""
    suspects: tuple[str, ...]
    """Newest unexplained outcome a failure; in rank order."""
    failed_with: Mapping[str, frozenset[str]]
    """For each suspect: the partners it failed with since its last pass."""
    retests: tuple[tuple[str, str], ...]
    """Pairs to probe directly: failed once with both ends passing since, or a confirmed bad
    link whose evidence is getting old."""
    bad_link_pairs: frozenset[frozenset[str]]


_Entry = tuple[int, str, bool]  # round, partner, ok
_Key = tuple[str, str]  # a pair of members, sorted


def _key(a: str, b: str) -> _Key:
    return (a, b) if a < b else (b, a)


def _failure_runs(entries: Sequence[_Entry]) -> list[list[_Entry]]:
    """Maximal runs of consecutive failures in a node's round-ordered history."""
    runs: list[list[_Entry]] = []
    run: list[_Entry] = []
    for e in entries:
        if e[2]:
            if run:
                runs.append(run)
                run = []
        else:
            run.append(e)
    if run:
        runs.append(run)
    return runs


def _healthy_without(
    entries: Sequence[_Entry], suspect: str, was_bad: set[tuple[int, str]]
) -> bool:
    """The newest outcome that is not a failure with ``suspect`` or with a node that was bad
    at the time is a pass."""
    for round_no, partner, ok in reversed(entries):
        if not ok and (partner == suspect or (round_no, partner) in was_bad):
            continue
        return ok
    return False


def _cleared_after(
    entries: Sequence[_Entry],
    first_fail: int,
    other: str,
    excused: set[str],
    was_bad: set[tuple[int, str]],
) -> bool:
    """Ignoring ``other``, failures with ``excused`` partners (repeatedly failing pairs) and
    failures with nodes bad at the time, the newest outcome is a pass after ``first_fail``."""
    for round_no, partner, ok in reversed(entries):
        if partner == other or (not ok and (partner in excused or (round_no, partner) in was_bad)):
            continue
        return ok and round_no > first_fail
    return False


def _first_pass_after(entries: Sequence[_Entry], first_fail: int, other: str) -> int:
    for round_no, partner, ok in entries:
        if ok and round_no > first_fail and partner != other:
            return round_no
    raise ValueError("no pass after the failure")  # callers check _cleared_after first


def _due(upto: int, since: int, tuning: Tuning) -> bool:
    """A retest that became due once round ``since`` was judged is planned from the judgements
    of rounds since, since + settle + 1, ...: the planner of the next settle_rounds rounds
    cannot see the retest's result yet, and must not repeat it."""
    return upto >= since and (upto - since) % (tuning.settle_rounds + 1) == 0


def _sort_findings(findings: Iterable[Finding], rank: Mapping[str, int]) -> tuple[Finding, ...]:
    return tuple(
        sorted(findings, key=lambda f: (_KIND_ORDER[f.kind], tuple(rank[x] for x in f.nodes)))
    )


def assess(
    members: Sequence[str],
    observations: Iterable[Outcome],
    *,
    upto: int,
    tuning: Tuning = TUNING,
) -> Assessment:
    """Judge the outcomes of rounds ``upto - window_rounds + 1 .. upto`` between members.

    Outcomes of later rounds, of older rounds and of non-members are ignored, so agents that
    already see more results than others still agree. Pure and deterministic.

    A node's history splits into runs of consecutive failures. A run in which the node failed
    with 2 distinct partners that are healthy without it (and whose pairs with it failed
    nowhere else in the window, which would point at a link) means the node was bad during
    that run: those failures are explained, and if the run is still going the node is bad.
    The fixpoint matters because a node found bad excuses its partners' failures.
    """
    ms = members_of(members)
    rank = {m: i for i, m in enumerate(ms)}
    lo = upto - tuning.window_rounds + 1
    merged: dict[tuple[int, str, str], bool] = {}
    for o in observations:
        if o.round_no < lo or o.round_no > upto or o.a not in rank or o.b not in rank:
            continue
        key = (o.round_no, *_key(o.a, o.b))
        merged[key] = merged.get(key, True) and o.ok
    if all(merged.values()):
        seen = frozenset(x for _, a, b in merged for x in (a, b))
        return Assessment(ms, upto, Verdict(()), seen, (), {}, (), frozenset())

    history: dict[str, list[_Entry]] = {}
    pair_history: dict[_Key, list[tuple[int, bool]]] = {}
    for (round_no, a, b), ok in sorted(merged.items()):
        history.setdefault(a, []).append((round_no, b, ok))
        history.setdefault(b, []).append((round_no, a, ok))
        pair_history.setdefault((a, b), []).append((round_no, ok))
    pair_fails = {
        k: {r for r, ok in ph if not ok}
        for k, ph in pair_history.items()
        if not all(o for _, o in ph)
    }

    # bad nodes, now and earlier in the window
    runs = {x: _failure_runs(history[x]) for x in ms if x in history}
    was_bad: set[tuple[int, str]] = set()  # (round, node): the node was bad in that round
    qualified: set[tuple[str, int]] = set()
    changed = True
    while changed:
        changed = False
        for x in ms:
            for k, run in enumerate(runs.get(x, ())):
                if (x, k) in qualified:
                    continue
                rounds = {r for r, _, _ in run}
                if len(_run_partners(x, run, rounds, pair_fails, history, was_bad)) >= 2:
                    qualified.add((x, k))
                    was_bad.update((r, x) for r in rounds)
                    changed = True
    bad = {x for x in ms if (x, len(runs.get(x, ())) - 1) in qualified and not history[x][-1][2]}
    findings: list[Finding] = []
    for x in bad:
        run = runs[x][-1]
        rounds = {r for r, _, _ in run}
        partners = _run_partners(x, run, rounds, pair_fails, history, was_bad)
        findings.append(
            Finding(
                FindingKind.BAD_NODE,
                (x,),
                tuple(sorted(partners, key=rank.__getitem__)),
                tuple(sorted(rounds)),
            )
        )

    # links: failures since the pair last passed that no bad node explains
    recent: dict[_Key, list[int]] = {}
    for (a, b), ph in pair_history.items():
        if (a, b) not in pair_fails or a in bad or b in bad:
            continue
        fails: list[int] = []
        for r, ok in reversed(ph):
            if ok:
                break
            if (r, a) not in was_bad and (r, b) not in was_bad:
                fails.append(r)
        if fails:
            recent[(a, b)] = sorted(fails)
    repeated: dict[str, set[str]] = {}
    for (a, b), fails in recent.items():
        if len(fails) >= 2:
            repeated.setdefault(a, set()).add(b)
            repeated.setdefault(b, set()).add(a)
    links: set[frozenset[str]] = set()
    link_newest: dict[_Key, int] = {}
    pending: list[_Key] = []
    unresolved_kind = FindingKind.NODE_OR_LINK if len(ms) == 2 else FindingKind.UNKNOWN
    for (a, b), fails in recent.items():
        cleared = _cleared_after(
            history[a], fails[0], b, repeated.get(a, set()), was_bad
        ) and _cleared_after(history[b], fails[0], a, repeated.get(b, set()), was_bad)
        if cleared and len(fails) >= 2:
            links.add(frozenset((a, b)))
            link_newest[(a, b)] = fails[-1]
            findings.append(Finding(FindingKind.BAD_LINK, (a, b), (), tuple(fails)))
            continue
        if cleared:
            since = max(
                _first_pass_after(history[a], fails[0], b),
                _first_pass_after(history[b], fails[0], a),
            )
            if _due(upto, since, tuning):
                pending.append((a, b))
        findings.append(Finding(unresolved_kind, (a, b), (), tuple(fails)))

    # node status for the schedule: failures with bad nodes and on bad links are explained
    good: set[str] = set()
    suspects: list[str] = []
    failed_with: dict[str, frozenset[str]] = {}
    for x in ms:
        if x in bad or x not in history:
            continue
        newest: bool | None = None
        for round_no, partner, ok in reversed(history[x]):
            if not ok and ((round_no, partner) in was_bad or frozenset((x, partner)) in links):
                continue
            newest = ok
            break
        if newest is True:
            good.add(x)
        elif newest is False:
            suspects.append(x)
            failed_with[x] = frozenset(p for _, p, _ in runs[x][-1])
    stale = [
        pair
        for pair, newest_fail in link_newest.items()
        if _due(upto, newest_fail + tuning.refresh_rounds, tuning)
    ]
    retests = tuple(sorted(pending + stale, key=lambda p: (rank[p[0]], rank[p[1]])))
    return Assessment(
        members=ms,
        upto=upto,
        verdict=Verdict(_sort_findings(findings, rank)),
        good=frozenset(good),
        suspects=tuple(suspects),
        failed_with=failed_with,
        retests=retests,
        bad_link_pairs=frozenset(links),
    )


def _run_partners(  # noqa: PLR0917
    x: str,
    run: Sequence[_Entry],
    rounds: set[int],
    pair_fails: Mapping[_Key, set[int]],
    history: Mapping[str, Sequence[_Entry]],
    was_bad: set[tuple[int, str]],
) -> set[str]:
    """Partners of ``x`` in a failure run that are healthy without ``x`` and whose pair with
    ``x`` failed only inside this run."""
    out: set[str] = set()
    for _, p, _ in run:
        if p in out or not pair_fails[_key(x, p)] <= rounds:
            continue
        if _healthy_without(history[p], x, was_bad):
            out.add(p)
    return out


def localise(
    members: Sequence[str],
    observations: Iterable[Outcome],
    *,
    upto: int | None = None,
    tuning: Tuning = TUNING,
) -> Verdict:
    """The verdict as of the end of round ``upto`` (default: the newest observed round)."""
    obs = tuple(observations)
    if upto is None:
        if not obs:
            return Verdict(())
        upto = max(o.round_no for o in obs)
    return assess(members, obs, upto=upto, tuning=tuning).verdict
