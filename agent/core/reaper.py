"""Processes that cannot be left behind: a process tree killed whole, orphans kept in the
tree that started them, and zombies reaped.

A process group is not a tree: a program that calls ``setsid`` (or ``setpgid``) leaves the
group it was started in, and one that double-forks is re-parented to the nearest
*subreaper* above it, else to PID 1. So:

- :func:`become_subreaper` (``PR_SET_CHILD_SUBREAPER``) makes the calling process the one
  its orphaned descendants are re-parented to: a supervised child (:mod:`agent.core.isolation`)
  calls it first, so whatever its tools start stays in its tree, whatever they do;
- :func:`kill_tree` walks ``/proc`` for every descendant of a process (by parent pid, in
  rounds, so one forked meanwhile is caught by the next round) and SIGKILLs them, then the
  process itself; zombies are left for their parent to reap;
- :func:`reap_strays` (only in a process that owns none of its children through
  :mod:`subprocess`: a supervised child between two tool calls) kills every descendant and
  reaps every exited child;
- :func:`serve_as_init` is a minimal init for a container whose entrypoint is the agent: as
  PID 1 nothing else reaps the orphans re-parented to it, so the agent forks, runs in the
  child and PID 1 forwards signals to it and reaps every exited process until it exits.

Only ``/proc`` (the process's own view, never ``--path.procfs``) and signals: no cgroup or
privilege is needed, so this works as uid 0 without capabilities and as nobody.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import signal
import sys
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36
#: rounds of :func:`kill_tree` (each finds what was forked since the last)
MAX_ROUNDS = 64
_PROC = "/proc"


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants; False where the kernel
    refuses (not Linux, or before 3.4)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _parents(proc: str = _PROC) -> dict[int, int]:
    """pid -> parent pid of every live (not zombie) process visible in ``proc``."""
    out: dict[int, int] = {}
    try:
        names = os.listdir(proc)
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        # "pid (comm) S ppid ...": comm may hold spaces and parentheses; the last ")" ends it
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) < 2 or fields[0] in (b"Z", b"X"):
            continue
        out[int(name)] = int(fields[1])
    return out


def descendants(pid: int, proc: str = _PROC) -> list[int]:
    """Every live descendant of ``pid`` (children first), by parent pid in ``proc``."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents(proc).items():
        children.setdefault(parent, []).append(child)
    out: list[int] = []
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), ()):
            if c not in out and c != pid:
                out.append(c)
                todo.append(c)
    return out


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def kill_descendants(pid: int, *, deadline_seconds: float = 2.0) -> int:
    """SIGKILL every descendant of ``pid`` (not ``pid``): rounds until a round finds none
    (at most :data:`MAX_ROUNDS`, ``deadline_seconds``). Returns how many were signalled."""
    killed: set[int] = set()
    end = time.monotonic() + deadline_seconds
    for _ in range(MAX_ROUNDS):
        found = [p for p in descendants(pid) if p not in killed]
        if not found:
            break
        for p in found:
            # stopped first, so a process cannot fork while its siblings are killed
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGSTOP)
        for p in found:
            _kill(p)
            killed.add(p)
        if time.monotonic() > end:
            break
    return len(killed)


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``'s descendants, its process group (when it leads one) and ``pid``."""
    kill_descendants(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
    _kill(pid)


def reap_strays(deadline_seconds: float = 2.0) -> int:
    """In a subreaper that waits for no child of its own now: kill every descendant and
    reap every exited child, for at most ``deadline_seconds``. Returns the number reaped."""
    end = time.monotonic() + deadline_seconds
    kill_descendants(os.getpid(), deadline_seconds=deadline_seconds)
    reaped = 0
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break  # no child left
        if pid:
            reaped += 1
            continue
        if time.monotonic() > end:
            break  # a child that does not die (uninterruptible sleep): the next call
        kill_descendants(os.getpid(), deadline_seconds=0.1)  # forked since, or dying
        time.sleep(0.005)
    return reaped


# --- the agent as PID 1 ---------------------------------------------------------------------

#: signals PID 1 hands on to the agent
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1)


def serve_as_init(run: Callable[[], int]) -> int:
    """Run ``run`` in a child when this process is PID 1 (a container whose entrypoint is
    the agent, without an init): this process forwards :data:`FORWARDED` to it and reaps
    every process re-parented to it, and exits with the child's status. Elsewhere ``run``
    runs here. Call before any thread starts."""
    if os.getpid() != 1:
        return run()
    child = os.fork()
    if child == 0:
        try:
            code = run()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # the traceback goes to stderr, as it would have
            import traceback

            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return _init_loop(child)


def _init_loop(child: int) -> int:
    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 0
        except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for clarity
            continue
        except OSError as exc:
            if exc.errno == errno.EINTR:
                continue
            raise
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            # the agent is gone: what it left behind goes too, then PID 1 exits (the
            # container with it)
            kill_descendants(os.getpid())
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(-1, os.WNOHANG)[0] > 0:
                    pass
            return code if code >= 0 else 128 - code
