"""``fabricscope snapshot``: capture exactly the sysfs files the samplers read, so a node's
state can be attached to a bug report and replayed with ``--snapshot``.

Layout of the archive (gzip'd tar):

    MANIFEST.json        what was captured, by which version, what could not be read
    sys/...              the files, directories and symlinks the samplers touched
    nvml.recording.json  every NVML answer of one pass (agent.nvml.record), when a GPU
                         driver answered

Symlinks are stored as symlinks (sysfs is made of them: class/infiniband/mlx5_0 ->
../../devices/pci...), with every link on the way to a touched file, so the replayed tree
resolves exactly as the live one did. sysfs files report a size of 4096 whatever their
content, so contents are read first and stored with their true length.
"""

from __future__ import annotations

import io
import json
import logging
import os
import platform
import stat
import tarfile
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from agent import __version__
from agent.core.sysfs import classify_os_error

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
NVML_RECORDING = "nvml.recording.json"


@dataclass(frozen=True, slots=True)
class CaptureResult:
    files: int
    symlinks: int
    directories: int
    unreadable: tuple[tuple[str, str], ...]  # (path, reason)
    absent: int = 0  # paths probed that do not exist on the host (optional attributes)


class _Archive:
    def __init__(self, tar: tarfile.TarFile, root: Path, prefix: str) -> None:
        self.tar = tar
        self.root = root
        self.prefix = prefix
        self.done: set[str] = set()
        self.files = self.links = self.dirs = 0
        self.unreadable: list[tuple[str, str]] = []
        self.absent = 0

    def _info(self, rel: str, st: os.stat_result, kind: bytes) -> tarfile.TarInfo:
        ti = tarfile.TarInfo(f"{self.prefix}/{rel}" if rel != "." else self.prefix)
        ti.type = kind
        ti.mode = stat.S_IMODE(st.st_mode)
        ti.mtime = int(st.st_mtime)
        return ti

    def add_parents(self, rel: str) -> None:
        parts = PurePosixPath(rel).parts
        for i in range(len(parts) - 1):
            self.add_entry("/".join(parts[: i + 1]), follow_dir_entries=False)

    def add_entry(self, rel: str, *, follow_dir_entries: bool) -> None:
        """Add ``rel`` (which must not traverse a symlink) as a dir, symlink or file."""
        if rel in self.done:
            return
        self.done.add(rel)
        full = self.root / rel
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            # a sampler probed an optional attribute this host lacks: absent on replay too
            self.absent += 1
            return
        except OSError as exc:
            self.unreadable.append((rel, classify_os_error(exc)))
            return
        if stat.S_ISLNK(st.st_mode):
            ti = self._info(rel, st, tarfile.SYMTYPE)
            ti.linkname = os.readlink(full)
            self.tar.addfile(ti)
            self.links += 1
        elif stat.S_ISDIR(st.st_mode):
            self.tar.addfile(self._info(rel, st, tarfile.DIRTYPE))
            self.dirs += 1
            if follow_dir_entries:
                self._add_listing(rel)
        elif stat.S_ISREG(st.st_mode):
            try:
                with open(full, "rb") as f:
                    data = f.read()
            except OSError as exc:
                self.unreadable.append((rel, classify_os_error(exc)))
                return
            ti = self._info(rel, st, tarfile.REGTYPE)
            ti.size = len(data)
            self.tar.addfile(ti, io.BytesIO(data))
            self.files += 1

    def _add_listing(self, rel: str) -> None:
        """A listed directory keeps its entries' names: symlinks and subdirectories are added
        (cheap, and listings stay the same on replay); untouched files are not."""
        try:
            names = sorted(os.listdir(self.root / rel))
        except OSError as exc:
            self.unreadable.append((rel, classify_os_error(exc)))
            return
        for name in names:
            child = f"{rel}/{name}" if rel != "." else name
            if child in self.done:
                continue
            try:
                st = os.lstat(self.root / child)
            except OSError:
                continue  # vanished between listing and lstat: nothing to keep
            if stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode):
                self.add_entry(child, follow_dir_entries=False)


