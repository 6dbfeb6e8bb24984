"""What the PMA step must remember across an agent restart, kept in one small state file.

With ``--infiniband.reset-saturated`` the exported counter is "what the agent has cleared
from the hardware counter, plus the hardware value" (:mod:`agent.infiniband.pma`). Kept in
memory only, a restart would drop it back to the hardware value: Prometheus takes any drop
as a counter reset, so ``increase()`` over the restart would count the whole hardware value
again as new errors (errors that never happened), and a rolling upgrade would raise every
"errors rising" alert of the fleet at once. Likewise a counter a 64-bit PMA read supplies
must not be handed back to its stuck 32-bit sysfs twin by a restarted agent whose first
64-bit read failed.

So per port the step keeps, in a JSON file (``--infiniband.state-file``) on a volume that
outlives the agent's container (in Kubernetes a hostPath: an emptyDir goes with the pod):

- ``cleared``: per counter, what the agent has cleared from it in all;
- ``last``: per counter, the hardware value the agent last exported (a value below it at
  the next read, after a restart as within a run, means someone cleared the counter, or the
  node rebooted: ``last`` is added to ``cleared`` and the counter carries on, monotonic);
- ``extended``: the counters a 64-bit read has supplied;
- ``resets``: how many times the agent has cleared the port's counters.

The file is written whenever what it holds changes (once per pass at most: a few hundred
bytes), to a temporary file beside it renamed over it, so a crash leaves the old file or the
new one, never half of one. A crash between a clear and the write is safe: the ``last``
on disk is then the value before the clear, and the next read, below it, adds it.

Read back at start: at most :data:`MAX_BYTES`, plain JSON, every value checked (names and
numbers bounded); a file that fails any check is ignored with one warning (the counters then
restart from the hardware values: one counter reset, as before this file existed). Never
followed through a symlink.

May import: the standard library only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import stat
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

VERSION = 1
#: the most bytes the state file may hold (a 16-port node writes ~3 KiB)
MAX_BYTES = 1 << 20
#: the most ports, and counters per port, read back
MAX_PORTS = 1024
MAX_COUNTERS = 64
#: the largest counter value kept (cleared sums of 64-bit counters stay below it for ages)
MAX_VALUE = (1 << 64) - 1
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


@dataclass(slots=True)
class PortMemory:
    """What one port's PMA step keeps across restarts (see the module docstring)."""

    cleared: dict[str, int] = field(default_factory=dict)
    last: dict[str, int] = field(default_factory=dict)
    extended: set[str] = field(default_factory=set)
    resets: int = 0


def _key(device: str, port: int) -> str:
    return f"{device}/{port}"


def encode(ports: dict[tuple[str, int], PortMemory]) -> str:
    """The file's text for ``ports`` (stable: sorted keys), ports with nothing to keep left
    out."""
    out: dict[str, object] = {}
    for (device, port), m in sorted(ports.items()):
        if not (m.cleared or m.last or m.extended or m.resets):
            continue
        out[_key(device, port)] = {
            "cleared": dict(sorted(m.cleared.items())),
            "last": dict(sorted(m.last.items())),
            "extended": sorted(m.extended),
            "resets": m.resets,
        }
    return json.dumps({"version": VERSION, "ports": out}, sort_keys=True) + "\n"


def _counts(value: object, what: str) -> dict[str, int]:
    if not isinstance(value, dict) or len(value) > MAX_COUNTERS:
        raise ValueError(f"{what} is not a map of at most {MAX_COUNTERS} counters")
    out: dict[str, int] = {}
    for name, n in value.items():
        if not _NAME.fullmatch(name):
            raise ValueError(f"{what} has a counter name that is not one")
        if type(n) is not int or not 0 <= n <= MAX_VALUE:
            raise ValueError(f"{what}[{name}] is not a counter value")
        out[name] = n
    return out


def decode(text: str) -> dict[tuple[str, int], PortMemory]:
    """The ports of a state file's text; ``ValueError`` saying what is wrong with it."""
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise ValueError(f"not a version {VERSION} state file")
    ports = doc.get("ports")
    if not isinstance(ports, dict) or len(ports) > MAX_PORTS:
        raise ValueError(f"ports is not a map of at most {MAX_PORTS} ports")
    out: dict[tuple[str, int], PortMemory] = {}
    for key, entry in ports.items():
        device, _, number = key.rpartition("/")
        if not _NAME.fullmatch(device) or not number.isdigit() or len(number) > 4:
            raise ValueError(f"port {key[:80]!r} is not DEVICE/PORT")
        if not isinstance(entry, dict):
            raise ValueError(f"port {key} is not a map")
        extended = entry.get("extended", [])
        if (
            not isinstance(extended, list)
            or len(extended) > MAX_COUNTERS
            or not all(isinstance(n, str) and _NAME.fullmatch(n) for n in extended)
        ):
            raise ValueError(f"port {key}: extended is not a list of counter names")
        resets = entry.get("resets", 0)
        if type(resets) is not int or not 0 <= resets <= MAX_VALUE:
            raise ValueError(f"port {key}: resets is not a count")
        out[(device, int(number))] = PortMemory(
            cleared=_counts(entry.get("cleared", {}), f"port {key}: cleared"),
            last=_counts(entry.get("last", {}), f"port {key}: last"),
            extended=set(extended),
            resets=resets,
        )
    return out


class StateFile:
    """The state file at ``path``: :meth:`load` once at start, :meth:`save` after each pass.
    Problems are returned as one line (for the pass's read issues) and logged once each."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._saved = ""
        self._warned: set[str] = set()

    def _warn(self, text: str) -> None:
        if text not in self._warned:
            self._warned.add(text)
            log.warning("infiniband: state file %s: %s", self.path, text)

    def load(self) -> tuple[dict[tuple[str, int], PortMemory], str]:
        """(the ports kept, "") or ({}, why nothing was kept). A missing file is the quiet
        first start: ({}, "")."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            log.debug(
                "infiniband: state file %s absent: counters start from the hardware values",
                self.path,
            )
            return {}, ""
        except OSError as exc:
            why = f"cannot open: {exc.strerror or exc}"
            self._warn(why + "; counters start from the hardware values")
            return {}, why
        try:
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    raise ValueError("not a regular file")
                data = f.read(MAX_BYTES + 1)
            if len(data) > MAX_BYTES:
                raise ValueError(f"larger than {MAX_BYTES} bytes")
            ports = decode(data.decode("utf-8", errors="strict"))
        except (OSError, ValueError) as exc:
            why = f"ignored ({exc})"
            self._warn(why + "; counters start from the hardware values")
            return {}, why
        self._saved = encode(ports)
        log.info("infiniband: state file %s: kept counts of %d ports", self.path, len(ports))
        return ports, ""

    def save(self, ports: dict[tuple[str, int], PortMemory]) -> str:
        """Write ``ports`` if they changed since the last write; "" or why it failed."""
        text = encode(ports)
        if text == self._saved or (not self._saved and text == encode({})):
            return ""  # nothing new; or nothing to keep and no file yet: the disk untouched
        tmp = f"{self.path}.tmp"
        try:
            with contextlib.suppress(FileNotFoundError):  # a crash's leftover
                os.unlink(tmp)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(tmp, flags, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            why = f"cannot write: {exc.strerror or exc}"
            self._warn(why + "; an agent restart will show as a counter reset")
            return why
        self._saved = text
        return ""
