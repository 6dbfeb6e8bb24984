"""Runs a sampler in a supervised child process, so that a crash or a hang inside a vendor C
library (NVML) costs that sampler's pass, never the agent serving ``/metrics``.

The parent side
    :class:`IsolatedSampler` implements the :class:`~agent.core.sampler.Sampler` protocol.
    Its first ``sample()`` starts ``python -S -m agent.core.childproc`` (a fresh interpreter:
    no inherited threads, fds, signal handlers or NVML state, no start-up hooks of the Python
    environment: :func:`child_path`; :mod:`agent.core.childproc` is the child's side) and
    sends it a :class:`ChildSpec` naming a factory (``"agent.nvml.sampler:child_sampler"``)
    and its keyword arguments; the child builds the sampler once and keeps it (and so NVML's
    initialisation, caches and rotation) between passes.
    Each ``sample()`` sends one request and waits for the answer: the pass's pickled
    snapshot, ``NoData`` (raised again here), a :class:`~agent.core.errors.SamplerFailure`
    the sampler raised (raised again here with its reason: an ibpeer pass's ``timeout``), or
    another exception's description (raised here as :class:`ChildError`, which the runner
    counts as ``exception``; the child lives on).
    A sampler whose child needs the agent's state each pass (the throughput sampler needs
    the pods holding a GPU and the pod index) is given ``inputs``: a callable whose value
    travels with a request whenever it differs from the last one sent (``!=``; always after
    a child starts), and is handed to the child sampler's ``accept_inputs(value)`` before
    its pass.

Failures, as :class:`~agent.core.errors.SamplerFailure` (the runner counts each by its reason)
    * ``crashed``: the child died during a pass or between two (a segfault or ``abort()`` in
      the library: the message names the signal, ``killed by SIGSEGV``).
    * ``hung``: no answer within the sampling timeout; the child is killed (SIGKILL) instead
      of leaving a thread inside the library. A fresh child's first pass (interpreter start,
      ``nvmlInit``, the first full read) is given ``start_timeout_seconds`` instead.
    * ``backoff``: after either, the child is restarted on the first pass at least
      ``backoff`` seconds later (1 s, doubling up to 60 s, back to 1 s after a successful
      pass); passes before that fail at once with this reason.
    * ``memory_ceiling``: the child reached its memory ceiling (:mod:`agent.core.ceiling`: its
      share of the pod's limit, set in the child by the kernel's ``RLIMIT_DATA`` before it
      builds its sampler): a pass raised ``MemoryError`` or left it above 90 % of the
      ceiling; the child answers so and exits, and is restarted after the backoff. A library
      that dereferences the NULL its allocator returned at the ceiling dies by a signal
      instead of answering: a child killed by SIGSEGV, SIGBUS or SIGABRT while its counted
      memory (read every 50 ms while a pass runs) was last above 90 % of its ceiling counts
      here too, not as ``crashed``.
    ``restarts_total`` counts children started to replace one that crashed, hung or reached
    its ceiling.

Every exchange has a deadline
    A pass is one exchange: the frames to the child (a fresh child's ``init`` and
    ``resume``, the request with its inputs) and the answer share one deadline (the
    sampling timeout, ``start_timeout_seconds`` for a fresh child). The pipe to the child is
    non-blocking: a child that stops reading (stopped by SIGSTOP, stuck in a library) while
    a large frame is sent (a pod index of 110 pods is ~190 KB, nearly three pipe buffers)
    costs the deadline, then the child is killed and replaced like any ``hung`` one. Killing
    is ``SIGKILL`` to the child's whole tree (:mod:`agent.core.reaper`: it runs in its own
    session and is the subreaper of what it starts, so nothing it started can slip out of
    that tree by ``setsid`` or a double fork), and the wait for it to go is bounded too:
    a child that does not die (uninterruptible sleep) is left to a background thread to
    reap and the sampler starts a new one.

State that outlives a child
    A sampler that counts what it read (the throughput sampler's lines and NCCL warnings)
    loses its counts with its child, and a fresh child would read again what the dead one
    had counted. Given ``resume`` (a function of the latest snapshot), the parent keeps that
    function's value from every successful pass and hands it to each child that replaces
    one (the ``resume`` frame, given to the child sampler's ``accept_resume(value)`` before
    its first pass): the new child carries on from the last pass the agent exported.

No hardware
    ``NoData`` from the child (no driver, no GPU) is quiet: the child is shut down and
    ``NoData`` is answered without one for ``nodata_recheck_seconds`` (60 s), so a node
    without GPUs keeps no second process and pays one interpreter start per minute.

The pipe
    Frames both ways (:mod:`agent.core.frames`) are a 4-byte big-endian length and a pickle
    of a tuple of plain values and the samplers' frozen snapshot dataclasses. The child
    writes frames to a duplicate of its stdout and points its fd 1 at stderr, so a library
    printing to stdout cannot corrupt the stream; its log lines (same level and format as
    the agent's) and faulthandler's traceback of a crash go to the agent's stderr. The child
    exits within a second of the agent's death, even while hung (a thread of its own watches
    the parent pid); a pass stuck in C code that holds the GIL starves that thread, so
    faulthandler's watchdog (a C thread) also ends any pass running
    ``ORPHAN_GRACE_SECONDS`` past its deadline.
    A ``precheck`` (cheap, in the agent) that raises ``NoData`` answers it without starting
    a child (the throughput sampler on a node with no log to read).
    ``close()`` closes the pipe; the child closes its sampler
    (``nvmlShutdown``) and exits, and is killed after ``close_grace_seconds``.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, cast

from agent.core.ceiling import NEAR, child_ceiling, data_bytes
from agent.core.childproc import child_main
from agent.core.errors import NoData, SamplerFailure
from agent.core.frames import (
    MAX_FRAME_BYTES,
    Died,
    FrameReader,
    Hung,
    Setting,
    encode,
    read_frame,
    write_all,
)
from agent.core.logsetup import JsonFormatter
from agent.core.procstat import ProcessStats
from agent.core.reaper import kill_tree
from agent.core.sampler import Snapshot

if TYPE_CHECKING:
    import subprocess

log = logging.getLogger(__name__)

#: seconds past its pass deadline a child ends itself (faulthandler's watchdog), for when the
#: agent that should have killed it is gone
ORPHAN_GRACE_SECONDS = 5.0
#: seconds to wait for a SIGKILLed child to go before leaving it to a background thread
KILL_WAIT_SECONDS = 2.0
#: the package root, put first on the child's PYTHONPATH so it runs the agent's own code
_ROOT = str(Path(__file__).resolve().parent.parent)


def child_path(pythonpath: str | None = None) -> str:
    """The child's ``PYTHONPATH``: the package root, ``pythonpath`` (the environment's), then
    the agent's own module search path as it is. The child runs without :mod:`site`
    (``python -S``), so it finds exactly the modules the agent finds and runs no start-up
    hook (``.pth`` import lines, ``sitecustomize``) of the Python environment it was
    installed in: in an environment whose hooks import at start (the H200 machines' torch
    environment: certifi, zipfile, importlib.resources...) that is several MiB per child."""
    entries = (_ROOT, *(pythonpath or "").split(os.pathsep), *sys.path)
    return os.pathsep.join(dict.fromkeys(p for p in entries if p))


__all__ = [
    "KILL_WAIT_SECONDS",
    "MAX_FRAME_BYTES",
    "ORPHAN_GRACE_SECONDS",
    "ChildError",
    "ChildSpec",
    "ChildStats",
    "IsolatedSampler",
    "Setting",
    "child_main",
    "child_path",
    "describe_exit",
    "encode",
    "expect",
    "read_frame",
]

T = TypeVar("T")
#: no inputs sent to the current child yet
_UNSENT = object()


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """What the child runs: ``factory`` is ``"module:function"``, called with ``kwargs`` to
    build the sampler. Only plain values travel to the child."""

    factory: str
    kwargs: Mapping[str, Setting] = field(default_factory=dict)


#: the child as it reported itself after its latest pass (pid, CPU seconds, resident bytes,
#: open file descriptors, start time)
ChildStats = ProcessStats


class ChildError(RuntimeError):
    """The sampler in the child raised; the message is the exception's ``repr``."""


