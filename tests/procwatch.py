"""What the tests read of a real agent's child processes in /proc: who they are, their peak
resident memory and the memory ceiling the kernel holds them to."""

from __future__ import annotations

from pathlib import Path


def children(pid: int) -> list[int]:
    """The direct children of process ``pid`` (all its threads'); [] once it is gone."""
    out: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def status_bytes(pid: int, field: str) -> int:
    """A ``kB`` field of /proc/PID/status in bytes (``VmHWM``, ``VmData``); 0 for a process
    that just ended (a zombie has no memory)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def peak_rss(pid: int) -> int:
    return status_bytes(pid, "VmHWM")


def data_limit(pid: int) -> int | None:
    """The soft ``RLIMIT_DATA`` of process ``pid`` in bytes; None when unlimited or gone."""
    try:
        text = Path(f"/proc/{pid}/limits").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Max data size"):
            soft = line.split()[3]
            return None if soft == "unlimited" else int(soft)
    return None
