"""What a process costs, from ``/proc``: resident memory, CPU seconds, open file descriptors
and start time, for the agent itself and each supervised child (the ``process_*`` series every
exporter publishes about itself). Reading is :func:`read_process`; parsing ``/proc/PID/stat``
is the pure :func:`parse_stat`. Standard library only.

Paths are built as plain strings, not :class:`pathlib.Path`: a supervised child reads its own
``/proc/PID`` after every pass, and ``pathlib`` interns each part of a path (``sys.intern``).
An interned string that dies (the pid's text, made afresh for each call) leaves a used slot in
the interpreter's table of interned strings, and a table that runs out of free slots is
rebuilt at three times its live entries: in the NVML child that rebuild, after some ten
thousand passes, kept about half a MiB more for good (malloc's mmapped bytes 800 -> 1,332
KiB).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class ProcessStats:
    """One process now. ``open_fds``: None when its ``fd`` directory cannot be listed;
    ``start_time_seconds``: Unix time it started, None without the boot time."""

    pid: int
    cpu_seconds: float
    rss_bytes: int
    open_fds: int | None = None
    start_time_seconds: float | None = None


def parse_stat(text: str) -> tuple[float, int, int]:
    """(user + system CPU ticks, start time in ticks since boot, resident pages) of a
    ``/proc/PID/stat`` line; the command name may hold spaces and parentheses."""
    fields = text.rsplit(")", 1)[1].split()
    # fields[0] is the state (stat's field 3): utime is field 14, stime 15, starttime 22, rss 24
    return int(fields[11]) + int(fields[12]), int(fields[19]), int(fields[21])


def boot_time(proc: Path = PROC) -> float | None:
    """Unix time the machine booted (``btime`` of ``/proc/stat``)."""
    try:
        with open(f"{proc}/stat") as f:
            text = f.read()
        for line in text.splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def read_process(
    pid: int | None = None, proc: Path = PROC, booted: float | None = None
) -> ProcessStats | None:
    """``pid`` (default: this process) now; None when it is gone or unreadable."""
    who = pid if pid is not None else os.getpid()
    base = f"{proc}/{who}"  # a string, not a Path: nothing interned per call (see above)
    try:
        with open(f"{base}/stat") as f:
            ticks, start, pages = parse_stat(f.read())
    except (OSError, ValueError, IndexError):
        return None
    try:
        fds: int | None = len(os.listdir(f"{base}/fd"))
    except OSError:
        fds = None
    if booted is None:
        booted = boot_time(proc)
    return ProcessStats(
        pid=who,
        cpu_seconds=ticks / TICKS,
        rss_bytes=pages * PAGE,
        open_fds=fds,
        start_time_seconds=None if booted is None else booted + start / TICKS,
    )
