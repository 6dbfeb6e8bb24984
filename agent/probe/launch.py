"""Launching probe workers: one ``python -m agent.probe.worker`` process per rank, each in
its own session, waited for until a deadline (or an abort), the process groups of those still
running killed, and the first rank's records returned, one per size (a size it printed
nothing for gets a ``timeout`` record when the workers were killed at the deadline, else
``crashed``). Used by the probe service and by :func:`agent.probe.worker.run_local`. Never
imports torch: the workers do.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.probe.records import (
    ProbeError,
    ProbeRecord,
    WorkerSpec,
    parse_records,
    resolve_sizes,
    spec_to_json,
)
from agent.probe.worker import apply_env_defaults

log = logging.getLogger(__name__)

#: longest failure detail kept in a record
DETAIL_CHARS = 300
_POLL_SECONDS = 0.05


@dataclass(frozen=True, slots=True)
class WorkerRun:
    """What one launch gave: the first spec's records, one per size (sizes it printed nothing
    for get a ``timeout`` record when killed at the deadline, else ``crashed``), and the wall
    time from launch to the last exit."""

    records: tuple[ProbeRecord, ...]
    duration_seconds: float
    killed: bool = False


def worker_env(base: Mapping[str, str], backend: str) -> dict[str, str]:
    """The environment of a worker: NCCL defaults, this checkout on PYTHONPATH, and for NCCL
    CUDA numbering equal to NVML's (PCI bus order, every GPU visible)."""
    env = dict(base)
    apply_env_defaults(env)
    root = str(Path(__file__).resolve().parents[2])
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
    error = ProbeError(reason, detail[:DETAIL_CHARS])
    return tuple(
        ProbeRecord(
            kind=spec.kind,
            backend=backend,
            world_size=spec.world_size,
            size_bytes=size,
            iterations=spec.iterations,
            warmup=spec.warmup,
            time_seconds=None,
            algbw_bytes_per_second=None,
            busbw_bytes_per_second=None,
            correct=None,
            error=error,
            peer=spec.peer,
            src=spec.src,
            dst=spec.dst,
        )
        for size in (resolve_sizes(spec, backend) if sizes is None else sizes)
    )


def launch_workers(
    specs: Sequence[WorkerSpec],
    *,
    deadline_seconds: float,
    abort: threading.Event | None = None,
    env: Mapping[str, str] | None = None,
    python: str = sys.executable,
) -> WorkerRun:
    """Start ``python -m agent.probe.worker`` once per spec, each in a new session, wait for
    all of them until ``deadline_seconds`` (or ``abort``), kill the process groups of those
    still running, and return the first spec's records (completed per size)."""
    if not specs:
        raise ValueError("no worker to launch")
    first = specs[0]
    child_env = worker_env(os.environ if env is None else env, first.backend)
    began = time.monotonic()
    end = began + deadline_seconds
    killed = aborted = False
    with tempfile.TemporaryDirectory(prefix="fabricscope-probe-") as tmp:
        outs = [Path(tmp, f"{i}.out") for i in range(len(specs))]
        errs = [Path(tmp, f"{i}.err") for i in range(len(specs))]
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for spec, out, err in zip(specs, outs, errs, strict=True):
                with out.open("wb") as out_f, err.open("wb") as err_f:
                    procs.append(
                        subprocess.Popen(
                            [python, "-m", "agent.probe.worker", "--spec", spec_to_json(spec)],
                            stdin=subprocess.DEVNULL,
                            stdout=out_f,
                            stderr=err_f,
                            env=child_env,
                            start_new_session=True,
                        )
                    )
            for proc in procs:
                while proc.poll() is None:
                    if abort is not None and abort.is_set():
                        aborted = True
                        break
                    left = end - time.monotonic()
                    if left <= 0:
                        killed = True
                        break
                    try:
                        proc.wait(timeout=min(_POLL_SECONDS, left))
                    except subprocess.TimeoutExpired:
                        continue
                if killed or aborted:
                    break
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
            if proc.returncode != 0 and not (killed or aborted):
                log.warning(
                    "probe worker %s (rank %s) exited with %s: %s",
                    first.kind,
                    specs[i].rank,
                    proc.returncode,
                    _tail(errs[i]),
                )
        rc = procs[0].returncode if procs else None
        stderr_tail = _tail(errs[0])
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
                f"worker rank {first.rank} exited with code {rc}: {stderr_tail}",
            )
        records = [*records, *failure_records(first, reason, detail, missing)]
    return WorkerRun(tuple(records), duration, killed)
