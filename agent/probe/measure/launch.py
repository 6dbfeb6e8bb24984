"""Launching probe workers: one ``python -m agent.probe.measure.worker`` process per rank, each in
its own session, waited for until a deadline (or an abort), the process groups of those still
running killed, and the first rank's records returned, one per size (a size it printed
nothing for gets a ``timeout`` record when the workers were killed at the deadline, else
``crashed``). Used by the probe service, ``fabricscope probe`` and :func:`run_local` (all
ranks of a single-node probe on this host). Never imports torch: the workers do.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from agent.probe.measure.records import (
    DETAIL_CHARS,
    GPU_DEFAULT_SIZES,
    ProbeRecord,
    WorkerSpec,
    failure_record,
    parse_records,
    resolve_sizes,
    spec_to_json,
)
from agent.probe.measure.worker import apply_env_defaults

log = logging.getLogger(__name__)

_POLL_SECONDS = 0.05

#: what a worker imports beyond this package (the ``probe`` extra of the package)
WORKER_MODULES = ("torch",)
#: how to get them, for the one-line error that names what is missing
PROBE_EXTRA_HINT = (
    "install the probe extra: `pip install 'fabricscope[probe]'` (from a checkout: "
    "`.venv/bin/pip install -c constraints.txt -e '.[probe]'`)"
)


def missing_worker_modules(also: Sequence[str] = ()) -> tuple[str, ...]:
    """Modules a worker needs (and ``also``) that this interpreter, the workers' too, cannot
    import: looked up, not imported (torch takes a second to import)."""
    import importlib.util

    return tuple(m for m in (*WORKER_MODULES, *also) if importlib.util.find_spec(m) is None)


@dataclass(frozen=True, slots=True)
class WorkerRun:
    """What one launch gave: the first spec's records, one per size (sizes it printed nothing
    for get a ``timeout`` record when killed at the deadline, else ``crashed``), and the wall
    time from launch to the last exit."""

    records: tuple[ProbeRecord, ...]
    duration_seconds: float
    killed: bool = False


class Launcher(Protocol):
    """Runs one worker process per spec and returns the first spec's records."""

    def __call__(
        self,
        specs: Sequence[WorkerSpec],
        *,
        deadline_seconds: float,
        abort: threading.Event | None = None,
    ) -> WorkerRun: ...


def worker_env(base: Mapping[str, str], backend: str) -> dict[str, str]:
    """The environment of a worker: NCCL defaults, this checkout on PYTHONPATH, and for NCCL
    CUDA numbering equal to NVML's (PCI bus order, every GPU visible)."""
    env = dict(base)
    apply_env_defaults(env)
    root = str(Path(__file__).resolve().parents[3])
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = root if not path else f"{root}{os.pathsep}{path}"
    if backend == "nccl":
        env.pop("CUDA_VISIBLE_DEVICES", None)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the worker's whole process group (its session: ``start_new_session``), then
    reap the worker. Called only while the worker is unreaped, so the group id is still
    its own."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError as exc:  # not ours any more: kill the process we know at least
        log.warning("probe: cannot kill worker group %s: %s", proc.pid, exc)
        proc.kill()
    proc.wait()


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError as exc:
        return f"(stderr unreadable: {exc.strerror})"
    return lines[-1][:DETAIL_CHARS] if lines else ""


def failure_records(
    spec: WorkerSpec, reason: str, detail: str, sizes: Sequence[int] | None = None
) -> tuple[ProbeRecord, ...]:
    """One failure record per size of ``spec`` (or of ``sizes``): nothing was measured."""
    backend = spec.backend if spec.backend != "auto" else ("nccl" if spec.devices else "gloo")
    return tuple(
        failure_record(spec, backend, size, reason, detail[:DETAIL_CHARS])
        for size in (resolve_sizes(spec, backend) if sizes is None else sizes)
    )


#: after one rank exits with an error, the others get this long to finish before they are
#: stopped (a collective cannot complete without the failed rank; without this they would
#: wait for the rendezvous or NCCL timeout)
FAILED_RANK_GRACE_SECONDS = 2.0


def _wait(
    procs: Sequence[subprocess.Popen[bytes]], end: float, abort: threading.Event | None
) -> tuple[int | None, str | None]:
    """Wait until every worker exited; return (index of the first that exited with an error,
    or None; why waiting stopped early: ``deadline``, ``abort``, ``rank_failed``, or None
    when all exited by themselves)."""
    failed: int | None = None
    give_up = end
    while [p.poll() for p in procs].count(None):  # poll every one: it sets returncode
        now = time.monotonic()
        if abort is not None and abort.is_set():
            return failed, "abort"
        if now >= end:
            return failed, "deadline"
        if failed is None:
            failed = next((i for i, p in enumerate(procs) if p.returncode not in (None, 0)), None)
            if failed is not None:
                give_up = min(end, now + FAILED_RANK_GRACE_SECONDS)
        if failed is not None and now >= give_up:
            return failed, "rank_failed"
        time.sleep(_POLL_SECONDS)
    return failed, None


