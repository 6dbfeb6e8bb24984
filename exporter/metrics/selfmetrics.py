"""The agent's own series: build info and per-sampler health from the runner."""

from __future__ import annotations

import platform
from collections.abc import Mapping

from agent import __version__
from agent.core.ceiling import plan, running_children
from agent.core.procstat import ProcessStats
from agent.core.runner import CHILD_REASONS, ERROR_REASONS, SamplerStatus
from exporter.metrics.spec import Families, MetricSpec

BUILD_INFO = MetricSpec(
    "fabricscope_build_info",
    "gauge",
    "A constant 1, labelled with the fabricscope version and the Python version.",
    ("version", "python_version"),
)
SAMPLER_SUCCESS = MetricSpec(
    "fabricscope_sampler_success",
    "gauge",
    "1 if the sampler's latest attempt completed (absent hardware counts as success), else 0.",
    ("sampler",),
)
SAMPLER_HARDWARE_PRESENT = MetricSpec(
    "fabricscope_sampler_hardware_present",
    "gauge",
    "1 if the sampler found its hardware on its latest successful attempt, 0 if it found none.",
    ("sampler",),
)
SAMPLER_DURATION = MetricSpec(
    "fabricscope_sampler_duration_seconds",
    "gauge",
    "Wall time of the sampler's latest attempt (the timeout, when it timed out).",
    ("sampler",),
    unit="seconds",
)
SAMPLER_CPU = MetricSpec(
    "fabricscope_sampler_cpu_seconds_total",
    "counter",
    "CPU time the agent's main process spent in the sampler's finished passes (each pass runs "
    "in a thread of its own: its reads, parsing and building here). A sampler run in a child "
    "process (nvml, throughput, ibpeer, ras) spends its passes' CPU there, in "
    "process_cpu_seconds_total{child=...}; this is then what receiving its answer costs.",
    ("sampler",),
    unit="seconds",
)
SAMPLER_LAST_SUCCESS = MetricSpec(
    "fabricscope_sampler_last_success_timestamp_seconds",
    "gauge",
    "Unix time of the sampler's latest successful attempt.",
    ("sampler",),
    unit="seconds",
)
SAMPLER_ATTEMPTS = MetricSpec(
    "fabricscope_sampler_attempts_total",
    "counter",
    "Sampling attempts made, successful or not.",
    ("sampler",),
)
SAMPLER_ERRORS = MetricSpec(
    "fabricscope_sampler_errors_total",
    "counter",
    "Failed sampling attempts, by reason: exception, timeout, still_running (the previous "
    "call was still hung, so this pass was skipped); for a sampler run in a child process "
    "(nvml, throughput, ibpeer, ras): crashed (the child died, e.g. a segfault in the driver "
    "library), hung (killed at the timeout), memory_ceiling (the child reached its memory "
    "ceiling, its share of --agent.memory-limit, and was ended), backoff (not restarted yet).",
    ("sampler", "reason"),
)
SAMPLER_READ_ERRORS = MetricSpec(
    "fabricscope_sampler_read_errors_total",
    "counter",
    "Files a sampler could not read or parse (the one series is absent, the rest carry on), by "
    "reason: vanished, permission, io, parse, unsupported.",
    ("sampler", "reason"),
)
SAMPLER_READ_ERRORS_LAST = MetricSpec(
    "fabricscope_sampler_read_errors",
    "gauge",
    "Files that could not be read or parsed during the sampler's latest successful pass.",
    ("sampler",),
    fold="Below full, only samplers whose latest pass had one (a 0 is left out; "
    "fabricscope_sampler_read_errors_total counts them all).",
)

SAMPLER_RENDER_ERRORS = MetricSpec(
    "fabricscope_sampler_render_errors_total",
    "counter",
    "Times a sampler's state could not be rendered into metrics (a bug: its series were "
    "withdrawn until the next pass; the log has the traceback).",
    ("sampler",),
)

SAMPLER_CHILD_RESTARTS = MetricSpec(
    "fabricscope_sampler_child_restarts_total",
    "counter",
    "Child processes started to replace one that crashed, hung or reached its memory ceiling, "
    "for the samplers run in a supervised child process (nvml, throughput, ibpeer, ras); "
    "absent for samplers that run in the agent.",
    ("sampler",),
)

