"""The ``fabricscope`` command: the composition root, the only module that sees both the
agent (samplers, runner) and the exporter (catalog, server).

    fabricscope agent            serve /metrics and /healthz
    fabricscope agent --once     sample once, print the exposition, exit
    fabricscope topo             GPU/NIC topology matrix (table or JSON)
    fabricscope snapshot -o F    capture the sysfs files the samplers read
    fabricscope probe            run one NCCL probe now
    fabricscope explain          rank the causes of a job's slowdown (exporter/explain/)
    fabricscope topology         the fabric's tiers for schedulers (exporter/topology/)
    fabricscope topology-controller   keep nodes' fabric tier labels true

The bodies of ``agent`` (``agent_run``), ``topo``, ``snapshot`` and ``probe`` are in their
modules of this package, and so are the flags they share (``agent_flags``, ``*_flags``);
this module wires every subcommand's flags into one parser, refuses flags that would have
no effect, and dispatches. It imports only what the parser needs: a command imports its
machinery when it runs, so ``fabricscope --version`` and ``--help`` start fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

# Only what building the parser needs is imported here, so that `fabricscope --version` and
# `--help` start in a fraction of a second: each command imports its own machinery.
from agent import __version__
from agent.core.errors import ConfigError, NoData
from agent.core.logsetup import setup_logging
from agent.core.reaper import serve_as_init
from exporter.cli import (
    agent_flags,
    explain_flags,
    probe_flags,
    ras_flags,
    throughput_flags,
    topology_flags,
)
from exporter.cli.argtypes import Parser, count, error_line, parse_known, positive_duration

DEFAULT_LISTEN = ":10118"


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
    agent_flags.add_common(agent)
    agent_flags.add_samplers(agent)
    agent_flags.add_kubernetes(agent)
    agent_flags.add_agent_state(agent)
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
        action=argparse.BooleanOptionalAction,
        help="sample every enabled sampler once, print the exposition to "
        "stdout and exit (for node_exporter's textfile collector)",
    )
    agent.add_argument(
        "--snapshot",
        default=None,
        metavar="FILE.tar.gz",
        help="read sysfs from a snapshot taken by `fabricscope snapshot`",
    )
    throughput_flags.add_agent_flags(agent)
    ras_flags.add_agent_flags(agent)
    probe_flags.add_agent_flags(agent)

    topo = sub.add_parser(
        "topo", help="print the GPU/NIC topology matrix, RDMA ports and every finding"
    )
    agent_flags.add_common(topo)
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
    agent_flags.add_common(snap)
    agent_flags.add_samplers(snap)
    snap.add_argument("--output", "-o", required=True, metavar="FILE.tar.gz")
    probe_flags.add_probe_parser(sub)
    explain_flags.add_parser(sub)
    topology_flags.add_parsers(sub)
    return parser


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


#: flags that set when the next pass comes: a command that takes one pass has none
_SCHEDULE_FLAGS = (
    "--sampling.interval",
    "--nvml.interval",
    "--ibpeer.interval",
    "--ibpeer.topology-interval",
)


def _check_combinations(ns: argparse.Namespace, argv: Sequence[str]) -> None:
    """Refuse flags that would be silently ignored in the mode asked for, saying why."""
    if getattr(ns, "snapshot", None):
        for flag in ("--path.sysfs", "--path.procfs"):
            if _given(argv, flag):
                raise ConfigError(
                    f"{flag} has no effect with --snapshot (a snapshot replays its own sysfs, "
                    "and holds no process state): give one or the other"
                )
        for flag in (
            "--infiniband.perfquery",
            "--infiniband.reset-saturated",
            "--infiniband.state-file",
        ):
            if _given(argv, flag):
                raise ConfigError(
                    f"{flag} has no effect with --snapshot (a snapshot holds no PMA to ask)"
                )
    if ns.command == "snapshot":
        for flag in _SCHEDULE_FLAGS:
            if _given(argv, flag):
                raise ConfigError(
                    f"{flag} has no effect on snapshot: a snapshot takes one pass, so there is "
                    "no next one to schedule"
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
    for flag in _SCHEDULE_FLAGS:
        if _given(argv, flag):
            raise ConfigError(
                f"{flag} has no effect with --once: one pass is taken, so there is no next "
                "one to schedule (--sampling.timeout still bounds it)"
            )


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
    from exporter.cli import agent_run

    return agent_run.cmd_agent(ns)


def cmd_snapshot(ns: argparse.Namespace) -> int:
    from exporter.cli import snapshot as snapshot_command

    return snapshot_command.take_snapshot(agent_flags.config_from_args(ns), ns.output)


def cmd_topo(ns: argparse.Namespace) -> int:
    from exporter.cli import topo as topo_command

    return topo_command.cmd_topo(ns)


def cmd_probe(ns: argparse.Namespace) -> int:
    from exporter.cli import probe as probe_command

    return probe_command.cmd_probe(ns)


def cmd_explain(ns: argparse.Namespace) -> int:
    from exporter.explain import cli as explain_cli

    return explain_cli.cmd_explain(ns)


def cmd_topology(ns: argparse.Namespace) -> int:
    from exporter.topology import cli as topology_cli

    return topology_cli.cmd_topology(ns)


def cmd_topology_controller(ns: argparse.Namespace) -> int:
    from exporter.topology import cli as topology_cli

    return topology_cli.cmd_controller(ns)


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
        "topology": cmd_topology,
        "topology-controller": cmd_topology_controller,
    }
    try:
        if ns.command in ("agent", "topo", "snapshot"):
            _check_combinations(ns, args)
            _check_roots(ns)
        return commands[ns.command](ns)
    except ConfigError as exc:
        print(error_line(f"fabricscope {ns.command}", str(exc)), file=sys.stderr)
        return 2
    except NoData as exc:
        print(f"fabricscope: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `fabricscope topo | head`: the reader left; not an error to print
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # as a shell reports a command killed by SIGPIPE
