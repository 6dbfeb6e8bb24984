"""Opening a log file for reading, safely: a regular file only (never a FIFO, socket or
device, which could block or never end), never through a symbolic link under the pod log
directory, and never a file whose real path lies outside it. Used by the tailer
(:mod:`agent.throughput.tail`) and the gzip reader (:mod:`agent.throughput.gzlog`).
Imports only the standard library."""

from __future__ import annotations

import errno
import os
import stat
from collections import Counter


def classify(exc: OSError) -> str:
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return "vanished"
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return "fd_limit"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission"
    if exc.errno == errno.ELOOP:
        return "symlink"
    return "io"


NOT_REGULAR = "not a regular file (FIFO, socket, device or directory)"


def open_log(path: str, counts: Counter[str], root: str | None) -> int | tuple[str, str]:
    """A read-only, non-blocking fd on the regular file ``path``, or ``(reason, detail)``
    (counted). With a ``root``: never through a symlink as the last component, and the
    opened file must lie under the root's real path (checked on the open fd)."""
    try:
        st = os.stat(path) if root is None else os.lstat(path)
    except OSError as exc:
        return classify(exc), exc.strerror or str(exc)
    if stat.S_ISLNK(st.st_mode):
        counts["symlink"] += 1
        return "symlink", "a symbolic link (never followed under the pod log directory)"
    if not stat.S_ISREG(st.st_mode):
        counts["not_regular_file"] += 1
        return "not_regular_file", NOT_REGULAR
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
    if root is not None:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        reason = classify(exc)
        counts[reason] += 1
        return reason, exc.strerror or str(exc)
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped between stat and open
        os.close(fd)
        counts["not_regular_file"] += 1
        return "not_regular_file", NOT_REGULAR
    if root is not None and not _under(_fd_path(fd, path), os.path.realpath(root)):
        os.close(fd)
        counts["outside_root"] += 1
        return "outside_root", "its real path is outside the pod log directory"
    return fd


def _fd_path(fd: int, path: str) -> str:
    """The real path of an open file (what was opened, whatever happened to ``path``)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc: the path's resolution now (racy, but still a check)
        return os.path.realpath(path)


def _under(path: str, root: str) -> bool:
    return path.startswith(root.rstrip("/") + "/")
