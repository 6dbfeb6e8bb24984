"""Metric specs and rendering for the throughput sampler: the training throughput jobs print
in their logs, per container (or log file) and format.

Every series carries ``namespace``, ``pod``, ``container`` (empty outside Kubernetes),
``job_name`` (empty when unknown) and ``format`` (the parser that read the line). They join
the attribution series on ``namespace`` and ``pod``, e.g. the GPUs a job's pods hold::

    fabricscope_throughput_tokens_per_second
      * on(namespace, pod) group_left(gpu) fabricscope_pod_gpu_info

(``docs/throughput.md`` has more.) A stalled job keeps its last value: watch
``fabricscope_throughput_last_parsed_timestamp_seconds`` for staleness.
"""

from __future__ import annotations

from agent.throughput.records import ERROR_REASONS, ThroughputSnapshot
from exporter.metrics import nccl
from exporter.metrics.spec import Families, MetricSpec

_L = ("namespace", "pod", "container", "job_name", "format")
_P = "fabricscope_throughput_"
_AS_PRINTED = (
    " Labels: namespace, pod, container (empty outside Kubernetes), job_name, format (the "
    "parser that read the line)."
)

TOKENS = MetricSpec(
    _P + "tokens_per_second",
    "gauge",
    "Latest tokens per second the job printed (torchtitan prints it per device)." + _AS_PRINTED,
    _L,
)
SAMPLES = MetricSpec(
    _P + "samples_per_second",
    "gauge",
    "Latest samples per second the job printed, or its global batch size over its time per "
    "iteration (Megatron)." + _AS_PRINTED,
    _L,
)
ITERATIONS = MetricSpec(
    _P + "iterations_per_second",
    "gauge",
    "Latest iterations (steps) per second the job printed, or the inverse of its time per "
    "iteration." + _AS_PRINTED,
    _L,
)
STEP = MetricSpec(
    _P + "step_seconds",
    "gauge",
    "Latest time per iteration (step) the job printed, or the inverse of its iterations per "
    "second." + _AS_PRINTED,
    _L,
    "seconds",
)
FLOPS = MetricSpec(
    _P + "flops_per_gpu",
    "gauge",
    "Latest model FLOP/s per GPU the job printed (TFLOP/s x 1e12)." + _AS_PRINTED,
    _L,
)
MFU = MetricSpec(
    _P + "mfu_ratio",
    "gauge",
    "Latest model FLOPs utilisation the job printed, 0..1 (percentages divided by 100)."
    + _AS_PRINTED,
    _L,
    "ratio",
)
LAST_PARSED = MetricSpec(
    _P + "last_parsed_timestamp_seconds",
    "gauge",
    "Wall time of the last line a value was parsed from: its CRI log timestamp, or for a plain "
    "file the file's modification time when it was read. A stalled job shows here.",
    ("namespace", "pod", "container", "job_name"),
    "seconds",
)
LINES_PARSED = MetricSpec(
    _P + "lines_parsed_total",
    "counter",
    "Log lines that yielded a value, since the agent started (a first read starts 1 MiB "
    "before the end of an already written log)." + _AS_PRINTED,
    _L,
)
SOURCES = MetricSpec(
    _P + "sources",
    "gauge",
    "Log files and container logs the throughput sampler is reading.",
)
ERRORS = MetricSpec(
    _P + "errors_total",
    "counter",
    "Throughput log reading problems by reason: bad_regex (an unusable "
    "fabricscope.io/throughput-regex, e.g. one RE2 cannot run in linear time), cpu_budget "
    "(a log used its CPU budget in a pass; its rest waits for the next, or, for a restarted "
    "container's previous log or a log whose pod went, is counted in "
    "fabricscope_throughput_unread_bytes_total), "
    "cri_parse (a line "
    "not in the CRI log format), fd_limit (a log not opened for want of a file descriptor; "
    "read next pass), gzip, invalid_utf8 (decoded with replacement characters; "
    "its numbers still read), io, line_too_long (skipped), no_match (a --throughput.file "
    "pattern matching nothing), not_regular_file (a FIFO, socket, device or directory in "
    "place of a log), outside_root (a log whose real path leaves --path.pod-logs), "
    "pass_deadline (logs a pass had no time left for; first in the next pass), permission, "
    "rotated (a log rotated, once per rotated file followed: not an error), rotated_missed "
    "(rotated files deleted before they could be listed: once per gap found, estimated in "
    "fabricscope_throughput_missed_bytes_total), rotated_unread "
    "(a rotated file found but not read: gone or unreadable by the time it was opened, or "
    "past a pass's byte bound; its size is in fabricscope_throughput_unread_bytes_total), "
    "symlink (a pod log that is a symbolic link: "
    "never followed), too_long_to_parse (a line over 16 KiB: not parsed), truncated (read "
    "again from its start), vanished (a log or pod log directory gone).",
    ("reason",),
)
UNREAD = MetricSpec(
    _P + "unread_bytes_total",
    "counter",
    "Bytes known to have been written to a log and never read: cut by a truncation before "
    "they were read, left in a log whose pod went (also past its CPU budget), or in a "
    "restarted container's previous log past its CPU budget.",
)
MISSED = MetricSpec(
    _P + "missed_bytes_total",
    "counter",
    "Bytes estimated to have been written to rotated logs deleted before the agent could "
    "list them (a log rotated and pruned faster than it is read): the time between one "
    "file's rename and the next file's birth, at the writer's mean rate over the lives of the "
    "files seen, idle time included (a bursty writer is priced at its mean rate, not its "
    "burst rate). Up to one file's bytes over when the file read last was deleted before it "
    "was finished; under when a rotated file's mode or owner was changed after its rename.",
)
MISSED_LINES = MetricSpec(
    _P + "missed_lines_total",
    "counter",
    "Lines estimated to have been lost with those bytes (missed_bytes_total), at the mean "
    "line length read from the same logs.",
)

SPECS: tuple[MetricSpec, ...] = (
    TOKENS,
    SAMPLES,
    ITERATIONS,
    STEP,
    FLOPS,
    MFU,
    LAST_PARSED,
    LINES_PARSED,
    SOURCES,
    ERRORS,
    UNREAD,
    MISSED,
    MISSED_LINES,
    *nccl.SPECS,  # the same sampler reads NCCL's own lines (exporter/metrics/nccl.py)
)

_VALUES = (
    (TOKENS, "tokens_per_second"),
    (SAMPLES, "samples_per_second"),
    (ITERATIONS, "iterations_per_second"),
    (STEP, "step_seconds"),
    (FLOPS, "flops_per_gpu"),
    (MFU, "mfu_ratio"),
)


def render(snap: ThroughputSnapshot, out: Families) -> None:
    for s in snap.series:
        labels = (s.namespace, s.pod, s.container, s.job_name, s.format)
        for spec, attr in _VALUES:
            out.add(spec, getattr(s, attr), *labels)
        out.add(LINES_PARSED, s.lines_parsed, *labels)
    for t in snap.times:
        out.add(
            LAST_PARSED,
            t.last_parsed_timestamp_seconds,
            t.namespace,
            t.pod,
            t.container,
            t.job_name,
        )
    out.add(SOURCES, snap.sources)
    errors = dict(snap.errors_total)
    for reason in ERROR_REASONS:
        out.add(ERRORS, errors.get(reason, 0), reason)
    out.add(UNREAD, snap.unread_bytes_total)
    out.add(MISSED, snap.missed_bytes_total)
    out.add(MISSED_LINES, snap.missed_lines_total)
    nccl.render(snap.nccl, out)
