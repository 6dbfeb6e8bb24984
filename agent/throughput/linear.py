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
    return cast(Pattern, rx)


def _reason(exc: BaseException) -> str:
    raw = exc.args[0] if exc.args else exc
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    text = "".join(c if c.isprintable() else "?" for c in " ".join(text.split()))
    return text if len(text) <= 200 else text[:197] + "..."
