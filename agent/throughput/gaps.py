"""Estimates of log bytes lost to rotated files deleted before the tailer could list them.

A log rotated several times between two passes, with the rotated files deleted as fast (a
writer keeping few of them), leaves files that lived and died between two listings: nothing
of them is left to read or measure. What is left is the files' birth times: each file of a
rotated log is created when the one before it is renamed, so the rotated files the tailer
*does* see form a chain in which a missing link shows as a time gap between the end of one
file's life and the next file's birth. A file's life ends at its rename: the rename sets its
status-change time (ctime), which only a later write (a writer's last lines before it
reopens the path) or a change of its owner or mode moves on. :class:`GapEstimator` walks that
chain, file by file, in the order the tailer meets them, and prices each gap at the writer's
own rate (bytes per second over the lives of the files it has seen whole, birth to ctime):
that many bytes, and lines at the mean line length the tailer has read, are counted as
missed. A life includes the time a file sat idle before its rename, so a writer that prints
in bursts and idles until its rotation is priced at its mean rate, idle time included: the
estimate is unbiased for a writer whose pattern holds over the gap. (Priced from the last
write instead, as first built, such a log was over-counted by the ratio of its life to its
bursts.) A rotated file whose mode or owner is changed after its rename (a post-rotate
script) ends its life late: the gap after it looks shorter and is under-counted. The file
the tailer held open may have been deleted by the time it is finished (its ctime is then the
deletion): its end is taken at its last write, so the gap after it also counts the time it
sat idle before its rename, at most one file's worth of bytes more than were lost. A gap
priced under half a rotated file (the moment between a rename and the new file's creation)
is not counted: only whole files are missed.

Birth times come from ``statx(2)`` (glibc, through ctypes); on a filesystem or C library
without them nothing is estimated (:func:`birth_ns` returns None) and the docs say so.
Stdlib only; nothing here reads a file's content.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections import Counter

#: the key of ``counts`` holding estimated bytes of rotated files never seen
MISSED_BYTES = "missed_bytes"
#: the key of ``counts`` holding those bytes in lines, at the mean line length read
MISSED_LINES = "missed_lines"

_AT_FDCWD = -100
_AT_SYMLINK_NOFOLLOW = 0x100
_AT_EMPTY_PATH = 0x1000
_STATX_BTIME = 0x800
_STATX_SIZE = 256
_BTIME_OFFSET = 80  # struct statx: stx_btime (s64 seconds, u32 nanoseconds)


def _load_statx() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    try:
        # the process's own symbols, libc's among them: not ctypes.util.find_library, which
        # runs ldconfig and imports subprocess and tempfile into the throughput child
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.statx
    except (OSError, AttributeError):  # no glibc statx (musl, glibc < 2.28)
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p)
    fn.restype = ctypes.c_int
    return fn


_STATX = _load_statx()


def birth_ns(*, fd: int | None = None, path: str | None = None) -> int | None:
    """The birth time (ns since the epoch) of an open file or a path (never through a
    symlink), or None when the system cannot say."""
    if _STATX is None:
        return None
    buf = ctypes.create_string_buffer(_STATX_SIZE)
    if fd is not None:
        rc = _STATX(fd, b"", _AT_EMPTY_PATH, _STATX_BTIME, buf)
    else:
        assert path is not None
        rc = _STATX(_AT_FDCWD, os.fsencode(path), _AT_SYMLINK_NOFOLLOW, _STATX_BTIME, buf)
    if rc != 0:
        return None
    (mask,) = struct.unpack_from("<I", buf.raw, 0)
    if not mask & _STATX_BTIME:
        return None
    sec, nsec = struct.unpack_from("<qI", buf.raw, _BTIME_OFFSET)
    return int(sec) * 1_000_000_000 + int(nsec)


class GapEstimator:
    """One log's chain of files (see the module docstring). The tailer calls
    :meth:`finished` with each file it is done with (the old file at a rotation, each
    rotated file it lists after it), and :meth:`started` with the file the path names next;
    :meth:`reset` when the chain is broken (nothing known of the file before)."""

    __slots__ = ("_bytes", "_counts", "_end_ns", "_lines", "_rate", "_size")

    def __init__(self, counts: Counter[str]) -> None:
        self._counts = counts
        self._end_ns: int | None = None  # the end of the latest file finished (its ctime)
        self._rate: float | None = None  # bytes per ns, over files seen whole
        self._size: float | None = None  # mean size of a finished file
        self._bytes = 0  # read by the tailer (for the mean line length)
        self._lines = 0

    def read(self, data: bytes) -> None:
        """Bytes the tailer read (to know the mean line length)."""
        self._bytes += len(data)
        self._lines += data.count(b"\n")

    def reset(self) -> None:
        self._end_ns = None

    def finished(
        self, born: int | None, end_ns: int, size: int, *, whole_life: bool = True
    ) -> None:
        """A file of the chain, done with: it follows the latest one finished (a gap before
        it is counted), its size over its life (birth to ``end_ns``, its ctime: the rename)
        is a rate sample, its end the next link. Not ``whole_life``: ``end_ns`` is only its
        last write (a file deleted since, whose ctime is its deletion): no rate sample."""
        self._link(born)
        if whole_life and born is not None and end_ns - born >= 1_000_000 and size > 0:
            rate = size / (end_ns - born)
            self._rate = rate if self._rate is None else 0.7 * self._rate + 0.3 * rate
        if size > 0:
            self._size = size if self._size is None else 0.7 * self._size + 0.3 * size
        self._end_ns = end_ns if end_ns > 0 else None

    def started(self, born: int | None) -> None:
        """The file the path names now (after a rotation): a gap before it is counted."""
        self._link(born)
        self._end_ns = None

    def _link(self, born: int | None) -> None:
        end, self._end_ns = self._end_ns, None
        if end is None or born is None or self._rate is None or self._size is None:
            return
        missed = self._rate * (born - end)
        if missed < self._size / 2:
            return
        self._counts["rotated_missed"] += 1
        self._counts[MISSED_BYTES] += int(missed)
        if self._lines:
            self._counts[MISSED_LINES] += round(missed * self._lines / self._bytes)