def _split_at_symlinks(root: Path, rel: str) -> Iterable[tuple[str, bool]]:
    """Yield the root-relative paths needed to reach ``rel``: each symlink met on the way
    (flagged True), then the final resolved path (False). Resolution stays inside root."""
    parts = list(PurePosixPath(rel).parts)
    cur: list[str] = []
    hops = 0
    while parts:
        cur.append(parts.pop(0))
        here = "/".join(cur)
        full = root / here
        if os.path.islink(full):
            hops += 1
            if hops > 40:
                return
            yield here, True
            target = os.path.normpath(os.path.join(os.path.dirname(here), os.readlink(full)))
            if target.startswith("..") or os.path.isabs(target):
                return
            cur = [] if target == "." else list(PurePosixPath(target).parts)
    yield "/".join(cur) if cur else ".", False


def capture(
    root: str,
    touched: Iterable[str],
    output: str,
    *,
    prefix: str = "sys",
    extra: Mapping[str, bytes] | None = None,
) -> CaptureResult:
    """Write ``output`` (tar.gz) holding every path in ``touched`` (relative to ``root``),
    plus ``extra`` files (name -> contents) at the archive's top level."""
    root_path = Path(root)
    with tarfile.open(output, "w:gz") as tar:
        arch = _Archive(tar, root_path, prefix)
        for rel in sorted(set(touched)):
            for piece, is_link in _split_at_symlinks(root_path, rel):
                arch.add_parents(piece)
                arch.add_entry(piece, follow_dir_entries=not is_link)
        result = CaptureResult(
            arch.files, arch.links, arch.dirs, tuple(sorted(arch.unreadable)), arch.absent
        )
        manifest = {
            "fabricscope_version": __version__,
            "captured_at_unix": int(time.time()),
            "kernel": platform.release(),
            "roots": {prefix: str(root_path)},
            "files": result.files,
            "symlinks": result.symlinks,
            "directories": result.directories,
            "unreadable": [{"path": p, "reason": r} for p, r in result.unreadable],
            "absent": result.absent,
            "extra": sorted(extra or {}),
        }
        files = {MANIFEST: json.dumps(manifest, indent=2, sort_keys=True).encode(), **(extra or {})}
        for name, data in files.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            ti.mode = 0o644
            ti.mtime = int(time.time())
            tar.addfile(ti, io.BytesIO(data))
    return result


class SnapshotError(Exception):
    """The snapshot file is missing, not a tarball, or lacks a manifest."""


def _data_filter_skipping_bad(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """tarfile's ``data`` filter, but a member it refuses is skipped (and logged) rather
    than aborting the whole replay."""
    try:
        return tarfile.data_filter(member, dest)
    except tarfile.FilterError as exc:
        log.warning("snapshot member %s skipped: %s", member.name, exc)
        return None


def extract(path: str) -> tempfile.TemporaryDirectory[str]:
    """Unpack a snapshot into a temporary directory (removed when the returned object is
    cleaned up). Uses tarfile's ``data`` filter: no absolute paths, no links out."""
    tmp = tempfile.TemporaryDirectory(prefix="fabricscope-snapshot-")
    try:
        with tarfile.open(path, "r:*") as tar:
            names = tar.getnames()
            if MANIFEST not in names:
                raise SnapshotError(f"{path}: not a fabricscope snapshot (no {MANIFEST})")
            tar.extractall(tmp.name, filter=_data_filter_skipping_bad)
    except (OSError, tarfile.TarError) as exc:
        tmp.cleanup()
        raise SnapshotError(f"{path}: cannot read snapshot: {exc}") from exc
    except SnapshotError:
        tmp.cleanup()
        raise
    return tmp
