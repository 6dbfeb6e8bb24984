"""The throughput sampler as the agent runs it: in a supervised child process
(:mod:`agent.core.isolation`), its settings sent as JSON, its inputs with each pass that
changes them, and the state of the child it replaces before its first pass."""

from __future__ import annotations

import json
from collections.abc import Callable

from agent.config import ThroughputFile, ThroughputSettings
from agent.core.isolation import ChildSpec, IsolatedSampler
from agent.throughput.records import ThroughputInputs, ThroughputResume, ThroughputSnapshot
from agent.throughput.sampler import ThroughputSampler
from agent.throughput.sources import nothing_to_read


def settings_json(settings: ThroughputSettings) -> str:
    """The settings as one JSON string: what travels to the child (plain values only)."""
    return json.dumps(
        {
            "files": [[f.pattern, f.job] for f in settings.files],
            "job": settings.job,
            "pod_logs": settings.pod_logs,
            "pods": settings.pods,
            "namespaces": list(settings.namespaces),
            "selector": settings.selector,
            "max_line_bytes": settings.max_line_bytes,
            "initial_bytes": settings.initial_bytes,
            "isolate": settings.isolate,
            "stream_cpu_seconds": settings.stream_cpu_seconds,
            "max_open_files": settings.max_open_files,
        }
    )


def settings_from_json(text: str) -> ThroughputSettings:
    d = json.loads(text)
    return ThroughputSettings(
        files=tuple(ThroughputFile(p, j) for p, j in d["files"]),
        job=d["job"],
        pod_logs=d["pod_logs"],
        pods=d["pods"],
        namespaces=tuple(d["namespaces"]),
        selector=d["selector"],
        max_line_bytes=int(d["max_line_bytes"]),
        initial_bytes=int(d["initial_bytes"]),
        isolate=bool(d["isolate"]),
        stream_cpu_seconds=float(d["stream_cpu_seconds"]),
        max_open_files=int(d["max_open_files"]),
    )


def child_sampler(
    *, settings: str, pass_seconds: float, count_from: float | None = None
) -> ThroughputSampler:
    """The sampler as the agent's child process builds it (:mod:`agent.core.isolation`); its
    inputs arrive with each pass that changes them (:class:`ThroughputInputs`), and the
    state of the child it replaces, if any, before its first pass
    (:class:`ThroughputResume`)."""
    return ThroughputSampler(
        settings_from_json(settings),
        pass_seconds=pass_seconds,
        count_from=count_from,
        resumable=True,
    )


def _resume_of(snapshot: object) -> ThroughputResume | None:
    return snapshot.resume if isinstance(snapshot, ThroughputSnapshot) else None


def isolated_sampler(
    settings: ThroughputSettings,
    timeout_seconds: float,
    inputs: Callable[[], ThroughputInputs],
    *,
    count_from: float | None = None,
    memory_limit: int | None = None,
) -> IsolatedSampler:
    """The throughput sampler in a supervised child process: a pass is given
    ``timeout_seconds`` before its child is killed (``hung``); the child stops starting
    streams after half of it, so a slow pass ends with the streams it reached. A child that
    replaces one carries on from the last snapshot's :class:`ThroughputResume`.
    ``count_from``: the agent's start (see :class:`ThroughputSampler`); ``memory_limit``:
    the pod's, of which the child's memory ceiling is a share."""
    return IsolatedSampler(
        "throughput",
        ChildSpec(
            "agent.throughput.child:child_sampler",
            {
                "settings": settings_json(settings),
                "pass_seconds": timeout_seconds / 2,
                "count_from": count_from,
            },
        ),
        timeout_seconds=timeout_seconds,
        inputs=inputs,
        precheck=lambda: nothing_to_read(settings),
        resume=_resume_of,
        memory_limit=memory_limit,
    )
