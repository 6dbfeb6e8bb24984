"""Which lines of a read buffer are worth decoding: most of a busy log is neither a
throughput line nor one of NCCL's, and handing each of those to Python to decode, split and
try every parser on is what reading a log costs. :func:`next_line` finds, with one RE2 call
over the buffer, where the next line that may matter starts; the lines before it are
skipped without a Python operation each.

A line is skipped only when looking at it could change nothing: no parser could read it,
nothing would be counted for it. A line is looked at (handed on exactly as before) when it

- holds a parser's marker (:data:`MARKERS`): a literal every line its parser reads must
  contain (``Train throughput/`` for Composer's, ``NCCL`` for NCCL's own ...);
- holds a byte that is not ASCII (invalid UTF-8 is counted, and a marker may hide in
  other text);
- is longer than the shortest bound a longer line is counted against (``line_too_long``,
  ``too_long_to_parse``);
- in the kubelet's CRI format, is not a complete line (``<time> <stream> F <message>``):
  a partial ``P`` piece (joined with what follows), or a malformed line (``cri_parse``).

Lines a custom regex (a pod's annotation) may read cannot be told apart: a stream with one
hands on every line (the caller decides, :class:`agent.throughput.lines.LineSplitter`).
The markers are a superset test, never the parse: a line they let through is parsed in full.
"""

from __future__ import annotations

import functools

from agent.throughput.formats import MAX_PARSE_CHARS
from agent.throughput.linear import LineScan, compile_line_scan

#: per parser (the ``format`` names of :mod:`agent.throughput.formats`, and ``nccl`` for
#: :func:`agent.throughput.nccl.parse_nccl_line`): RE2 pieces one of which every line it
#: reads contains (each parser's own first test, or a literal its patterns require)
MARKERS: dict[str, tuple[bytes, ...]] = {
    "composer": (rb"Train throughput/",),
    "megatron": (rb"elapsed time per iteration \(ms\)",),
    "deepspeed": (rb"SamplesPerSec", rb"samples/sec"),
    "torchtitan": (rb"tps: ",),
    "hf_trainer": (rb"_per_second", rb"it/s", rb"s/it"),
    "lightning": (rb"it/s", rb"s/it"),
    # nanoGPT's "iter N: loss", modded-nanogpt's "step_avg:", llm.c's "<N> ms |"
    "nanogpt": (rb"iter \d+: loss ", rb"step_avg:", rb" ms \|"),
    "nccl": (rb"NCCL",),
}

#: a line that is not ``<time> <stream> F`` followed by a space or its end (split on
#: spaces as :class:`~agent.throughput.lines.LineSplitter` does): fewer than two spaces, or
#: a third field other than exactly ``F``
_NOT_CRI_F = rb"[^ \n]*(?: [^ \n]*)?\n|[^ \n]* [^ \n]* (?:\n|[^F\n]|F[^ \n])"


@functools.cache
def _scanner(cri: bool) -> LineScan:
    marked = b"|".join(sorted({m for ms in MARKERS.values() for m in ms}))
    look = rb"[^\n]*?(?:" + marked + rb"|[\x80-\xff])"
    return compile_line_scan(rb"(?m)^(?:" + (_NOT_CRI_F + b"|" if cri else b"") + look + b")")


def long_line_bytes(max_line_bytes: int) -> int:
    """Lines longer than this (bytes) are looked at: they are counted as too long to keep
    (``max_line_bytes``) or to parse (:data:`MAX_PARSE_CHARS` characters, never more
    bytes)."""
    return min(max_line_bytes, MAX_PARSE_CHARS)


def _first_long(data: bytes, pos: int, stop: int, long: int) -> int:
    """The start of the first line in ``data[pos:stop]`` (whole lines) longer than
    ``long`` bytes, or ``stop``. Each step jumps to the last newline within ``long`` bytes:
    a few C-level searches per buffer, not one per line."""
    while stop - pos > long:
        last = data.rfind(b"\n", pos, pos + long + 1)
        if last < 0:
            return pos
        pos = last + 1
    return stop


def next_line(data: bytes, pos: int, end: int, *, cri: bool, long: int) -> int:
    """Where the first line in ``data[pos:end]`` worth a closer look starts (see the module
    docstring), or ``end`` when none is. ``pos`` starts a line; ``data[end - 1]`` is a
    newline (only whole lines are scanned). ``long``: :func:`long_line_bytes`."""
    if pos >= end:
        return pos
    found = _scanner(cri).next_start(data, pos, end)
    if found - pos > long:
        found = _first_long(data, pos, found, long)
    return found
