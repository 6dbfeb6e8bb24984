"""Linear-time regular expressions for untrusted text: the one place ``re2`` is imported.

Log lines and pod annotations are written by whoever runs a pod on the node. Python's
``re`` backtracks: ``\\d+ms`` searched in 60,000 digits without ``ms`` costs seconds
(every start position rescans the digits), and a tenant's ``^(?:a+)+x$`` doubles its cost
with each character, all while holding the GIL. RE2 (Google's engine, ``google-re2`` on
PyPI) runs every pattern it accepts in time linear in the text, and refuses what it cannot
run that way (backreferences, lookaround) when the pattern is compiled, not when a line
arrives. Every parser of untrusted text compiles its patterns here.

:func:`compile_linear` refuses a pattern whose compiled program is larger than
:data:`MAX_PROGRAM_SIZE` instructions (RE2 falls back to a simulation whose cost per byte
grows with the program when its DFA cache overflows) and never lets RE2 write the pattern
to stderr (a tenant's text in the agent's log). :class:`Pattern` and :class:`Match` type the
subset of the ``re``-like interface the parsers use.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol, cast

import re2

#: the largest compiled program accepted (RE2 instructions; a typical throughput pattern
#: compiles to 20-120, a tenant's custom regex of a few dozen characters to under 100)
MAX_PROGRAM_SIZE = 2000
#: memory RE2 may use for one pattern's compiled forms and DFA cache, in bytes
MAX_MEM_BYTES = 8 << 20


class Match(Protocol):
    def group(self, index: int | str = 0, /) -> str | None: ...

    def groupdict(self) -> dict[str, str | None]: ...

    def groups(self) -> tuple[str | None, ...]: ...

    def start(self, index: int = 0, /) -> int: ...

    def end(self, index: int = 0, /) -> int: ...


class Pattern(Protocol):
    @property
    def pattern(self) -> str: ...

    @property
    def groupindex(self) -> Mapping[str, int]: ...

    @property
    def programsize(self) -> int: ...

    def search(
        self, text: str, pos: int | None = None, endpos: int | None = None
    ) -> Match | None: ...

    def match(
        self, text: str, pos: int | None = None, endpos: int | None = None
    ) -> Match | None: ...

    def finditer(
        self, text: str, pos: int | None = None, endpos: int | None = None
    ) -> Iterator[Match]: ...

    def groups_at(self, text: str, pos: int) -> tuple[str | None, ...] | None: ...


class NotLinear(ValueError):  # noqa: N818 - a pattern that is refused, with the reason
    """RE2 cannot compile the pattern (or it is too large); the message is one line."""


def _options() -> object:
    opts = re2.Options()
    opts.log_errors = False
    opts.max_mem = MAX_MEM_BYTES
    return opts


_OPTIONS = _options()


def compile_linear(pattern: str) -> Pattern:
    """``pattern`` compiled by RE2; :class:`NotLinear` saying why when it cannot be."""
    try:
        rx = re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        raise NotLinear(_reason(exc)) from None
    size = int(rx.programsize)
    if size > MAX_PROGRAM_SIZE:
        raise NotLinear(f"compiles to {size} instructions (at most {MAX_PROGRAM_SIZE})")
    return _Ascii(rx)


_UNANCHORED = re2._Anchor.UNANCHORED
_ANCHOR_START = re2._Anchor.ANCHOR_START
_NO_SPAN = (-1, -1)


class _AsciiMatch:
    """A match in ASCII text: byte offsets are character offsets."""

    __slots__ = ("_index", "_spans", "_text")

    def __init__(self, text: str, spans: tuple[tuple[int, int], ...], index: Mapping[str, int]):
        self._text = text
        self._spans = spans
        self._index = index

    def group(self, index: int | str = 0, /) -> str | None:
        i = self._index[index] if isinstance(index, str) else index
        start, end = self._spans[i]
        return None if start < 0 else self._text[start:end]

    def groupdict(self) -> dict[str, str | None]:
        return {name: self.group(i) for name, i in self._index.items()}

    def groups(self) -> tuple[str | None, ...]:
        return tuple(self.group(i) for i in range(1, len(self._spans)))

    def start(self, index: int = 0, /) -> int:
        return self._spans[index][0]

    def end(self, index: int = 0, /) -> int:
        return self._spans[index][1]


class _Ascii:
    """A compiled pattern, called straight through RE2's binding for ASCII text (a log line
    almost always is): the ``re``-like wrapper of google-re2 re-encodes the text and maps
    offsets on every call, five times the cost of the match itself on a short line. Other
    text goes through that wrapper (linear as well)."""

    __slots__ = ("_re2", "_rx", "groupindex", "pattern", "programsize")

    def __init__(self, compiled: object) -> None:
        self._re2 = cast(Pattern, compiled)
        self._rx = compiled._regexp  # type: ignore[attr-defined]
        self.pattern: str = self._re2.pattern
        self.groupindex: Mapping[str, int] = dict(self._re2.groupindex)
        self.programsize: int = self._re2.programsize

    def _at(self, anchor: object, text: str, pos: int, endpos: int) -> _AsciiMatch | None:
        spans = self._rx.Match(anchor, text.encode("ascii"), pos, endpos)
        if spans[0] == _NO_SPAN:
            return None
        return _AsciiMatch(text, spans, self.groupindex)

    def search(self, text: str, pos: int | None = None, endpos: int | None = None) -> Match | None:
        if not text.isascii():
            return self._re2.search(text, pos, endpos)
        return self._at(_UNANCHORED, text, pos or 0, len(text) if endpos is None else endpos)

    def match(self, text: str, pos: int | None = None, endpos: int | None = None) -> Match | None:
        if not text.isascii():
            return self._re2.match(text, pos, endpos)
        return self._at(_ANCHOR_START, text, pos or 0, len(text) if endpos is None else endpos)

    def groups_at(self, text: str, pos: int) -> tuple[str | None, ...] | None:
        """The groups of a match starting exactly at ``pos`` (None: no match there): the
        parsers' hot path, one RE2 call and no match object."""
        if not text.isascii():
            m = self._re2.match(text, pos)
            return None if m is None else m.groups()
        spans = self._rx.Match(_ANCHOR_START, text.encode("ascii"), pos, len(text))
        if spans[0] == _NO_SPAN:
            return None
        return tuple(None if a < 0 else text[a:b] for a, b in spans[1:])

    def finditer(
        self, text: str, pos: int | None = None, endpos: int | None = None
    ) -> Iterator[Match]:
        if not text.isascii():
            yield from self._re2.finditer(text, pos, endpos)
            return
        data = text.encode("ascii")
        at = pos or 0
        end = len(text) if endpos is None else endpos
        while at <= end:
            spans = self._rx.Match(_UNANCHORED, data, at, end)
            if spans[0] == _NO_SPAN:
                return
            yield _AsciiMatch(text, spans, self.groupindex)
            at = spans[0][1] if spans[0][1] > at else at + 1