_MAIN = 'the agent\'s main process has child="" (no label)'
PROCESS_RESIDENT = MetricSpec(
    "process_resident_memory_bytes",
    "gauge",
    f"Resident memory of the agent's processes, each child's as of its latest pass; {_MAIN}.",
    ("child",),
    unit="bytes",
)
PROCESS_CPU = MetricSpec(
    "process_cpu_seconds_total",
    "counter",
    f"User and system CPU time the agent's processes spent; {_MAIN}.",
    ("child",),
    unit="seconds",
)
PROCESS_OPEN_FDS = MetricSpec(
    "process_open_fds",
    "gauge",
    f"Open file descriptors of the agent's processes; {_MAIN}.",
    ("child",),
)
PROCESS_START = MetricSpec(
    "process_start_time_seconds",
    "gauge",
    f"Unix time the agent's processes started (a child's changes when it is replaced); {_MAIN}.",
    ("child",),
    unit="seconds",
)
MEMORY_LIMIT = MetricSpec(
    "fabricscope_agent_memory_limit_bytes",
    "gauge",
    "The memory limit the agent's container was given (--agent.memory-limit, which the "
    "chart sets from its limit); absent when none was given.",
    unit="bytes",
)
MEMORY_OVERCOMMIT = MetricSpec(
    "fabricscope_agent_memory_overcommit_bytes",
    "gauge",
    "How far what the agent's processes may hold (each running child's memory ceiling, the "
    "main process's measured need) exceeds --agent.memory-limit: 0 when the limit holds them, "
    "more when one child at its ceiling can take the container to its limit (the agent says "
    "so at start); absent when no limit was given.",
    unit="bytes",
)
PROCESS_SPECS = (PROCESS_RESIDENT, PROCESS_CPU, PROCESS_OPEN_FDS, PROCESS_START)

SPECS = (
    *PROCESS_SPECS,
    MEMORY_LIMIT,
    MEMORY_OVERCOMMIT,
    SAMPLER_RENDER_ERRORS,
    SAMPLER_CHILD_RESTARTS,
    BUILD_INFO,
    SAMPLER_SUCCESS,
    SAMPLER_HARDWARE_PRESENT,
    SAMPLER_DURATION,
    SAMPLER_CPU,
    SAMPLER_LAST_SUCCESS,
    SAMPLER_ATTEMPTS,
    SAMPLER_ERRORS,
    SAMPLER_READ_ERRORS,
    SAMPLER_READ_ERRORS_LAST,
)


def _process(stats: ProcessStats | None, child: str, out: Families) -> None:
    if stats is None:
        return
    out.add(PROCESS_RESIDENT, stats.rss_bytes, child)
    out.add(PROCESS_CPU, stats.cpu_seconds, child)
    out.add(PROCESS_OPEN_FDS, stats.open_fds, child)
    out.add(PROCESS_START, stats.start_time_seconds, child)


def render(
    statuses: Mapping[str, SamplerStatus],
    render_errors: Mapping[str, int],
    out: Families,
    *,
    main: ProcessStats | None = None,
    memory_limit_bytes: int | None = None,
) -> None:
    """The agent's own series; ``main``: the main process now (None: no process_* of it)."""
    out.add(BUILD_INFO, 1, __version__, platform.python_version())
    for spec in SPECS:
        out.declare(spec)
    _process(main, "", out)
    out.add(MEMORY_LIMIT, memory_limit_bytes)
    if memory_limit_bytes:
        out.add(MEMORY_OVERCOMMIT, plan(memory_limit_bytes, running_children(statuses)).over)
    for name, n in render_errors.items():
        if name not in statuses:  # a renderer that joins samplers ("findings")
            out.add(SAMPLER_RENDER_ERRORS, n, name)
    for name, st in statuses.items():
        out.add(SAMPLER_ATTEMPTS, st.attempts_total, name)
        out.add(SAMPLER_CPU, st.cpu_seconds_total, name)
        out.add(SAMPLER_RENDER_ERRORS, render_errors.get(name, 0), name)
        in_child = st.child_restarts_total is not None
        for reason in ERROR_REASONS:
            if in_child or reason not in CHILD_REASONS:  # the child's reasons, where one runs
                out.add(SAMPLER_ERRORS, st.error_count(reason), name, reason)
        if st.child_restarts_total is not None:
            out.add(SAMPLER_CHILD_RESTARTS, st.child_restarts_total, name)
        _process(st.child, name, out)
        for reason, count in st.read_errors_total:
            out.add(SAMPLER_READ_ERRORS, count, name, reason)
        if st.attempts_total == 0:
            continue
        out.add(SAMPLER_SUCCESS, st.success, name)
        out.add(SAMPLER_DURATION, st.duration_seconds, name)
        out.add(SAMPLER_LAST_SUCCESS, st.last_success_timestamp_seconds, name)
        if st.success:
            out.add(SAMPLER_HARDWARE_PRESENT, st.hardware_present, name)
        if st.snapshot is not None and (st.snapshot.issues or not out.folds):
            out.add(SAMPLER_READ_ERRORS_LAST, len(st.snapshot.issues), name)
