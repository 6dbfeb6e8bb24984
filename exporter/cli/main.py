"""The ``fabricscope`` command: the composition root, the only module that sees both the
agent (samplers, runner) and the exporter (catalog, server).

    fabricscope agent            serve /metrics and /healthz
    fabricscope agent --once     sample once, print the exposition, exit
    fabricscope topo             GPU/NIC topology matrix (table or JSON)
    fabricscope snapshot -o F    capture the sysfs files the samplers read
    fabricscope probe            run one NCCL probe now
    fabricscope explain          rank the causes of a job's slowdown (exporter/explain/)

The bodies of ``topo``, ``snapshot`` and ``probe`` are in their modules of this package;
this module wires every subcommand's flags into one parser and runs the agent. It imports
only what the parser needs: a command imports its machinery when it runs, so
``fabricscope --version`` and ``--help`` start fast.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shlex
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

# Only what building the parser needs is imported here, so that `fabricscope --version` and
# `--help` start in a fraction of a second: each command imports its own machinery.
from agent import __version__
from agent.config import (
    DEFAULT_OFF,
    DEFAULT_POD_LOGS,
    DEFAULT_POD_RESOURCES_SOCKET,
    DEFAULT_SAMPLING_TIMEOUT,
    PERFQUERY_MODES,
    SAMPLER_NAMES,
    AgentConfig,
    ExpectedRate,
    IbPeerSettings,
    InfinibandSettings,
    KubernetesSettings,
    NetdevSettings,
    NvmlSettings,
    Paths,
    Sampling,
    ThroughputFile,
    ThroughputSettings,
    format_duration,
    parse_expected_rate,
)
from agent.core.errors import ConfigError, NoData
from agent.core.logsetup import LEVELS, setup_logging
from agent.core.reaper import serve_as_init
from exporter.cli import explain_flags, probe_flags, ras_flags
from exporter.cli.argtypes import (
    Parser,
    count,
    count_or_zero,
    parse_known,
    positive_duration,
)
from exporter.metrics.spec import DETAILS

if TYPE_CHECKING:
    from exporter.app import AgentApp

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
    from agent.throughput.pods import parse_selector

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


def _expected_rate(text: str) -> ExpectedRate:
    try:
        return parse_expected_rate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_samplers(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("samplers")
    g.add_argument(
        "--infiniband.expected-rate",
        dest="infiniband_expected_rates",
        type=_expected_rate,
        action="append",
        default=[],
        metavar="DEVICE_GLOB[:PORT]=GBPS",
        help="the rate RDMA ports of this node class should run at, e.g. 'mlx5_*=400' "
        "(repeatable; first match wins): an ACTIVE port below it is a port_rate_degraded "
        "finding (comparison=expected), beside its own history and its peers",
    )
    g.add_argument(
        "--infiniband.perfquery",
        dest="infiniband_perfquery",
        choices=PERFQUERY_MODES,
        default="auto",
        help="also read InfiniBand ports' PMA counters with perfquery: 64-bit error counters "
        "and PortXmitWait where the HCA advertises them (PortCountersExtended), under the same "
        "names; auto: the ports whose /dev/infiniband/umad* the agent can open, on: every "
        "ACTIVE one (a command prefix opens it), off: sysfs only (default: %(default)s)",
    )
    g.add_argument(
        "--infiniband.command-prefix",
        dest="infiniband_command_prefix",
        default="",
        metavar="COMMAND",
        help="words put before every perfquery the infiniband sampler runs (split like a "
        "shell: 'sudo -n', a wrapper, 'ibsim-run' for the simulator; default: none)",
    )
    g.add_argument(
        "--infiniband.reset-saturated",
        dest="infiniband_reset_saturated",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="clear a narrow PMA counter (4-32 bits) near its maximum with perfquery and keep "
        "counting, as OpenSM's perfmgr does, where no 64-bit copy exists: the exported "
        "counter stays monotonic; every other reader of the port's counters sees them drop "
        "to 0 (default: off)",
    )
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
        type=positive_duration,
        default=2.0,
        metavar="DURATION",
        help="an smpquery/perfquery call running longer is killed and fails the ibpeer pass "
        "(default: 2s)",
    )
    g.add_argument(
        "--ibpeer.interval",
        dest="ibpeer_interval",
        type=positive_duration,
        default=60.0,
        metavar="DURATION",
        help="time between two ibpeer passes; each reads the switch ports' counters (default: 1m)",
    )
    g.add_argument(
        "--ibpeer.topology-interval",
        dest="ibpeer_topology_interval",
        type=positive_duration,
        default=300.0,
        metavar="DURATION",
        help="time between two reads of who is cabled where: each port's neighbour, the "
        "uplinks' far ends (default: 5m)",
    )
    g.add_argument(
        "--ibpeer.uplinks-max",
        dest="ibpeer_uplinks_max",
        type=count_or_zero,
        default=8,
        metavar="N",
        help="the most leaf-switch uplinks this node reads, its share of its leaves' uplinks "
        "(0: none; default: 8)",
    )
    g.add_argument(
        "--sampling.interval",
        dest="sampling_interval",
        type=positive_duration,
        default=15.0,
        metavar="DURATION",
        help="time between two passes of each sampler: 15s, 1m30s, or seconds (default: 15s)",
    )
    g.add_argument(
        "--sampling.timeout",
        dest="sampling_timeout",
        type=positive_duration,
        default=None,
        metavar="DURATION",
        help="a pass running longer is abandoned and counted (default: "
        f"{format_duration(DEFAULT_SAMPLING_TIMEOUT)}, or the interval when that is shorter)",
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


def build_parser() -> Parser:
    parser = Parser(
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
        "--web.health-listen-address",
        dest="health_listen",
        default=None,
        metavar="[HOST]:PORT",
        help="also serve /healthz alone here, over plain HTTP without credentials: for "
        "kubelet probes when the web config requires client certificates (default: off)",
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
        type=positive_duration,
        default=5.0,
        metavar="DURATION",
        help="time for a connection's TLS handshake and request to arrive (default: 5s)",
    )
    agent.add_argument(
        "--web.idle-timeout",
        dest="idle_timeout",
        type=positive_duration,
        default=120.0,
        metavar="DURATION",
        help="how long an idle keep-alive connection is kept (default: 2m)",
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
    ras_flags.add_agent_flags(agent)
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
    topo.add_argument(
        "--peers",
        dest="peers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="print each InfiniBand port's far end (switch, port, its error counters), asked "
        "with infiniband-diags when installed (default: on)",
    )
    topo.add_argument(
        "--ibpeer.command-prefix",
        dest="ibpeer_command_prefix",
        default="",
        metavar="COMMAND",
        help="words put before every smpquery/perfquery (as for the agent; default: none)",
    )

    snap = sub.add_parser("snapshot", help="capture the sysfs files the samplers read")
    _add_common(snap)
    _add_samplers(snap)
    snap.add_argument("--output", "-o", required=True, metavar="FILE.tar.gz")
    probe_flags.add_probe_parser(sub)
    explain_flags.add_parser(sub)
    return parser


def _config(ns: argparse.Namespace) -> AgentConfig:
    enabled = frozenset(n for n in SAMPLER_NAMES if getattr(ns, f"sampler_{n}"))
    timeout = ns.sampling_timeout
    if timeout is None:  # not given: follows the interval
        timeout = min(DEFAULT_SAMPLING_TIMEOUT, ns.sampling_interval)
    try:
        sampling = Sampling(enabled, ns.sampling_interval, timeout)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    return AgentConfig(
        paths=Paths(ns.path_sysfs, ns.path_procfs),
        sampling=sampling,
        netdev=NetdevSettings(ns.netdev_include, ns.netdev_ethtool_include, ns.netdev_ethtool),
        probe=probe_flags.settings_from_args(ns),
        ibpeer=_ibpeer_settings(ns),
        ras=ras_flags.settings_from_args(ns),
        nvml=NvmlSettings(
            ns.nvml_link_error_rotation, ns.nvml_slow_error_rotation, isolate=ns.nvml_isolate
        ),
        infiniband=_infiniband_settings(ns),
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


def _infiniband_settings(ns: argparse.Namespace) -> InfinibandSettings:
    try:
        prefix = tuple(shlex.split(getattr(ns, "infiniband_command_prefix", "")))
    except ValueError as exc:
        raise ConfigError(f"--infiniband.command-prefix: {exc}") from exc
    try:
        return InfinibandSettings(
            tuple(getattr(ns, "infiniband_expected_rates", ())),
            perfquery=getattr(ns, "infiniband_perfquery", "auto"),
            command_prefix=prefix,
            reset_saturated=getattr(ns, "infiniband_reset_saturated", False),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def _ibpeer_settings(ns: argparse.Namespace) -> IbPeerSettings:
    try:
        prefix = tuple(shlex.split(getattr(ns, "ibpeer_command_prefix", "")))
    except ValueError as exc:
        raise ConfigError(f"--ibpeer.command-prefix: {exc}") from exc
    return IbPeerSettings(
        prefix,
        getattr(ns, "ibpeer_tool_timeout", 2.0),
        getattr(ns, "ibpeer_interval", 60.0),
        getattr(ns, "ibpeer_topology_interval", 300.0),
        getattr(ns, "ibpeer_uplinks_max", 8),
        # the neighbours' 64-bit data counters are exported at full detail only
        extended_counters=getattr(ns, "collector_detail", "default") == "full",
    )


#: flags of the HTTP server: nothing is served with --once, so none of them may be given
_WEB_FLAGS = (
    "--web.listen-address",
    "--web.health-listen-address",
    "--web.config.file",
    "--web.max-requests",
    "--web.max-connections",
    "--web.max-connections-per-address",
    "--web.header-timeout",
    "--web.idle-timeout",
)


def _given(argv: Sequence[str], flag: str) -> bool:
    """Whether ``flag`` is on the command line (abbreviations are refused, so a flag given
    is spelled out: ``--flag`` or ``--flag=value``)."""
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def _check_combinations(ns: argparse.Namespace, argv: Sequence[str]) -> None:
    """Refuse flags that would be silently ignored in the mode asked for."""
    if getattr(ns, "snapshot", None):
        for flag in ("--path.sysfs", "--path.procfs"):
            if _given(argv, flag):
                raise ConfigError(
                    f"{flag} has no effect with --snapshot (a snapshot replays its own sysfs, "
                    "and holds no process state): give one or the other"
                )
        for flag in ("--infiniband.perfquery", "--infiniband.reset-saturated"):
            if _given(argv, flag):
                raise ConfigError(
                    f"{flag} has no effect with --snapshot (a snapshot holds no PMA to ask)"
                )
    if ns.command != "agent" or not ns.once:
        return
    if ns.probe_enabled:
        raise ConfigError(
            "--probe has no effect with --once: probes run on the serving agent's schedule "
            "(`fabricscope probe` runs one now)"
        )
    for flag in _WEB_FLAGS:
        if _given(argv, flag):
            raise ConfigError(f"{flag} has no effect with --once: nothing is served")


def _check_roots(ns: argparse.Namespace) -> None:
    """A root that does not exist is a mistake (a typo, a missing hostPath mount), not a host
    without hardware: refused before anything is sampled."""
    if getattr(ns, "snapshot", None):
        return
    for flag, path in (("--path.sysfs", ns.path_sysfs), ("--path.procfs", ns.path_procfs)):
        if not os.path.isdir(path):
            what = "is not a directory" if os.path.exists(path) else "does not exist"
            raise ConfigError(f"{flag} {path} {what}")


def cmd_agent(ns: argparse.Namespace) -> int:
    from contextlib import ExitStack
    from dataclasses import replace

    from agent.core.sysfs import SysfsReader
    from agent.samplers import Latest, build_specs
    from exporter.app import AgentApp
    from exporter.cli.source import open_source

    config = _config(ns)
    if config.probe.enabled:
        from agent.probe.measure.launch import PROBE_EXTRA_HINT, missing_worker_modules

        missing = missing_worker_modules()
        if missing:
            raise ConfigError(
                f"--probe: the probe needs {' and '.join(missing)}, not installed here: "
                f"{PROBE_EXTRA_HINT}"
            )
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
        if getattr(ns, "snapshot", None):  # a snapshot holds no PMA to ask: sysfs only
            config = replace(config, infiniband=replace(config.infiniband, perfquery="off"))
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
        if not ns.once:
            return _serve(app, ns)
        sys.stdout.buffer.write(app.run_once())
        sys.stdout.flush()
        _warn_unread_once(app, config.sampling.timeout_seconds)
    _exit_past_abandoned_passes()
    return 0


def _exit_past_abandoned_passes() -> None:
    """A ``--once`` pass the runner gave up on still runs in its thread, perhaps inside C
    code (RE2, a vendor library) that aborts the interpreter as it finalises: once the
    output is written and everything cleaned up, exit without finalising."""
    import threading

    if any(t.name.startswith("sample-") and t.is_alive() for t in threading.enumerate()):
        sys.stderr.flush()
        os._exit(0)


def _warn_unread_once(app: AgentApp, timeout: float) -> None:
    """``--once`` reads the throughput logs whole; when that did not finish within the
    sampling timeout the exposition holds no throughput series: say so on stderr."""
    if "throughput" not in app.runner.names:
        return
    status = app.runner.status("throughput")
    if status.snapshot is None and status.error_count("timeout"):
        print(
            f"fabricscope: warning: the throughput logs were not read whole within "
            f"--sampling.timeout ({timeout:g}s): no throughput series printed; raise it",
            file=sys.stderr,
        )


def _serve(app: AgentApp, ns: argparse.Namespace) -> int:
    # imported here: `topo` and `--once` need no server
    import signal
    import threading

    from exporter.http.limits import ConnectionLimits
    from exporter.http.server import serve, serve_health
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
    try:
        health = (
            serve_health(ns.health_listen, app.ready, limits=limits) if ns.health_listen else None
        )
    except ConfigError:
        server.shutdown()
        raise
    log.info(
        "fabricscope %s listening on %s (samplers: %s; TLS %s, basic auth %s)",
        __version__,
        server.address,
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
    if health is not None:
        health.shutdown()
    app.runner.stop()
    return 0


def cmd_snapshot(ns: argparse.Namespace) -> int:
    from exporter.cli import snapshot as snapshot_command

    return snapshot_command.take_snapshot(_config(ns), ns.output)


def cmd_topo(ns: argparse.Namespace) -> int:
    from exporter.cli import topo as topo_command

    return topo_command.cmd_topo(ns)


def cmd_probe(ns: argparse.Namespace) -> int:
    from exporter.cli import probe as probe_command

    return probe_command.cmd_probe(ns)


def cmd_explain(ns: argparse.Namespace) -> int:
    from exporter.explain import cli as explain_cli

    return explain_cli.cmd_explain(ns)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    ns = parse_known(parser, args)
    setup_logging(ns.log_level, ns.log_format)
    # as PID 1 (a container's entrypoint without an init) orphans are re-parented here and
    # nothing else reaps them: the command runs in a child and this process reaps
    return serve_as_init(lambda: _dispatch(ns, args))


def _dispatch(ns: argparse.Namespace, args: list[str]) -> int:
    commands = {
        "agent": cmd_agent,
        "topo": cmd_topo,
        "snapshot": cmd_snapshot,
        "probe": cmd_probe,
        "explain": cmd_explain,
    }
    try:
        if ns.command in ("agent", "topo", "snapshot"):
            _check_combinations(ns, args)
            _check_roots(ns)
        return commands[ns.command](ns)
    except ConfigError as exc:
        print(f"fabricscope: error: {exc}", file=sys.stderr)
        return 2
    except NoData as exc:
        print(f"fabricscope: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `fabricscope topo | head`: the reader left; not an error to print
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # as a shell reports a command killed by SIGPIPE
