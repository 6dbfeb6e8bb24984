"""The ``throughput`` sampler's flags (``fabricscope agent --throughput.*`` and
``--path.pod-logs``) and the :class:`~agent.config.ThroughputSettings` they make. Light to
import: no throughput machinery."""

from __future__ import annotations

import argparse

from agent.config import DEFAULT_POD_LOGS, ThroughputFile, ThroughputSettings
from exporter.cli.argtypes import add_choice, count, positive_duration


def _throughput_file(value: str) -> ThroughputFile:
    path, sep, job = value.rpartition("=")
    if sep and path and job and "/" not in job:
        return ThroughputFile(path, job)
    if not value:
        raise argparse.ArgumentTypeError("empty path")
    return ThroughputFile(value)


def _selector(value: str) -> str:
    from agent.throughput.pods import parse_selector

    try:
        parse_selector(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return value


def add_agent_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("training throughput from logs")
    g.add_argument(
        "--throughput.file",
        dest="throughput_files",
        type=_throughput_file,
        action="append",
        default=[],
        metavar="PATH[=JOB]",
        help="a plain log file (or glob) a training job writes; repeatable; JOB names its "
        "job_name label (default: --throughput.job, else the file's stem). With --once the "
        "file is read whole",
    )
    g.add_argument(
        "--throughput.job",
        dest="throughput_job",
        default=None,
        metavar="NAME",
        help="job_name of --throughput.file paths given without =JOB",
    )
    g.add_argument(
        "--path.pod-logs",
        dest="path_pod_logs",
        default=DEFAULT_POD_LOGS,
        metavar="DIR",
        help="the kubelet's pod log directory (CRI format) (default: %(default)s)",
    )
    add_choice(
        g,
        "--throughput.pods",
        "throughput_pods",
        choices=("gpu", "all"),
        default="gpu",
        help="whose container logs to read: pods holding a GPU of this node, or all",
    )
    g.add_argument(
        "--throughput.namespace",
        dest="throughput_namespaces",
        action="append",
        default=[],
        metavar="NS",
        help="read only pods of this namespace; repeatable",
    )
    g.add_argument(
        "--throughput.selector",
        dest="throughput_selector",
        type=_selector,
        default=None,
        metavar="SELECTOR",
        help="read only pods whose labels match this label selector (app=llm,tier!=eval); "
        "needs the API-server pod watch (--kubernetes.node-name)",
    )
    g.add_argument(
        "--throughput.isolate",
        dest="throughput_isolate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="read and parse logs in a supervised child process: whatever a pod writes "
        "costs at most a throughput pass, counted, never /metrics (default: on; off only to "
        "debug)",
    )
    g.add_argument(
        "--throughput.stream-cpu-budget",
        dest="throughput_stream_cpu",
        type=positive_duration,
        default=0.5,
        metavar="DURATION",
        help="CPU time one log may take in one pass; the rest of it waits for the next pass, "
        "counted as cpu_budget (default: 500ms). Not applied with --once, which reads every "
        "file whole within --sampling.timeout",
    )
    g.add_argument(
        "--throughput.max-open-files",
        dest="throughput_max_open_files",
        type=count,
        default=256,
        metavar="N",
        help="log files open at once, within a pass too (at most half the soft limit on "
        "open files); the least recently read is closed and reopened at its offset when its "
        "turn comes (default: %(default)s)",
    )


def settings_from_args(ns: argparse.Namespace) -> ThroughputSettings:
    return ThroughputSettings(
        files=tuple(getattr(ns, "throughput_files", ())),
        job=getattr(ns, "throughput_job", None),
        pod_logs=getattr(ns, "path_pod_logs", DEFAULT_POD_LOGS),
        pods=getattr(ns, "throughput_pods", "gpu"),
        namespaces=tuple(getattr(ns, "throughput_namespaces", ())),
        selector=getattr(ns, "throughput_selector", None),
        isolate=getattr(ns, "throughput_isolate", True),
        stream_cpu_seconds=getattr(ns, "throughput_stream_cpu", 0.5),
        max_open_files=getattr(ns, "throughput_max_open_files", 256),
    )
