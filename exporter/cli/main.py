"""The ``fabricscope`` command: the composition root, the only module that sees both the
agent (samplers, runner) and the exporter (catalog, server).

    fabricscope agent            serve /metrics and /healthz
    fabricscope agent --once     sample once, print the exposition, exit
    fabricscope topo             GPU/NIC topology matrix (table or JSON)
    fabricscope snapshot -o F    capture the sysfs files the samplers read
    fabricscope probe            run one NCCL probe now
    fabricscope explain          rank the causes of a job's slowdown (exporter/explain/)

The bodies of ``topo``, ``snapshot`` and ``probe`` are in :mod:`exporter.commands`; this
module wires every subcommand's flags into one parser and runs the agent.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shlex
import signal
import sys
import threading
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace

from agent import __version__
from agent.config import (
    DEFAULT_OFF,
    DEFAULT_POD_LOGS,
    DEFAULT_POD_RESOURCES_SOCKET,
    SAMPLER_NAMES,
    AgentConfig,
    IbPeerSettings,
    KubernetesSettings,
    NetdevSettings,
    NvmlSettings,
    Paths,
    Sampling,
    ThroughputFile,
    ThroughputSettings,
)
from agent.core.errors import ConfigError, NoData
from agent.core.logsetup import LEVELS, setup_logging
from agent.core.sysfs import SysfsReader
from agent.samplers import Latest, build_specs
from agent.throughput.pods import parse_selector
from exporter.app import AgentApp
from exporter.cli import probe as probe_command
from exporter.cli import probe_flags
from exporter.cli import snapshot as snapshot_command
from exporter.cli import topo as topo_command
from exporter.cli.argtypes import count, positive
from exporter.cli.source import open_source
from exporter.explain import cli as explain_cli
from exporter.metrics.spec import DETAILS

log = logging.getLogger("fabricscope")

DEFAULT_LISTEN = ":10118"


def _regex(value: str) -> re.Pattern[str]:
    try:
        return re.compile(value)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"invalid regular expression {value!r}: {exc}") from exc


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--path.sysfs",
        dest="path_sysfs",
        default="/sys",
        metavar="DIR",
        help="sysfs mount point (default: %(default)s)",
    )
    p.add_argument(
        "--path.procfs",
        dest="path_procfs",
        default="/proc",
        metavar="DIR",
        help="procfs mount point (default: %(default)s)",
    )
    p.add_argument("--log.level", dest="log_level", choices=LEVELS, default="info")
    p.add_argument("--log.format", dest="log_format", choices=("text", "json"), default="text")


def _add_kubernetes(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Kubernetes pod attribution")
    g.add_argument(
        "--kubelet.pod-resources-socket",
        dest="pod_resources_socket",
        default=DEFAULT_POD_RESOURCES_SOCKET,
        metavar="PATH",
        help="the kubelet's pod-resources socket; empty: not used (default: %(default)s)",
    )
    g.add_argument(
        "--kubernetes.node-name",
        dest="node_name",
        default=os.environ.get("NODE_NAME", ""),
        metavar="NAME",
        help="this node's name: turns on the /proc cgroup fallback with an API-server pod "
        "watch (default: $NODE_NAME; empty: off)",
    )


def _throughput_file(value: str) -> ThroughputFile:
    path, sep, job = value.rpartition("=")
    if sep and path and job and "/" not in job:
        return ThroughputFile(path, job)
    if not value:
        raise argparse.ArgumentTypeError("empty path")
    return ThroughputFile(value)


def _selector(value: str) -> str:
    try:
        parse_selector(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return value


def _add_throughput(p: argparse.ArgumentParser) -> None:
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
    g.add_argument(
        "--throughput.pods",
        dest="throughput_pods",
        choices=("gpu", "all"),
        default="gpu",
        help="whose container logs to read: pods holding a GPU of this node, or all "
        "(default: %(default)s)",
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
        type=positive,
        default=0.5,
        metavar="SECONDS",
        help="CPU time one log may take in one pass; the rest of it waits for the next pass, "
        "counted as cpu_budget (default: %(default)s)",
    )
    g.add_argument(
        "--throughput.max-open-files",
        dest="throughput_max_open_files",
        type=count,
        default=256,
        metavar="N",
        help="log files kept open between passes; idle ones beyond it are closed and "
        "reopened at their offset (default: %(default)s)",
    )


def _add_samplers(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("samplers")
    g.add_argument(
        "--nvml.link-error-rotation",
        dest="nvml_link_error_rotation",
        type=count,
        default=18,
        metavar="PASSES",
        help="read each NVLink's replay/recovery/CRC-flit counters every PASSES passes "
        "(about 0.85 ms CPU per link read on an H200; default: %(default)s)",
    )
    g.add_argument(
        "--nvml.slow-error-rotation",
        dest="nvml_slow_error_rotation",
        type=count,
        default=72,
        metavar="PASSES",
        help="read each NVLink's crc_data/ecc_data counters every PASSES passes "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--collector.detail",
        dest="collector_detail",
        choices=DETAILS,
        default="default",
        help="how much to export: minimal (what the shipped alerts, dashboards and explain "
        "read), default (also diagnostic counters; almost-always-0 booleans and facts every "
        "link shares folded), full (every series, unfolded); docs/metrics.md says what each "
        "level drops (default: %(default)s)",
    )
    g.add_argument(
        "--nvml.isolate",
        dest="nvml_isolate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run NVML in a supervised child process: a crash or hang in the driver library "
        "costs a pass, counted, never /metrics (default: on; off only to debug)",
    )
    for name in SAMPLER_NAMES:
        on = name not in DEFAULT_OFF
        g.add_argument(
            f"--sampler.{name}",
            dest=f"sampler_{name}",
            action=argparse.BooleanOptionalAction,
            default=on,
            help=f"enable the {name} sampler (default: {'on' if on else 'off'})",
        )
    g.add_argument(
        "--ibpeer.command-prefix",
        dest="ibpeer_command_prefix",
        default="",
        metavar="COMMAND",
        help="words put before every smpquery/perfquery the ibpeer sampler runs (split like a "
        "shell: 'ibsim-run' for the simulator, a wrapper; default: none)",
    )
    g.add_argument(
        "--ibpeer.tool-timeout",
        dest="ibpeer_tool_timeout",
        type=positive,
        default=2.0,
        metavar="SECONDS",
        help="an smpquery/perfquery call running longer is killed and fails the ibpeer pass "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--sampling.interval",
        dest="sampling_interval",
        type=positive,
        default=15.0,
        metavar="SECONDS",
        help="time between two passes of each sampler (default: %(default)s)",
    )
    g.add_argument(
        "--sampling.timeout",
        dest="sampling_timeout",
        type=positive,
        default=10.0,
        metavar="SECONDS",
        help="a pass running longer is abandoned and counted (default: %(default)s)",
    )
    g.add_argument(
        "--netdev.include",
        dest="netdev_include",
        type=_regex,
        default=None,
        metavar="REGEX",
        help="also sample interfaces whose name matches (RDMA-associated "
        "interfaces are always sampled)",
    )
    g.add_argument(
        "--netdev.ethtool-include",
        dest="netdev_ethtool_include",
        type=_regex,
        default=None,
        metavar="REGEX",
        help="ethtool statistics to export (default: PFC/pause, discards, "
        "out-of-buffer, PHY errors; see docs/metrics.md)",
    )
    g.add_argument(
        "--netdev.ethtool",
        dest="netdev_ethtool",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="read ethtool statistics at all (default: on)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fabricscope",
        description="GPU training fabric monitor: InfiniBand/RoCE, PCIe/NUMA topology, "
        "netdev, as Prometheus metrics.",
    )
    parser.add_argument("--version", action="version", version=f"fabricscope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    agent = sub.add_parser(
        "agent",
        help="run the node agent and serve /metrics",
        epilog="Signals: SIGTERM and SIGINT stop the agent (within a few seconds). SIGHUP is "
        "ignored, with a log line: there is nothing to reload by hand (TLS files are re-read "
        "when they change, pods and their logs are found again on every pass); changing "
        "flags or the --web.config.file's users needs a restart.",
    )
    _add_common(agent)
    _add_samplers(agent)
    _add_kubernetes(agent)
    agent.add_argument(
        "--web.listen-address",
        dest="listen",
        default=DEFAULT_LISTEN,
        metavar="[HOST]:PORT",
        help="address to serve on (default: %(default)s)",
    )
    agent.add_argument(
        "--web.config.file",
        dest="web_config",
        default=None,
        metavar="FILE",
        help="exporter-toolkit web config: TLS and basic auth",
    )
    agent.add_argument(
        "--web.max-requests",
        dest="max_requests",
        type=count,
        default=40,
        help="concurrent requests served before answering 503 (default: %(default)s)",
    )
    agent.add_argument(
        "--web.max-connections",
        dest="max_connections",
        type=count,
        default=512,
        help="open connections in all; a newcomer closes the oldest idle one of the client "
        "holding the most (default: %(default)s)",
    )
    agent.add_argument(
        "--web.max-connections-per-address",
        dest="max_per_address",
        type=count,
        default=16,
        help="open connections from one client address (IPv6: per /64) (default: %(default)s)",
    )
    agent.add_argument(
        "--web.header-timeout",
        dest="header_timeout",
        type=positive,
        default=5.0,
        metavar="SECONDS",
        help="time for a connection's TLS handshake and request to arrive (default: %(default)s)",
    )
    agent.add_argument(
        "--web.idle-timeout",
        dest="idle_timeout",
        type=positive,
        default=120.0,
        metavar="SECONDS",
        help="how long an idle keep-alive connection is kept (default: %(default)s)",
    )
    agent.add_argument(
        "--once",
        action="store_true",
        help="sample every enabled sampler once, print the exposition to "
        "stdout and exit (for node_exporter's textfile collector)",
    )
    agent.add_argument(
        "--snapshot",
        default=None,
        metavar="FILE.tar.gz",
        help="read sysfs from a snapshot taken by `fabricscope snapshot`",
    )
    _add_throughput(agent)
    probe_flags.add_agent_flags(agent)

    topo = sub.add_parser(
        "topo", help="print the GPU/NIC topology matrix, RDMA ports and every finding"
    )
    _add_common(topo)
    topo.add_argument("--format", choices=("table", "json"), default="table")
    topo.add_argument(
        "--snapshot",
        default=None,
        metavar="FILE.tar.gz",
        help="read sysfs from a snapshot instead of the host",
    )

    snap = sub.add_parser("snapshot", help="capture the sysfs files the samplers read")
    _add_common(snap)
    _add_samplers(snap)
    snap.add_argument("--output", "-o", required=True, metavar="FILE.tar.gz")
    probe_command.add_parser(sub)
    explain_cli.add_parser(sub)
    return parser


def _config(ns: argparse.Namespace) -> AgentConfig:
    enabled = frozenset(n for n in SAMPLER_NAMES if getattr(ns, f"sampler_{n}"))
    try:
        sampling = Sampling(enabled, ns.sampling_interval, ns.sampling_timeout)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    return AgentConfig(
        paths=Paths(ns.path_sysfs, ns.path_procfs),
        sampling=sampling,
        netdev=NetdevSettings(ns.netdev_include, ns.netdev_ethtool_include, ns.netdev_ethtool),
        probe=probe_flags.settings_from_args(ns),
        ibpeer=_ibpeer_settings(ns),
        nvml=NvmlSettings(
            ns.nvml_link_error_rotation, ns.nvml_slow_error_rotation, isolate=ns.nvml_isolate
        ),
        throughput=ThroughputSettings(
            files=tuple(getattr(ns, "throughput_files", ())),
            job=getattr(ns, "throughput_job", None),
            pod_logs=getattr(ns, "path_pod_logs", DEFAULT_POD_LOGS),
            pods=getattr(ns, "throughput_pods", "gpu"),
            namespaces=tuple(getattr(ns, "throughput_namespaces", ())),
            selector=getattr(ns, "throughput_selector", None),
            isolate=getattr(ns, "throughput_isolate", True),
            stream_cpu_seconds=getattr(ns, "throughput_stream_cpu", 0.5),
            max_open_files=getattr(ns, "throughput_max_open_files", 256),
        ),
        kubernetes=KubernetesSettings(
            pod_resources_socket=getattr(ns, "pod_resources_socket", None) or None,
            node_name=getattr(ns, "node_name", None) or None,
        ),
    )


def _ibpeer_settings(ns: argparse.Namespace) -> IbPeerSettings:
    try:
        prefix = tuple(shlex.split(getattr(ns, "ibpeer_command_prefix", "")))
    except ValueError as exc:
        raise ConfigError(f"--ibpeer.command-prefix: {exc}") from exc
    return IbPeerSettings(prefix, getattr(ns, "ibpeer_tool_timeout", 2.0))


def cmd_agent(ns: argparse.Namespace) -> int:
    config = _config(ns)
    with ExitStack() as stack:
        src = open_source(stack, ns)
        dropped = config.sampling.enabled & src.unavailable
        if dropped:
            log.info(
                "replaying %s: it holds nothing for %s; disabled",
                src.label,
                ", ".join(sorted(dropped)),
            )
        config = replace(
            config,
            paths=replace(config.paths, sysfs=src.sysfs),
            sampling=replace(config.sampling, enabled=config.sampling.enabled - dropped),
        )
        if ns.once and config.probe.enabled:
            log.info("--once takes no probes: they run on their own schedule in the agent")
        latest = Latest()
        specs = build_specs(
            config,
            SysfsReader(src.sysfs),
            nvml_api=src.nvml_api,
            watch_xid=not ns.once,
            run_probes=not ns.once,
            latest=latest,
            once=ns.once,
        )
        app = AgentApp(specs, latest, detail=ns.collector_detail)
        if ns.once:
            sys.stdout.buffer.write(app.run_once())
            sys.stdout.flush()
            return 0
        return _serve(app, ns)


def _serve(app: AgentApp, ns: argparse.Namespace) -> int:
    # imported here: `topo` and `--once` need no server
    from exporter.http.limits import ConnectionLimits
    from exporter.http.server import serve
    from exporter.http.webconfig import load_web_config

    web_config = load_web_config(ns.web_config) if ns.web_config else None
    limits = ConnectionLimits(
        max_requests=ns.max_requests,
        max_connections=ns.max_connections,
        max_per_address=ns.max_per_address,
        header_timeout=ns.header_timeout,
        idle_timeout=ns.idle_timeout,
    )
    server = serve(app.cache, ns.listen, web_config=web_config, ready=app.ready, limits=limits)
    log.info(
        "fabricscope %s serving on %s (samplers: %s; TLS %s, basic auth %s)",
        __version__,
        server.url,
        ", ".join(app.runner.names) or "none",
        "on" if web_config and web_config.tls else "off",
        "on" if web_config and web_config.basic_auth_users else "off",
    )
    # Scrapes are served from cached bytes in a few hundred microseconds, but a request
    # thread waiting for the GIL waits up to the switch interval (5 ms by default): that wait
    # is the scrape latency tail. 1 ms keeps it short at negligible cost.
    sys.setswitchinterval(0.001)
    stop = threading.Event()

    def _handle(signum: int, _frame: object) -> None:
        log.info("received signal %d, shutting down", signum)
        stop.set()

    def _hangup(_signum: int, _frame: object) -> None:
        log.info(
            "received SIGHUP: ignored (TLS files are re-read when they change, pods on every "
            "pass; a changed flag or web config user needs a restart)"
        )

    signal.signal(signal.SIGTERM, _handle)
    signal.signal(signal.SIGINT, _handle)
    signal.signal(signal.SIGHUP, _hangup)
    app.runner.start()
    stop.wait()
    server.shutdown()
    app.runner.stop()
    return 0


def cmd_snapshot(ns: argparse.Namespace) -> int:
    return snapshot_command.take_snapshot(_config(ns), ns.output)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    setup_logging(ns.log_level, ns.log_format)
    commands = {
        "agent": cmd_agent,
        "topo": topo_command.cmd_topo,
        "snapshot": cmd_snapshot,
        "probe": probe_command.cmd_probe,
        "explain": explain_cli.cmd_explain,
    }
    try:
        return commands[ns.command](ns)
    except ConfigError as exc:
        print(f"fabricscope: error: {exc}", file=sys.stderr)
        return 2
    except NoData as exc:
        print(f"fabricscope: {exc}", file=sys.stderr)
        return 1
