"""Incremental tailing of log files: each pass reads only what was appended since the last.

A :class:`FileTail` follows one path the way ``tail -F`` does, in bounded memory:

- it keeps its file open between passes and remembers the offset, so a pass reads only the
  new bytes (at most ``Limits.max_bytes_per_pass``; the rest waits for the next pass);
- rotation (the path now names another inode, or no file): the old file is read to its end
  through the still-open descriptor, then every file rotated after it that is still there
  (siblings named ``<name>.*`` or ``<name>-*``, plain, written since the old file was: more
  than one rotation between two passes), oldest first, then the new file from its start; a
  line cut by a rotation is joined across the files. A rotated file listed but gone or
  unreadable before it could be read, or past the pass's byte bound, is counted
  (``rotated_unread``, its size in ``unread_bytes``); one already compressed is not read
  (its lines cannot be told from those already counted); one deleted before the next pass
  listed it leaves nothing to read, and is estimated from the birth times and sizes of the
  files around it (:mod:`agent.throughput.gaps`: ``rotated_missed``, ``missed_bytes``,
  ``missed_lines``);
- truncation (the file is shorter than the offset): read again from the start, counted;
- a file found already written starts ``Limits.initial_bytes`` before its end (the latest
  values, without re-reading a gigabyte), or from the start when that is None (``--once``);
  its first ``Limits.head_bytes`` (up to where that window starts) are read once, to a
  separate ``head_sink``: what a job prints once at its start (NCCL's transports and HCAs)
  survives an agent restarted mid-job;
- a line longer than ``Limits.max_line_bytes`` is skipped to its end and counted; the
  partial-line buffer never grows past that bound;
- the kubelet's CRI format (``<RFC3339Nano> <stream> <P|F> <message>``) is decoded
  (:mod:`agent.throughput.lines` cuts and decodes the lines):
  ``P`` (partial) pieces are joined until the ``F`` piece, within the same bound;
- invalid UTF-8 is counted and decoded with replacement characters (the numbers, ASCII,
  survive);
- a FIFO, socket, device or directory in place of the file is never opened for reading
  (``stat`` first; opened ``O_NONBLOCK``; ``fstat`` again): counted as ``not_regular_file``;
- with a ``root`` (the pod log directory), a file is opened ``O_NOFOLLOW`` (a symlink is
  refused, counted as ``symlink``) and the opened file's real path (``/proc/self/fd``) must
  lie under the root's real path (else ``outside_root``): a ``0.log`` pointing at
  ``/etc/shadow``, or a container directory that is a symlink, is never read;
- truncation is detected by size *and* content: the bytes just before the offset are kept
  and compared on each pass, so a file truncated and written again past the old offset
  between two passes is read again from its start (counted ``truncated``), not resumed in
  the middle of other lines;
- ``close()`` keeps the offset: a tail closed to bound the open files reopens at the same
  position when the path still names the same file with the same bytes before the offset;
- :meth:`FileTail.resume_state` is where the next unread line starts (the read offset less
  a partial line still buffered), the file's identity and a digest of the bytes before that
  point (never the bytes: no log text leaves the tail): a tail built from it in another
  process (a supervised child replacing one that died) carries on at that line, or, if the
  file was rotated or truncated meanwhile, follows it as above;
- bytes known to exist that were never read (a truncation that cut unread bytes, a stream
  dropped with bytes left) are counted in ``unread_bytes``; a ``stop`` callable lets a pass
  leave a file between two chunks (its CPU budget spent, counted as ``cpu_budget``): the
  rest waits, nothing is lost (or, when the tail is then closed for good, is counted unread).

Gzip'd files (rotated kubelet logs, ``*.gz`` given to ``--throughput.file``) are read whole
with :func:`agent.throughput.gzlog.read_gzip_tail` (they never grow). Opening a file (what
may be opened under the pod log directory) is :mod:`agent.throughput.openlog`.

Events are counted in a :class:`collections.Counter` by reason (the sampler's
``errors_total``); a persistent problem with the file is returned as a ``(reason, detail)``
pair for the runner to log once. Nothing here logs or keeps a line beyond handing it on.
"""

from __future__ import annotations

import os
import stat
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

try:  # CPython's own BLAKE2, what hashlib.blake2b is, without importing hashlib: hashlib
    # loads OpenSSL's libcrypto (about 3.5 MiB resident in the throughput child, which has no
    # other use for it)
    from _blake2 import blake2b
except ImportError:  # another implementation of Python
    from hashlib import blake2b

