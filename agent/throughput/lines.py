"""Bytes in, lines out: :class:`LineSplitter` cuts what a tail read into complete lines in
bounded memory (a line longer than its bound is skipped to its end, never kept whole) and
decodes the kubelet's CRI log format (``<RFC3339Nano> <stream> <P|F> <message>``: ``P``
pieces joined until the ``F`` piece, within the same bound); :func:`parse_cri_timestamp`
reads a CRI line's time. Invalid UTF-8 is counted and decoded with replacement characters.
A splitter given ``filtered`` hands on only the lines that may matter to its sink
(:mod:`agent.throughput.scan`), skipping the rest of a buffer without decoding them.
Nothing here keeps a line beyond handing it on."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from datetime import datetime

#: lines in a row that a filtered splitter's scan finds worth reading before it stops scanning
#: the rest of the buffer (every line is read then, as without a filter: the same result)
DENSE = 8
#: (text, CRI timestamp in seconds or None for plain files)
LineSink = Callable[[str, float | None], None]


def parse_cri_timestamp(raw: bytes) -> float | None:
    """Seconds since the epoch of a CRI log timestamp (``2024-04-06T02:55:45.123456789Z``
    or with a ``+hh:mm`` offset); None when it is not one (a longer field than any RFC 3339
    timestamp is refused before it is looked at: the field is a pod's text)."""
    if len(raw) > 64:
        return None
    # the kubelet's own form, UTC with nanoseconds: the second from a small cache (lines of
    # one second share it), the fraction as an integer; every other form below
    if len(raw) > 21 and raw[19:20] == b"." and raw[-1:] == b"Z" and raw[20:-1].isdigit():
        second = _utc_second(raw[:19])
        if second is not None:
            return second + int(raw[20:-1][:6].ljust(6, b"0")) / 1e6
    text = raw.decode("ascii", errors="replace")
    if "." in text:
        head, _, rest = text.partition(".")
        digits = ""
        for i, ch in enumerate(rest):
            if not ch.isdigit():
                tz = rest[i:]
                break
            digits += ch
        else:
            tz = ""
        text = f"{head}.{(digits + '000000')[:6]}{tz}"
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@functools.lru_cache(maxsize=256)
def _utc_second(raw: bytes) -> float | None:
    """``2024-04-06T02:55:45`` (UTC) as seconds since the epoch; None when it is not one."""
    if raw[10:11] != b"T":
        return None
    try:
        return datetime.fromisoformat(raw.decode("ascii") + "+00:00").timestamp()
    except (ValueError, UnicodeDecodeError):
        return None


class LineSplitter:
    """Bytes in, complete lines out, in bounded memory; decodes CRI when asked."""

    __slots__ = (
        "_buf",
        "_counts",
        "_cri",
        "_cri_buf",
        "_cri_raw",
        "_cri_skip",
        "_filtered",
        "_long",
        "_max",
        "_next_line",
        "_sink",
        "_skip",
    )

    def __init__(
        self,
        sink: LineSink,
        counts: Counter[str],
        *,
        cri: bool,
        max_line_bytes: int,
        filtered: Callable[[], bool] | None = None,
    ) -> None:
        """``max_line_bytes``: longest line (a CRI message joined from its pieces) kept;
        longer ones are skipped and counted as ``line_too_long``. ``filtered``: asked once
        per buffer fed; True: the sink is handed only the lines that may matter to a
        throughput stream (:func:`agent.throughput.scan.next_line`: every count and every
        line a parser reads stay the same), the others are skipped undecoded. None: every
        line."""
        self._sink = sink
        self._filtered = filtered
        self._long = max_line_bytes
        if filtered is not None:
            # imported here: the scan's RE2 is the reading child's, never the agent's
            from agent.throughput.scan import long_line_bytes, next_line

            self._long = long_line_bytes(max_line_bytes)
            self._next_line = next_line
        self._counts = counts
        self._cri = cri
        self._max = max_line_bytes
        self._buf = bytearray()
        self._skip = False  # inside an over-long raw line: drop bytes until its newline
        self._cri_buf = bytearray()
        self._cri_raw = 0  # raw bytes (with newlines) of the P pieces in _cri_buf
        self._cri_skip = False  # inside an over-long CRI message: drop pieces until F

    def reset(self) -> None:
        """Forget a partial line (after a truncation: its rest is gone)."""
        self._buf.clear()
        self._skip = False
        self._cri_buf.clear()
        self._cri_raw = 0
        self._cri_skip = False

    @property
    def skipping(self) -> bool:
        """Inside an over-long raw line: bytes up to its newline are dropped."""
        return self._skip

    def pending_bytes(self) -> int:
        """Bytes fed that belong to a line not handed on yet (a partial line, the pieces of
        a CRI message waiting for its F piece): a reader resuming elsewhere starts that many
        bytes before the end of what was fed."""
        if self._skip:
            return 0
        return len(self._buf) + (0 if self._cri_skip else self._cri_raw)

    def skip_to_next_line(self) -> None:
        """Start mid-file: the bytes up to the next newline are the tail of a line not read."""
        self._buf.clear()
        self._skip = True

    def feed(self, data: bytes) -> None:
        start = 0
        limit = self._max
        # with a filter: the end of the buffer's whole lines, which are scanned
        end = data.rfind(b"\n") + 1 if self._filtered is not None and self._filtered() else 0
        hits = 0  # lines in a row the scan found at once: past DENSE, this buffer is all read
        while True:
            if start < end and not (self._buf or self._skip or self._cri_buf or self._cri_skip):
                found = self._next_line(data, start, end, cri=self._cri, long=self._long)
                hits = hits + 1 if found == start else 0
                if hits > DENSE:  # a log of nothing but throughput lines: scanning costs
                    end = 0
                start = found
            nl = data.find(b"\n", start)
            if nl < 0:
                rest = len(data) - start
                if self._skip or rest == 0:
                    return
                if len(self._buf) + rest > limit:
                    self._counts["line_too_long"] += 1
                    self._buf.clear()
                    self._skip = True
                    return
                self._buf += data[start:]
                return
            if self._skip:
                self._skip = False
            elif self._buf:
                if len(self._buf) + nl - start > limit:
                    self._counts["line_too_long"] += 1
                else:
                    self._buf += data[start:nl]
                    self._line(bytes(self._buf))
                self._buf.clear()
            elif nl - start > limit:
                self._counts["line_too_long"] += 1
            else:
                self._line(data[start:nl])
            start = nl + 1

    def _line(self, raw: bytes) -> None:
        if not self._cri:
            self._emit(raw, None)
            return
        parts = raw.split(b" ", 3)
        if len(parts) < 3 or parts[2] not in (b"P", b"F"):
            self._counts["cri_parse"] += 1
            return
        msg = parts[3] if len(parts) == 4 else b""
        if parts[2] == b"P":
            if self._cri_skip:
                return
            if len(self._cri_buf) + len(msg) > self._max:
                self._counts["line_too_long"] += 1
                self._cri_buf.clear()
                self._cri_raw = 0
                self._cri_skip = True
                return
            self._cri_buf += msg
            self._cri_raw += len(raw) + 1
            return
        if self._cri_skip:  # the F piece ends the over-long message
            self._cri_skip = False
            return
        if self._cri_buf:
            self._cri_raw = 0
            if len(self._cri_buf) + len(msg) > self._max:
                self._counts["line_too_long"] += 1
                self._cri_buf.clear()
                return
            self._cri_buf += msg
            msg = bytes(self._cri_buf)
            self._cri_buf.clear()
        self._emit(msg, parse_cri_timestamp(parts[0]))

    def _emit(self, raw: bytes, ts: float | None) -> None:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            self._counts["invalid_utf8"] += 1
            text = raw.decode("utf-8", errors="replace")
        self._sink(text, ts)