def expect(answer: object, kind: type[T]) -> T:
    """``answer`` (what a child sent) as a ``kind``; :class:`ChildError` when it is not."""
    if not isinstance(answer, kind):
        raise ChildError(f"expected a {kind.__name__}, got {type(answer).__name__}")
    return answer


def describe_exit(returncode: int | None) -> str:
    """``killed by SIGSEGV`` / ``exited with status 3`` / ``still running``."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


# -- the parent side ----------------------------------------------------------------------

#: the exits of a library that used the NULL its allocator returned (or aborted on it)
_STARVED = frozenset({-signal.SIGSEGV, -signal.SIGBUS, -signal.SIGABRT})


def _log_settings() -> tuple[str, str]:
    root = logging.getLogger()
    level = logging.getLevelName(root.getEffectiveLevel()).lower()
    json_format = any(isinstance(h.formatter, JsonFormatter) for h in root.handlers)
    return level, "json" if json_format else "text"


class IsolatedSampler:
    """A sampler run in a supervised child process (see the module docstring)."""

    def __init__(
        self,
        name: str,
        spec: ChildSpec,
        *,
        timeout_seconds: float,
        start_timeout_seconds: float = 30.0,
        backoff_seconds: float = 1.0,
        max_backoff_seconds: float = 60.0,
        nodata_recheck_seconds: float = 60.0,
        close_grace_seconds: float = 2.0,
        one_shot: bool = False,
        env: Mapping[str, str] | None = None,
        inputs: Callable[[], object] | None = None,
        precheck: Callable[[], None] | None = None,
        resume: Callable[[Snapshot], object] | None = None,
        memory_limit: int | None = None,
        ceiling_extra: int = 0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._name = name
        #: the child's memory ceiling in bytes (RLIMIT_DATA, set in the child): its share of
        #: the pod's ``memory_limit`` (None: unknown), its floor raised by ``ceiling_extra``
        self.memory_ceiling_bytes = child_ceiling(name, memory_limit, extra=ceiling_extra)
        self._inputs = inputs
        self._resume = resume
        #: the resume value of the latest successful pass (None: nothing to hand on)
        self._resume_value: object = None
        self._pending: list[tuple[object, ...]] = []  # frames a fresh child gets first
        self._precheck = precheck
        self._sent: object = _UNSENT
        self.spec = spec
        self.timeout_seconds = timeout_seconds
        self.start_timeout_seconds = max(start_timeout_seconds, timeout_seconds)
        self._backoff_min = backoff_seconds
        self._backoff_max = max_backoff_seconds
        self._backoff = backoff_seconds
        self._nodata_recheck = nodata_recheck_seconds
        self._grace = close_grace_seconds
        self._one_shot = one_shot  # a command's single pass: no restart to announce
        self._env = dict(os.environ if env is None else env)
        self._mono = monotonic
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: FrameReader | None = None
        self._fresh = True  # the child has not answered yet
        self._retry_at = 0.0
        self._replace = False  # the next child replaces one that failed
        self._last_failure = ""
        self._nodata_until = 0.0
        self._nodata = ""
        #: children started to replace one that crashed or hung
        self.restarts_total = 0
        #: the child as it reported itself after its latest pass
        self.last_stats: ChildStats | None = None

    @property
    def name(self) -> str:
        return self._name

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return None if proc is None else proc.pid

    @property
    def child_stats(self) -> ProcessStats | None:
        """The running child as it reported itself after its latest pass; None while no
        child runs (before the first pass, after a failure, on a node without hardware)."""
        stats, proc = self.last_stats, self._proc
        if proc is None or stats is None or stats.pid != proc.pid:
            return None
        return stats

    def call_deadline_seconds(self) -> float:
        """How long the next ``sample()`` may take before it kills its child and returns:
        the runner waits that long (plus a margin) instead of its own timeout."""
        if self._proc is None or self._fresh:
            return self.start_timeout_seconds
        return self.timeout_seconds

    def sample(self) -> Snapshot:
        with self._lock:
            now = self._mono()
            if now < self._nodata_until:
                raise NoData(self._nodata)
            if self._precheck is not None:
                try:
                    self._precheck()
                except NoData:
                    self._stop_child()  # nothing to sample: no second process kept
                    raise
            if self._proc is None:
                if now < self._retry_at:
                    raise SamplerFailure(
                        "backoff",
                        f"child restarts in {self._retry_at - now:.1f}s "
                        f"(after: {self._last_failure})",
                    )
                self._spawn()
            return self._ask()

    def _spawn(self) -> None:
        import subprocess  # here, not at the top: the children import this module's names

        env = dict(self._env)
        env["PYTHONPATH"] = child_path(env.get("PYTHONPATH"))
        proc = subprocess.Popen(
            [sys.executable, "-S", "-m", "agent.core.childproc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
            start_new_session=True,  # its own group: a terminal's signals are the agent's
        )
        assert proc.stdout is not None and proc.stdin is not None
        os.set_blocking(proc.stdin.fileno(), False)  # every write has a deadline
        self._proc = proc
        self._reader = FrameReader(proc.stdout.fileno())
        self._fresh = True
        self._sent = _UNSENT
        if self._replace:
            self.restarts_total += 1
            self._replace = False
        log.debug("sampler %s: started child process %d", self._name, proc.pid)
        level, fmt = _log_settings()
        self._pending = [
            (
                "init",
                self.spec.factory,
                dict(self.spec.kwargs),
                level,
                fmt,
                os.getpid(),
                self.start_timeout_seconds + ORPHAN_GRACE_SECONDS,
                self.timeout_seconds + ORPHAN_GRACE_SECONDS,
                self.memory_ceiling_bytes,
            )
        ]
        if self._resume_value is not None:
            self._pending.append(("resume", self._resume_value))

    def _send(self, message: tuple[object, ...], deadline: float) -> None:
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        write_all(proc.stdin.fileno(), encode(message), deadline)

    def _ask(self) -> Snapshot:
        proc, reader = self._proc, self._reader
        assert proc is not None and reader is not None
        limit = self.call_deadline_seconds()
        deadline = time.monotonic() + limit
        request: tuple[object, ...] = ("sample",)
        value: object = _UNSENT
        if self._inputs is not None:
            value = self._inputs()
            if self._sent is _UNSENT or value != self._sent:
                request = ("sample", value)
        delivered = False
        seen = [0]  # the child's counted memory, last read while it ran the pass
        try:
            pending, self._pending = self._pending, []
            for frame in (*pending, request):
                self._send(frame, deadline)
            delivered = True
            if value is not _UNSENT:
                self._sent = value
            reply = reader.read(max(deadline - time.monotonic(), 0.0), self._watch(proc.pid, seen))
        except (BrokenPipeError, Died) as exc:
            returncode = self._reap(kill_after=1.0)
            how = describe_exit(returncode)
            ceiling = self.memory_ceiling_bytes
            if returncode in _STARVED and ceiling and seen[0] > NEAR * ceiling:
                detail = (
                    f"child process {proc.pid} {how} with {seen[0] >> 20} MiB of its memory "
                    f"ceiling of {ceiling >> 20} MiB in use (a library that got no memory)"
                )
                raise self._failed("memory_ceiling", detail) from None
            raise self._failed("crashed", f"child process {proc.pid} {how} ({exc})") from None
        except Hung:
            self._reap(kill_after=0.0)
            what = "gave no answer" if delivered else "did not read its request"
            raise self._failed(
                "hung", f"child process {proc.pid} {what} in {limit:g}s; killed"
            ) from None
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as exc:
            self._reap(kill_after=0.0)
            detail = f"child process {proc.pid} sent garbage: {exc!r}"
            raise self._failed("crashed", detail) from None
        self._fresh = False
        kind = reply[0]
        stats = reply[-1]
        if isinstance(stats, tuple) and len(stats) == 5:
            self.last_stats = ProcessStats(
                int(stats[0]),
                float(stats[1]),
                int(stats[2]),
                None if stats[3] is None else int(stats[3]),
                None if stats[4] is None else float(stats[4]),
            )
        if kind == "ok":
            self._backoff = self._backoff_min
            snapshot = cast(Snapshot, reply[1])
            if self._resume is not None:
                self._resume_value = self._resume(snapshot)
            return snapshot
        if kind == "nodata":
            self._nodata = str(reply[1])
            self._nodata_until = self._mono() + self._nodata_recheck
            self._stop_child()
            raise NoData(self._nodata)
        if kind == "error":
            raise ChildError(str(reply[1]))
        if kind == "failure" and len(reply) > 3:
            raise SamplerFailure(str(reply[1]), str(reply[2]))
        if kind == "ceiling":  # the child exits after this answer
            self._reap(kill_after=1.0)
            ceiling = self.memory_ceiling_bytes
            what = f"its memory ceiling of {ceiling >> 20} MiB" if ceiling else "no memory"
            detail = f"child process {proc.pid} reached {what} ({reply[1]})"
            raise self._failed("memory_ceiling", detail)
        self._reap(kill_after=0.0)
        raise self._failed("crashed", f"child process {proc.pid} answered {kind!r}")

    def _watch(self, pid: int, seen: list[int]) -> Callable[[], None] | None:
        """What the wait for a pass's answer calls: the child's counted memory, last read,
        into ``seen[0]`` (None without a ceiling: nothing to compare it with)."""
        if not self.memory_ceiling_bytes:
            return None

        def tick() -> None:
            used = data_bytes(pid)
            if used is not None:
                seen[0] = used

        return tick

    def _failed(self, reason: str, detail: str) -> SamplerFailure:
        delay = self._backoff
        self._backoff = min(self._backoff * 2, self._backoff_max)
        self._retry_at = self._mono() + delay
        self._replace = True
        self._last_failure = detail
        if self._one_shot:
            return SamplerFailure(reason, detail)
        return SamplerFailure(reason, f"{detail}; restarting it in {delay:.0f}s")

    def _reap(self, kill_after: float) -> int | None:
        """Forget the child: wait ``kill_after`` seconds for it to exit, then SIGKILL its
        tree; wait at most :data:`KILL_WAIT_SECONDS` for it to go."""
        import subprocess

        proc, self._proc, self._reader = self._proc, None, None
        self._pending = []
        if proc is None:
            return None
        try:
            returncode = proc.wait(kill_after) if kill_after > 0 else proc.poll()
        except subprocess.TimeoutExpired:
            returncode = None
        if returncode is None:
            kill_tree(proc.pid)
            try:
                proc.wait(KILL_WAIT_SECONDS)
            except subprocess.TimeoutExpired:
                log.warning(
                    "sampler %s: child process %d did not go within %.0fs of SIGKILL; "
                    "starting another",
                    self._name,
                    proc.pid,
                    KILL_WAIT_SECONDS,
                )
                threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError as exc:  # the pipe to a dead child: nothing left to flush
                    log.debug("sampler %s: closing a pipe: %s", self._name, exc)
        return returncode

    def _stop_child(self) -> None:
        """Close the pipe; the child closes its sampler and exits (killed after the grace)."""
        proc = self._proc
        if proc is None:
            return
        if proc.stdin is not None:
            try:
                proc.stdin.close()
            except OSError as exc:  # a child that already died: nothing to flush to
                log.debug("sampler %s: closing the pipe: %s", self._name, exc)
        returncode = self._reap(kill_after=self._grace)
        if returncode is None:
            log.warning(
                "sampler %s: child process %d did not exit within %.1fs of close; killed",
                self._name,
                proc.pid,
                self._grace,
            )

    def close(self) -> None:
        """Stop the child (its sampler closes first). A pass still waiting is cut short."""
        if not self._lock.acquire(timeout=self._grace):
            proc = self._proc
            if proc is not None:  # the pass in flight fails and reaps it
                kill_tree(proc.pid)
            return
        try:
            self._stop_child()
        finally:
            self._lock.release()
