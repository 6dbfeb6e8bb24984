"""Running one of the field's own tools (infiniband-diags' ``smpquery``, ``perfquery``):
bounded in time and in output, never left behind.

Each call starts the tool in its own process group (a caller's command prefix in front, e.g.
``ibsim-run`` for the simulator, a wrapper or ``sudo -n``), reads at most ``max_bytes`` of its
output, and kills its whole tree at the deadline (every descendant by parent pid, then the
group): a tool stuck in a MAD layer that stopped answering (libibumad blocks without a
timeout while it attaches) costs its timeout, never a thread or a process left running. A
process that left the tree (a double fork whose middle process exited) is the business of
the subreaper its caller runs under (the ``ibpeer`` sampler's supervised child). Used by the
``ibpeer`` sampler (the far end of each cable) and the ``infiniband`` sampler's PMA read
(:mod:`agent.infiniband.pma`).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agent.core.errors import ConfigError
from agent.core.reaper import kill_tree

#: the most output one tool call may print (a PortInfo dump is ~2 KiB)
MAX_OUTPUT_BYTES = 64 * 1024


class ToolError(Exception):
    """A tool ran and failed: non-zero exit, output too large, or it could not start.
    ``reason`` is a :class:`~agent.core.sysfs.ReadIssue` reason (``io``, ``parse``,
    ``permission``)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ToolTimeout(Exception):  # noqa: N818 - an outcome, like agent.core.errors.NoData
    """A tool did not finish within its deadline; its process group was killed."""


@dataclass(frozen=True, slots=True)
class ToolOutput:
    stdout: str
    seconds: float


def check_tools(prefix: Sequence[str], tools: Sequence[str], flag: str) -> None:
    """Raise ``ConfigError`` when a tool ``flag`` runs (or the prefix's command) is not
    installed: checked once, at start, so a missing package is one clear line instead of an
    error every pass."""
    missing = [t for t in (*prefix[:1], *tools) if shutil.which(t) is None]
    if missing:
        raise ConfigError(
            f"{flag} needs {', '.join(missing)} on PATH (Debian/Ubuntu: "
            "infiniband-diags; RHEL: infiniband-diags from rdma-core)"
        )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    kill_tree(proc.pid)
    proc.wait()


def _first_line(data: bytes) -> str:
    for line in data.decode("utf-8", errors="replace").splitlines():
        if line.strip():
            return line.strip()[:160]
    return ""


def run_tool(
    argv: Sequence[str],
    *,
    timeout: float,
    max_bytes: int = MAX_OUTPUT_BYTES,
    env: Mapping[str, str] | None = None,
) -> ToolOutput:
    """Run ``argv``; its stdout (decoded leniently) when it exits 0 within ``timeout``.

    Raises :class:`ToolTimeout` past the deadline and :class:`ToolError` for a non-zero
    exit (``io``; the first line of stderr says why), more than ``max_bytes`` of output
    (``parse``) or a program that cannot be started (``io``, or ``permission``).
    """
    t0 = time.monotonic()
    deadline = t0 + timeout
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env) if env is not None else None,
            start_new_session=True,
            close_fds=True,
        )
    except PermissionError as exc:
        raise ToolError("permission", f"cannot run {argv[0]}: {exc.strerror}") from exc
    except OSError as exc:
        raise ToolError("io", f"cannot run {argv[0]}: {exc.strerror or exc}") from exc
    out: list[bytes] = []
    err: list[bytes] = []
    size = 0
    assert proc.stdout is not None and proc.stderr is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        try:
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    _kill_group(proc)
                    raise ToolTimeout(f"{argv[0]} did not finish in {timeout:g}s")
                for key, _ in sel.select(left):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fileobj)
                        continue
                    key.data.append(chunk)
                    size += len(chunk)
                    if size > max_bytes:
                        _kill_group(proc)
                        raise ToolError("parse", f"{argv[0]} printed more than {max_bytes} bytes")
            left = max(deadline - time.monotonic(), 0.0)
            try:
                code = proc.wait(left)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                raise ToolTimeout(f"{argv[0]} did not exit in {timeout:g}s") from None
        finally:
            proc.stdout.close()
            proc.stderr.close()
    # the tool exited: whatever it left in its group (a stray child) goes too
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    if code != 0:
        why = _first_line(b"".join(err)) or _first_line(b"".join(out)) or f"exit status {code}"
        raise ToolError("io", f"{argv[0]} failed ({code}): {why}")
    return ToolOutput(b"".join(out).decode("utf-8", errors="replace"), time.monotonic() - t0)
