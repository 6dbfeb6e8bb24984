"""Reading the CDI specs of one directory (``/var/run/cdi`` by default), bounded and kept
within it, with parsed specs cached by file identity so an unchanged directory costs one
``scandir`` and a ``stat`` per file per pass.

Rules, each a defence against what a directory of root-written files can still hold:

- only regular files named ``*.yaml``, ``*.yml`` or ``*.json`` directly in the directory are
  read (the NVIDIA GPU DRA driver writes its per-claim specs there,
  ``k8s.gpu.nvidia.com-claim_<claim uid>.yaml``); sub-directories are not walked;
- a symlink is never followed, wherever it points (``O_NOFOLLOW``): its name is reported as an
  issue (``permission``) and its target never opened, so a link out of the root cannot make
  the agent read another file; FIFOs and devices are refused the same way (``O_NONBLOCK``
  keeps a FIFO from blocking the open);
- a file over ``max_spec_bytes`` (1 MiB; a claim's spec is about 20 KB) is not parsed: one
  issue (``parse``), the rest of the directory carries on; so is a directory with more than
  ``max_specs`` spec files (the first ones by name are read);
- a spec that does not parse is one issue naming the file; its devices are unknown.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field

from agent.cdi.spec import CdiDevice, CdiSpec, parse_spec
from agent.core.sysfs import ReadIssue, classify_os_error

DEFAULT_CDI_ROOT = "/var/run/cdi"
MAX_SPEC_BYTES = 1024 * 1024
MAX_SPECS = 4096
_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True, slots=True)
class CdiIndex:
    """Every device of the directory's specs by qualified name (``vendor.com/class=name``);
    ``present`` is False when the directory does not exist (no CDI on this node, or it is
    not mounted into the agent's container)."""

    devices: dict[str, CdiDevice] = field(default_factory=dict)
    specs: int = 0
    present: bool = True
    issues: tuple[ReadIssue, ...] = ()

    def get(self, qualified: str) -> CdiDevice | None:
        return self.devices.get(qualified)


class CdiRegistry:
    """Scans ``root`` on demand; one instance per agent keeps the parse cache."""

    def __init__(
        self,
        root: str = DEFAULT_CDI_ROOT,
        *,
        max_spec_bytes: int = MAX_SPEC_BYTES,
        max_specs: int = MAX_SPECS,
    ) -> None:
        self.root = root
        self.max_spec_bytes = max_spec_bytes
        self.max_specs = max_specs
        # name -> (identity, parsed spec or None when it did not parse, its issue)
        self._cache: dict[
            str, tuple[tuple[int, int, int, int], CdiSpec | None, ReadIssue | None]
        ] = {}

    def scan(self) -> CdiIndex:
        """The devices of every readable spec in the directory now."""
        issues: list[ReadIssue] = []
        try:
            with os.scandir(self.root) as it:
                names = sorted(e.name for e in it if e.name.endswith(_SUFFIXES))
        except FileNotFoundError:
            self._cache.clear()
            return CdiIndex(present=False)
        except OSError as exc:
            reason = classify_os_error(exc)
            return CdiIndex(issues=(ReadIssue(".", reason, exc.strerror or str(exc)),))
        if len(names) > self.max_specs:
            issues.append(
                ReadIssue(".", "parse", f"{len(names)} spec files, read the first {self.max_specs}")
            )
            names = names[: self.max_specs]
        devices: dict[str, CdiDevice] = {}
        specs = 0
        seen = set()
        for name in names:
            seen.add(name)
            spec, issue = self._spec(name)
            if issue is not None:
                issues.append(issue)
            if spec is None:
                continue
            specs += 1
            for d in spec.devices:
                devices.setdefault(f"{spec.kind}={d.name}", d)
        for gone in set(self._cache) - seen:
            del self._cache[gone]
        return CdiIndex(devices, specs, True, tuple(issues))

    def _spec(self, name: str) -> tuple[CdiSpec | None, ReadIssue | None]:
        path = os.path.join(self.root, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return None, ReadIssue(name, "permission", "a symlink: not followed")
            if exc.errno == errno.ENOENT:
                return None, None  # removed since the scandir: the claim was unprepared
            return None, ReadIssue(name, classify_os_error(exc), exc.strerror or str(exc))
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None, ReadIssue(name, "permission", "not a regular file: not read")
            ident = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
            cached = self._cache.get(name)
            if cached is not None and cached[0] == ident:
                return cached[1], cached[2]
            if st.st_size > self.max_spec_bytes:
                result: tuple[CdiSpec | None, ReadIssue | None] = (
                    None,
                    ReadIssue(name, "parse", f"{st.st_size} bytes, over {self.max_spec_bytes}"),
                )
            else:
                result = self._parse(name, _read_at_most(fd, self.max_spec_bytes + 1))
        except OSError as exc:
            return None, ReadIssue(name, classify_os_error(exc), exc.strerror or str(exc))
        finally:
            os.close(fd)
        self._cache[name] = (ident, *result)
        return result

    def _parse(self, name: str, data: bytes) -> tuple[CdiSpec | None, ReadIssue | None]:
        if len(data) > self.max_spec_bytes:  # grew between the fstat and the read
            return None, ReadIssue(name, "parse", f"over {self.max_spec_bytes} bytes")
        try:
            text = data.decode("utf-8")
            return parse_spec(text, json_format=name.endswith(".json")), None
        except (UnicodeDecodeError, ValueError) as exc:
            return None, ReadIssue(name, "parse", str(exc)[:300])


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, 65536))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