from agent.throughput.gaps import GapEstimator, birth_ns
from agent.throughput.lines import LineSink, LineSplitter
from agent.throughput.openlog import classify, open_log

#: reasons counted by the tailer (a subset of the sampler's error reasons)
TAIL_REASONS = (
    "cpu_budget",
    "cri_parse",
    "gzip",
    "invalid_utf8",
    "io",
    "line_too_long",
    "not_regular_file",
    "outside_root",
    "fd_limit",
    "permission",
    "rotated",
    "rotated_missed",
    "rotated_unread",
    "symlink",
    "truncated",
    "vanished",
)
#: bytes before the offset compared on each pass to detect a truncated-and-regrown file
MARK_BYTES = 64
#: rotated files followed between the old file and the new one in one poll
MAX_ROTATED_FOLLOWED = 64
#: the key of ``counts`` holding bytes that existed and were never read
UNREAD_BYTES = "unread_bytes"


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds of the tailer. Sizes in bytes.

    ``max_line_bytes``: longest line (a CRI message joined from its pieces) kept; longer
    lines are skipped and counted. ``max_bytes_per_pass``: most bytes read from one file in
    one pass (None: no bound, for ``--once``). ``initial_bytes``: how far before the end of
    an already-written file reading starts (None: from the start). ``head_bytes``: how much
    of such a file's beginning is read once for its head sink (0: none). ``chunk_bytes``:
    one ``read`` call's size.
    """

    max_line_bytes: int = 1 << 20
    max_bytes_per_pass: int | None = 16 << 20
    initial_bytes: int | None = 1 << 20
    chunk_bytes: int = 64 << 10
    head_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if self.max_line_bytes < 1 or self.chunk_bytes < 1 or self.head_bytes < 0:
            raise ValueError("line and chunk bounds must be positive, the head not negative")


WHOLE_FILE = Limits(max_bytes_per_pass=None, initial_bytes=None)


@dataclass(frozen=True, slots=True)
class TailResume:
    """Where a tail stopped, for a tail in another process to carry on (see the module
    docstring): ``offset`` is where the next unread line starts; ``mark`` a digest of the
    ``mark_len`` bytes before it; ``skip``: the offset is inside an over-long line (its rest
    is skipped)."""

    path: str
    dev: int
    ino: int
    offset: int
    size: int
    mark: bytes
    mark_len: int
    skip: bool = False


def mark_digest(data: bytes) -> bytes:
    return blake2b(data, digest_size=16).digest()


class FileTail:
    """Follows one path across rotation and truncation; see the module docstring.

    ``poll`` reads what is new and hands each complete line to ``sink``; it returns None,
    or ``(reason, detail)`` when the path cannot be read now (the detail names no line).
    """

    def __init__(
        self,
        path: str,
        sink: LineSink,
        counts: Counter[str],
        *,
        cri: bool,
        limits: Limits,
        new_file: bool = False,
        root: str | None = None,
        head_sink: LineSink | None = None,
        resume: TailResume | None = None,
        filtered: Callable[[], bool] | None = None,
    ) -> None:
        """``new_file``: the file appeared after tailing began (a restarted container's
        next log): read it from its start rather than from ``initial_bytes`` before its end.
        ``root``: the directory the file must stay in (see the module docstring).
        ``head_sink``: where the lines of a skipped beginning go (see :meth:`_read_head`).
        ``resume``: carry on where another tail of this path stopped (its
        :meth:`resume_state`). ``filtered``: the sinks want only the lines that may matter
        to them (:class:`~agent.throughput.lines.LineSplitter`'s)."""
        self.path = path
        self._counts = counts
        self._limits = limits
        self._root = root
        self._cri = cri
        self._head_sink = head_sink
        self._filtered = filtered
        self._split = LineSplitter(
            sink, counts, cri=cri, max_line_bytes=limits.max_line_bytes, filtered=filtered
        )
        self._fd: int | None = None
        self._ident: tuple[int, int] = (0, 0)
        self._offset = 0
        self._size = 0  # the size last seen: bytes up to it are known to exist
        self._mark = b""  # the bytes just before the offset
        #: a resumed tail's digest of the bytes before the offset, until it reads on
        self._mark_digest: tuple[bytes, int] | None = None
        self._opened_before = new_file
        self._checkpoint: TailResume | None = None
        #: rotated files already read (followed between an old file and a new one)
        #: (by identity and birth time: a deleted file's inode number is soon reused)
        self._followed: deque[tuple[int, int, int | None]] = deque(maxlen=MAX_ROTATED_FOLLOWED)
        #: the chain of rotated files, for what was deleted before it could be listed
        self._gaps = GapEstimator(counts)
        self.last_read_mtime: float | None = None
        #: bytes read by the latest poll
        self.last_poll_bytes = 0
        #: the latest poll's ``stop`` left bytes for the next poll
        self.stopped = False
        if resume is not None:
            self._ident = (resume.dev, resume.ino)
            self._offset = resume.offset
            self._size = resume.size
            self._mark_digest = (resume.mark, resume.mark_len) if resume.mark_len else None
            self._opened_before = True
            if resume.skip:
                self._split.skip_to_next_line()
            self._checkpoint = resume

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    def close(self) -> None:
        """Close the file; the offset is kept (the next poll reopens there if it can)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def drop(self) -> None:
        """Close for good: bytes the file holds past the offset are counted unread."""
        if self._fd is not None:
            try:
                left = os.fstat(self._fd).st_size - self._offset
            except OSError:
                left = self._size - self._offset
            self._counts[UNREAD_BYTES] += max(0, left)
        self.close()

    def _finish_renamed(self) -> int:
        """The file read before a close was renamed (kubelet rotation) while closed: read
        its rest through its new name in the same directory (found by inode); when it is
        gone (compressed, deleted), what was known past the offset is counted unread.
        Returns its modification time (ns; 0 when gone), for the files rotated after it."""
        folder = os.path.dirname(self.path) or "."
        try:
            names = os.listdir(folder)
        except OSError:
            names = []
        for name in names:
            candidate = os.path.join(folder, name)
            try:
                st = os.lstat(candidate)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) != self._ident or not stat.S_ISREG(st.st_mode):
                continue
            opened = open_log(candidate, self._counts, self._root)
            if isinstance(opened, tuple):
                break
            try:
                if self._mark_matches(opened):
                    os.lseek(opened, self._offset, os.SEEK_SET)
                    while data := os.read(opened, self._limits.chunk_bytes):
                        self._split.feed(data)
                        self._gaps.read(data)
                    st = os.fstat(opened)
                    self._gaps.finished(birth_ns(fd=opened), st.st_ctime_ns, st.st_size)
                    return st.st_mtime_ns
            except OSError as exc:  # unreadable now: its rest is counted unread below
                self._counts[classify(exc)] += 1
            finally:
                os.close(opened)
            break
        self._counts[UNREAD_BYTES] += max(0, self._size - self._offset)
        self._gaps.reset()
        return 0

    def _follow_rotated(
        self, old: tuple[int, int], old_mtime_ns: int, current: tuple[int, int]
    ) -> None:
        """Read, oldest first, the files rotated after the old file ``old`` and before the
        one the path names now (``current``): see the module docstring."""
        folder = os.path.dirname(self.path) or "."
        base = os.path.basename(self.path)
        try:
            names = os.listdir(folder)
        except OSError:
            return
        found: list[tuple[int, str, tuple[int, int], int, int | None, int]] = []
        for name in names:
            if not name.startswith((base + ".", base + "-")) or name.endswith(".gz"):
                continue
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            ident = (st.st_dev, st.st_ino)
            if (
                not stat.S_ISREG(st.st_mode)
                or ident in (old, current)
                or st.st_mtime_ns < old_mtime_ns
            ):
                continue
            born = birth_ns(path=os.path.join(folder, name))
            if (*ident, born) in self._followed:
                continue
            found.append((st.st_mtime_ns, name, ident, st.st_size, born, st.st_ctime_ns))
        budget = self._limits.max_bytes_per_pass
        for n, (_, name, ident, size, born, changed) in enumerate(sorted(found)):
            self._gaps.finished(born, changed, size)
            if n >= MAX_ROTATED_FOLLOWED or (budget is not None and budget <= 0):
                self._counts["rotated_unread"] += 1
                self._counts[UNREAD_BYTES] += size
                continue
            read = self._read_rotated(os.path.join(folder, name), ident, born, size, budget)
            if budget is not None:
                budget -= read

    def _read_rotated(
        self,
        path: str,
        ident: tuple[int, int],
        born: int | None,
        size: int,
        budget: int | None,
    ) -> int:
        """One rotated file, whole (at most ``budget`` bytes); returns the bytes read."""
        opened = open_log(path, Counter(), self._root)
        if isinstance(opened, tuple):
            self._counts["rotated_unread"] += 1
            self._counts[UNREAD_BYTES] += size
            return 0
        total = 0
        try:
            st = os.fstat(opened)
            if (st.st_dev, st.st_ino) != ident:  # replaced between the listing and the open
                self._counts["rotated_unread"] += 1
                self._counts[UNREAD_BYTES] += size
                return 0
            self._counts["rotated"] += 1
            self._followed.append((*ident, born))
            while budget is None or total < budget:
                want = self._limits.chunk_bytes
                data = os.read(opened, want if budget is None else min(want, budget - total))
                if not data:
                    return total
                total += len(data)
                self._split.feed(data)
                self._gaps.read(data)
            left = os.fstat(opened).st_size - total
            if left > 0:
                self._counts["rotated_unread"] += 1
                self._counts[UNREAD_BYTES] += left
        except OSError as exc:
            self._counts[classify(exc)] += 1
            self._counts["rotated_unread"] += 1
        finally:
            os.close(opened)
        return total

    def _mark_matches(self, fd: int) -> bool:
        """The bytes before the offset are still the ones read there."""
        if self._mark_digest is not None:
            digest, n = self._mark_digest
            try:
                return mark_digest(os.pread(fd, n, self._offset - n)) == digest
            except OSError:
                return False
        if not self._mark:
            return True
        try:
            return os.pread(fd, len(self._mark), self._offset - len(self._mark)) == self._mark
        except OSError:
            return False

    def _open(self, *, from_start: bool) -> tuple[str, str] | None:
        opened = open_log(self.path, self._counts, self._root)
        if isinstance(opened, tuple):
            return opened
        fd = opened
        st = os.fstat(fd)
        same = (
            self._ident == (st.st_dev, st.st_ino)
            and st.st_size >= self._offset > 0
            and self._mark_matches(fd)
        )
        if self._opened_before and self._offset > 0 and not same:
            if self._ident == (st.st_dev, st.st_ino):
                self._counts["truncated"] += 1  # truncated (and maybe regrown) while closed
                self._counts[UNREAD_BYTES] += max(0, self._size - self._offset)
                self._split.reset()
            else:  # rotated while closed: finish the old file under its new name
                self._counts["rotated"] += 1
                old = self._ident
                self._follow_rotated(old, self._finish_renamed(), (st.st_dev, st.st_ino))
                self._gaps.started(birth_ns(fd=fd))
            self._mark = b""
            self._mark_digest = None
        self._fd = fd
        self._ident = (st.st_dev, st.st_ino)
        initial = self._limits.initial_bytes
        if same:  # reopened after an error: carry on where reading stopped
            os.lseek(fd, self._offset, os.SEEK_SET)
        elif not from_start and initial is not None and st.st_size > initial:
            self._offset = st.st_size - initial
            self._read_head(fd, min(self._limits.head_bytes, self._offset))
            os.lseek(fd, self._offset, os.SEEK_SET)
            self._split.skip_to_next_line()
        else:
            self._offset = 0
        self._size = st.st_size
        self._opened_before = True
        return None

    def _read_head(self, fd: int, size: int) -> None:
        """The first ``size`` bytes of a file whose reading starts later, once, to the head
        sink: complete lines only (a line cut at ``size`` is dropped), with their own
        splitter whose counts are discarded (those bytes were never the stream's to read)."""
        if self._head_sink is None or size <= 0:
            return
        split = LineSplitter(
            self._head_sink,
            Counter(),
            cri=self._cri,
            max_line_bytes=self._limits.max_line_bytes,
            filtered=self._filtered,
        )
        at = 0
        while at < size:
            try:
                data = os.pread(fd, min(self._limits.chunk_bytes, size - at), at)
            except OSError as exc:  # the head is a bonus: the tail is still read
                self._counts[classify(exc)] += 1
                return
            if not data:
                return
            at += len(data)
            split.feed(data)

    def poll(self, stop: Callable[[], bool] | None = None) -> tuple[str, str] | None:
        """Read what is new (see the class docstring). ``stop`` is asked after a read that
        filled its chunk (more may follow; a shorter read is the file's end): True leaves
        the rest of the file for the next poll and sets :attr:`stopped`."""
        problem = self._poll(stop)
        if self._fd is not None and (self.last_poll_bytes or self._checkpoint is None):
            self._checkpoint = self._resume_point(self._fd)
        return problem

    def resume_state(self) -> TailResume | None:
        """Where the latest poll left this file (None: never opened); see the module
        docstring."""
        return self._checkpoint

    def _resume_point(self, fd: int) -> TailResume | None:
        pending = self._split.pending_bytes()
        at = self._offset - pending
        if at < 0:
            return None
        if pending == 0 and self._mark_digest is not None:
            digest, n = self._mark_digest
        else:
            before = self._mark if pending == 0 else b""
            if pending and at > 0:
                try:
                    before = os.pread(fd, min(MARK_BYTES, at), at - min(MARK_BYTES, at))
                except OSError:
                    return None
            digest, n = mark_digest(before), len(before)
        return TailResume(
            self.path,
            self._ident[0],
            self._ident[1],
            at,
            self._size,
            digest if n else b"",
            n,
            self._split.skipping,
        )

    def _poll(self, stop: Callable[[], bool] | None) -> tuple[str, str] | None:
        budget = self._limits.max_bytes_per_pass
        self.last_poll_bytes = 0
        self.stopped = False
        if self._fd is None:
            problem = self._open(from_start=self._opened_before)
            if problem is not None:
                return problem
        for _ in range(64):  # rotations handled in one pass (bounded: never spin)
            assert self._fd is not None
            try:
                size = os.fstat(self._fd).st_size
                if size < self._offset or not self._mark_matches(self._fd):
                    self._counts["truncated"] += 1
                    # bytes that were there past the offset when last seen are gone unread
                    self._counts[UNREAD_BYTES] += max(0, self._size - self._offset)
                    self._split.reset()
                    self._offset = 0
                    self._mark = b""
                    self._mark_digest = None
                    os.lseek(self._fd, 0, os.SEEK_SET)
                self._size = size
                read, at_eof = self._read(budget, stop)
            except OSError as exc:
                self.close()
                reason = classify(exc)
                self._counts[reason] += 1
                return reason, exc.strerror or str(exc)
            self.last_poll_bytes += read
            if budget is not None:
                budget -= read
            if not at_eof:
                return None  # budget spent or stopped: the rest next pass
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                return None  # rotated away, no new file yet: keep the old one open
            except OSError as exc:
                return classify(exc), exc.strerror or str(exc)
            if (st.st_dev, st.st_ino) == self._ident:
                return None
            # rotated or replaced: the old file is read to its end; then the files rotated
            # after it, if any; now the new one
            self._counts["rotated"] += 1
            old, old_mtime = self._ident, 0
            try:
                old_st = os.fstat(self._fd)
                old_mtime = old_st.st_mtime_ns
                # deleted since (no link left): its ctime is the deletion, its end unknown
                self._gaps.finished(
                    birth_ns(fd=self._fd),
                    old_st.st_ctime_ns if old_st.st_nlink else old_mtime,
                    old_st.st_size,
                    whole_life=old_st.st_nlink > 0,
                )
            except OSError as exc:
                self._counts[classify(exc)] += 1
                self._gaps.reset()
            self.close()
            self._offset, self._size, self._mark = 0, 0, b""  # the old file is done
            self._mark_digest = None
            current = (st.st_dev, st.st_ino)
            self._follow_rotated(old, old_mtime, current)
            problem = self._open(from_start=True)
            if problem is not None:
                return problem
            if self._ident != current:
                # rotated again between the stat and the open: the file the path named at
                # the stat (and any rotated after it) is read as rotated, before the new one
                self._follow_rotated(old, old_mtime, self._ident)
            if self._fd is not None:
                self._gaps.started(birth_ns(fd=self._fd))
        return None

    def _read(self, budget: int | None, stop: Callable[[], bool] | None) -> tuple[int, bool]:
        assert self._fd is not None
        total = 0
        chunk = self._limits.chunk_bytes
        more = False  # the last read filled what it asked for: more may follow
        while budget is None or total < budget:
            if stop is not None and more and stop():
                self.stopped = True
                self._counts["cpu_budget"] += 1  # the rest waits, or goes with a closed tail
                break
            want = chunk if budget is None else min(chunk, budget - total)
            data = os.read(self._fd, want)
            if not data:
                if total:
                    self.last_read_mtime = os.fstat(self._fd).st_mtime
                return total, True
            more = len(data) == want
            total += len(data)
            self._offset += len(data)
            self._size = max(self._size, self._offset)
            self._mark = (self._mark + data[-MARK_BYTES:])[-MARK_BYTES:]
            self._mark_digest = None
            self._split.feed(data)
            self._gaps.read(data)
        if total:
            self.last_read_mtime = os.fstat(self._fd).st_mtime
        return total, False
