"""One stream of the throughput sampler: a container's log or a plain file, and what its
lines made.

A :class:`Stream` is fed each line its tail reads (:mod:`agent.throughput.tail`): NCCL's own
lines go to its :class:`~agent.throughput.nccl_run.NcclRun`, the others to the throughput
formats (:mod:`agent.throughput.formats`), which leave, per format, the latest value of each
figure and the lines parsed. Lines written before the agent started (``count_from``, or the
first window of a plain file: ``history``) give values but are not counted. ``state`` and
``restore`` carry the values and counts to the supervised child that replaces one that died
(:class:`~agent.throughput.records.StreamResume`).

No log line is kept past its parse.
"""

from __future__ import annotations

import pickle
from collections import Counter
from dataclasses import dataclass, field

from agent.throughput.formats import MAX_PARSE_CHARS, parse_line, parse_window
from agent.throughput.linear import Pattern
from agent.throughput.nccl import parse_nccl_line
from agent.throughput.nccl_run import Admission, NcclRun
from agent.throughput.records import Labels
from agent.throughput.tail import FileTail


@dataclass(slots=True)
class Stream:
    labels: Labels
    cri: bool
    counts: Counter[str]
    tail: FileTail | None = None
    values: dict[str, dict[str, float]] = field(default_factory=dict)
    parsed: Counter[str] = field(default_factory=Counter)
    last_ts: float | None = None
    custom: Pattern | None = None
    custom_source: str | None = None
    custom_error: str | None = None
    parsed_this_poll: bool = False
    line_ts: float | None = None
    nccl: NcclRun = field(default_factory=NcclRun)
    #: lines written before this wall time (CRI timestamp) are history: not counted
    count_from: float | None = None
    #: every line read now is history (a plain file met in the agent's first pass)
    history: bool = False
    #: fed a line since its resume state was last taken
    dirty: bool = True

    def state(self) -> bytes:
        """Values and counts for :class:`~agent.throughput.records.StreamResume`."""
        nccl = self.nccl if self.nccl.heard else None
        return pickle.dumps(
            (self.values, dict(self.parsed), self.last_ts, self.line_ts, nccl),
            protocol=pickle.HIGHEST_PROTOCOL,
        )

    def restore(self, state: bytes, ib: Admission, hca: Admission) -> None:
        values, parsed, last_ts, line_ts, nccl = pickle.loads(state)
        self.values = values
        self.parsed = Counter(parsed)
        self.last_ts = last_ts
        self.line_ts = line_ts
        if isinstance(nccl, NcclRun):
            nccl.attach(ib, hca)
            self.nccl = nccl

    def _is_history(self, ts: float | None) -> bool:
        if self.history:
            return True
        return self.count_from is not None and ts is not None and ts < self.count_from

    def filterable(self) -> bool:
        """Only the lines that may matter need handing on (:mod:`agent.throughput.scan`):
        not when a custom regex, which may read any line, is set."""
        return self.custom is None

    def on_head_line(self, text: str, ts: float | None) -> None:
        """A line of the log's beginning, read once when the agent meets a log already past
        its initial window: what NCCL chose (version, HCA lists, channels, each process's
        GPU) is kept; its warnings and inits are not counted (they are history, and a
        counter that jumps at an agent's start would read as a burst) and no throughput is
        taken from it (stale)."""
        n = parse_nccl_line(text)
        if n is not None:
            self.dirty = True
            self.nccl.feed(n, ts, history=True)

    def on_line(self, text: str, ts: float | None) -> None:
        self.dirty = True
        history = self._is_history(ts)
        n = parse_nccl_line(text)
        if n is not None:  # NCCL's own line: it states no throughput
            self.nccl.feed(n, ts, history=history)
            return
        r = parse_line(text, self.custom)
        if r is None:
            if len(text) > MAX_PARSE_CHARS and parse_window(text) is None:
                self.counts["too_long_to_parse"] += 1
            return
        slot = self.values.setdefault(r.format, {})
        for name, v in r.values():
            slot[name] = v
        self.parsed[r.format] += 0 if history else 1
        self.parsed_this_poll = True
        if ts is not None:
            self.line_ts = ts

    def close(self) -> None:
        if self.tail is not None:
            self.tail.drop()
            self.tail = None
