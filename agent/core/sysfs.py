"""The one seam through which samplers touch sysfs and procfs.

Every path a sampler reads is relative to an injectable root (``--path.sysfs``,
``--path.procfs``), so fixture trees, snapshots and fault-injection readers can stand in
for the real host. ``Issues`` collects per-file problems so that one bad file costs one
series, never a device or a scrape.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

_READ_SIZE = 65536


@dataclass(frozen=True, slots=True)
class ReadIssue:
    """One file that could not be read or parsed during a sampling pass.

    ``path`` is relative to the reader's root (e.g. ``class/infiniband/mlx5_0/ports/1/rate``);
    ``reason`` is one of ``vanished``, ``permission``, ``io``, ``parse``, ``unsupported``.
    """

    path: str
    reason: str
    detail: str


class UnsupportedValue(ValueError):  # noqa: N818 - it is a value, reported as a reason
    """A parser's way to say "the file answers, but the device does not support this"
    (e.g. ``N/A (no PMA)``): recorded as reason ``unsupported``, not ``parse``."""


def classify_os_error(exc: OSError) -> str:
    """Map an OSError to the ``reason`` vocabulary of :class:`ReadIssue`."""
    if exc.errno in (errno.ENOENT, errno.ENODEV, errno.ENXIO):
        return "vanished"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission"
    if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
        return "unsupported"
    return "io"


class SysfsReader:
    """Reads files below ``root``. Paths given to its methods are relative to that root.

    Hot path: a full pass reads a few thousand small files, so paths are plain strings and
    files are read with one ``os.read`` (sysfs attributes are at most a page).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._prefix = os.fspath(root).rstrip("/") + "/"
        self._real_root = os.path.realpath(root)

    def path(self, rel: str) -> Path:
        return self.root / rel

    def read_bytes(self, rel: str) -> bytes:
        fd = os.open(self._prefix + rel, os.O_RDONLY | os.O_CLOEXEC)
        try:
            chunk = os.read(fd, _READ_SIZE)
            if len(chunk) < _READ_SIZE:  # a short read is EOF for sysfs and regular files
                return chunk
            chunks = [chunk]
            while chunk:
                chunk = os.read(fd, _READ_SIZE)
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def read_text(self, rel: str) -> str:
        """The file's contents, decoded leniently (sysfs sometimes holds stray bytes)."""
        return self.read_bytes(rel).decode("utf-8", errors="replace")

    def listdir(self, rel: str) -> list[str]:
        """Sorted entries of a directory."""
        return sorted(os.listdir(self._prefix + rel))

    def listdir_files(self, rel: str) -> list[str]:
        """Sorted names of the entries of a directory that are not directories themselves
        (one ``getdents``, no ``stat`` per entry; symlinks count as files)."""
        with os.scandir(self._prefix + rel) as it:
            return sorted(e.name for e in it if not e.is_dir(follow_symlinks=False))

    def readlink(self, rel: str) -> str:
        return os.readlink(self._prefix + rel)

    def realpath(self, rel: str) -> str:
        """``rel`` with every symlink resolved, relative to the root.

        Raises FileNotFoundError if it resolves outside the root (a broken fixture or an
        absolute link in a snapshot).
        """
        root = self._real_root
        full = os.path.realpath(self._prefix + rel)
        if full != root and not full.startswith(root + os.sep):
            raise FileNotFoundError(errno.ENOENT, "resolves outside the root", str(rel))
        return os.path.relpath(full, root)

    def exists(self, rel: str) -> bool:
        return os.path.exists(self._prefix + rel)

    def is_dir(self, rel: str) -> bool:
        return os.path.isdir(self._prefix + rel)


class RecordingReader(SysfsReader):
    """A reader that remembers every path it was asked about (for ``fabricscope snapshot``)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        super().__init__(root)
        self._lock = threading.Lock()
        self.touched: set[str] = set()

    def _note(self, rel: str) -> None:
        with self._lock:
            self.touched.add(rel)

    def read_text(self, rel: str) -> str:
        self._note(rel)
        return super().read_text(rel)

    def read_bytes(self, rel: str) -> bytes:
        self._note(rel)
        return super().read_bytes(rel)

    def listdir(self, rel: str) -> list[str]:
        self._note(rel)
        return super().listdir(rel)

    def listdir_files(self, rel: str) -> list[str]:
        self._note(rel)
        return super().listdir_files(rel)

    def readlink(self, rel: str) -> str:
        self._note(rel)
        return super().readlink(rel)

    def realpath(self, rel: str) -> str:
        self._note(rel)
        return super().realpath(rel)

    def exists(self, rel: str) -> bool:
        self._note(rel)
        return super().exists(rel)

    def is_dir(self, rel: str) -> bool:
        self._note(rel)
        return super().is_dir(rel)


class Issues:
    """Collects :class:`ReadIssue` records during one sampling pass.

    Use :meth:`read` to read-and-parse one file: on failure it records the issue and returns
    ``None`` so the caller simply leaves that series absent.
    """

    def __init__(self, reader: SysfsReader) -> None:
        self.reader = reader
        self.items: list[ReadIssue] = []

    def add(self, rel: str, reason: str, detail: str) -> None:
        self.items.append(ReadIssue(rel, reason, detail))

    def read(self, rel: str, parse: Callable[[str], T]) -> T | None:
        """Read ``rel`` as text and parse it; ``None`` (and an issue) on any failure."""
        return self._read(rel, parse, missing_ok=False)

    def _read(self, rel: str, parse: Callable[[str], T], *, missing_ok: bool) -> T | None:
        try:
            text = self.reader.read_text(rel)
        except FileNotFoundError as exc:
            if not missing_ok:
                self.add(rel, "vanished", exc.strerror or str(exc))
            return None
        except OSError as exc:
            self.add(rel, classify_os_error(exc), exc.strerror or str(exc))
            return None
        try:
            return parse(text)
        except UnsupportedValue as exc:
            self.add(rel, "unsupported", str(exc))
            return None
        except ValueError as exc:
            self.add(rel, "parse", str(exc))
            return None

    def read_optional(self, rel: str, parse: Callable[[str], T]) -> T | None:
        """Like :meth:`read`, but a file that does not exist is not an issue (older kernels,
        other drivers simply lack some attributes)."""
        return self._read(rel, parse, missing_ok=True)

    def freeze(self) -> tuple[ReadIssue, ...]:
        return tuple(self.items)