def _reason(exc: BaseException) -> str:
    raw = exc.args[0] if exc.args else exc
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    text = "".join(c if c.isprintable() else "?" for c in " ".join(text.split()))
    return text if len(text) <= 200 else text[:197] + "..."


class LineScan:
    """A pattern over bytes (Latin-1: one byte, one character) that finds where in a
    buffer of whole lines the next line worth a closer look starts: one RE2 call over the
    buffer, no match object (:mod:`agent.throughput.scan`)."""

    __slots__ = ("_rx", "pattern")

    def __init__(self, compiled: object, pattern: bytes) -> None:
        self._rx = compiled._regexp  # type: ignore[attr-defined]
        self.pattern = pattern

    def next_start(self, data: bytes, pos: int, endpos: int) -> int:
        """Where the first match in ``data[pos:endpos]`` starts, or ``endpos`` when none."""
        spans = self._rx.Match(_UNANCHORED, data, pos, endpos)
        return endpos if spans[0] == _NO_SPAN else int(spans[0][0])


def compile_line_scan(pattern: bytes) -> LineScan:
    """``pattern`` (bytes, Latin-1, our own: never a tenant's) compiled by RE2 for
    :class:`LineScan`; :class:`NotLinear` when it cannot be, or is too large."""
    opts = re2.Options()
    opts.log_errors = False
    opts.max_mem = MAX_MEM_BYTES
    opts.encoding = re2.Options.Encoding.LATIN1
    opts.never_capture = True
    try:
        rx = re2.compile(pattern, opts)
    except re2.error as exc:
        raise NotLinear(_reason(exc)) from None
    if int(rx.programsize) > MAX_PROGRAM_SIZE:
        raise NotLinear(f"compiles to {rx.programsize} instructions (at most {MAX_PROGRAM_SIZE})")
    return LineScan(rx, pattern)