def launch_workers(
    specs: Sequence[WorkerSpec],
    *,
    deadline_seconds: float,
    abort: threading.Event | None = None,
    env: Mapping[str, str] | None = None,
    python: str = sys.executable,
) -> WorkerRun:
    """Start ``python -m agent.probe.measure.worker`` once per spec, each in a new session, wait for
    all of them until ``deadline_seconds`` (or ``abort``, or
    :data:`FAILED_RANK_GRACE_SECONDS` after one exits with an error), kill the process
    groups of those still running, and return the first spec's records (completed per
    size; sizes with none name the failed rank and its last stderr line)."""
    if not specs:
        raise ValueError("no worker to launch")
    first = specs[0]
    child_env = worker_env(os.environ if env is None else env, first.backend)
    began = time.monotonic()
    end = began + deadline_seconds
    with tempfile.TemporaryDirectory(prefix="fabricscope-probe-") as tmp:
        outs = [Path(tmp, f"{i}.out") for i in range(len(specs))]
        errs = [Path(tmp, f"{i}.err") for i in range(len(specs))]
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for spec, out, err in zip(specs, outs, errs, strict=True):
                with out.open("wb") as out_f, err.open("wb") as err_f:
                    procs.append(
                        subprocess.Popen(
                            [
                                python,
                                "-m",
                                "agent.probe.measure.worker",
                                "--spec",
                                spec_to_json(spec),
                            ],
                            stdin=subprocess.DEVNULL,
                            stdout=out_f,
                            stderr=err_f,
                            env=child_env,
                            start_new_session=True,
                        )
                    )
            failed, stopped = _wait(procs, end, abort)
            killed, aborted = stopped == "deadline", stopped == "abort"
        finally:
            for proc in procs:
                if proc.poll() is None:
                    _kill_group(proc)
        duration = time.monotonic() - began
        text = outs[0].read_text(errors="replace")
        records, problems = parse_records(text)
        for problem in problems:
            log.warning("probe worker printed a bad record: %s", problem)
        if killed:
            log.warning(
                "probe %s: workers killed at the %g s deadline", first.kind, deadline_seconds
            )
        for i, proc in enumerate(procs):
            if proc.returncode != 0 and stopped is None:
                log.warning(
                    "probe worker %s (rank %s) exited with %s: %s",
                    first.kind,
                    specs[i].rank,
                    proc.returncode,
                    _tail(errs[i]),
                )
        culprit = 0 if failed is None else failed
        rc = procs[culprit].returncode if procs else None
        stderr_tail = _tail(errs[culprit])
        if stopped == "rank_failed":
            log.warning(
                "probe %s: worker rank %s exited with %s: %s; stopped the other ranks",
                first.kind,
                specs[culprit].rank,
                rc,
                stderr_tail,
            )
    backend = records[0].backend if records else first.backend
    expected = resolve_sizes(first, backend if backend != "auto" else "gloo")
    missing = expected[len(records) :]
    if missing:
        if killed:
            reason = "timeout"
            detail = f"worker killed at the probe deadline ({deadline_seconds:g} s)"
        elif aborted:
            reason, detail = "crashed", "worker killed: the agent is stopping"
        else:
            reason, detail = (
                "crashed",
                f"worker rank {specs[culprit].rank} exited with code {rc}: {stderr_tail}",
            )
        records = [*records, *failure_records(first, reason, detail, missing)]
    return WorkerRun(tuple(records), duration, killed)


def free_port(addr: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``addr`` a moment ago (for a local rendezvous)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((addr, 0))
        port: int = sock.getsockname()[1]
        return port


def run_local(
    spec_base: WorkerSpec,
    world_size: int,
    *,
    deadline_seconds: float | None = None,
    env: Mapping[str, str] | None = None,
    python: str = sys.executable,
) -> list[ProbeRecord]:
    """Run all ``world_size`` ranks of a single-node probe as worker subprocesses on this
    host and return rank 0's records, one per size.

    Each rank gets ``spec_base`` with its ``rank``, ``world_size``, ``local_rank = rank``
    and, when ``spec_base.master_port`` is 0, a free port. Workers still running at the
    deadline (default: ``timeout_seconds x (sizes + 3) + 30``) are killed; sizes rank 0
    printed no record for get a synthesized ``timeout`` (killed) or ``crashed`` record.
    With ``backend="auto"`` and no output at all, those records guess the backend from
    ``devices`` (NCCL when devices are named), so name the backend where it is known.
    """
    port = spec_base.master_port or free_port(spec_base.master_addr)
    specs = [
        replace(spec_base, rank=r, world_size=world_size, local_rank=None, master_port=port)
        for r in range(world_size)
    ]
    if deadline_seconds is None:
        planned = len(spec_base.sizes or GPU_DEFAULT_SIZES)
        deadline_seconds = spec_base.timeout_seconds * (planned + 3) + 30.0
    run = launch_workers(specs, deadline_seconds=deadline_seconds, env=env, python=python)
    return list(run.records)
