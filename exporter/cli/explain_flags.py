"""``fabricscope explain``'s flags: what the ``fabricscope`` parser needs, without importing
the explainer itself (so ``fabricscope --help`` stays fast). The value types are the ones
every subcommand shares (:mod:`exporter.cli.argtypes`)."""

from __future__ import annotations

import argparse
from typing import Any

from agent.core.logsetup import LEVELS
from exporter.cli.argtypes import add_prometheus_timeout, byte_size, count, duration
from exporter.explain.times import parse_time


def _time_arg(value: str) -> str:
    parse_time(value)  # validate now; evaluated against one "now" later
    return value


def add_parser(sub: Any) -> None:
    """Register ``explain`` on the ``fabricscope`` subcommand parser."""
    p = sub.add_parser(
        "explain",
        help="rank the fabric causes of a job's slowdown, from Prometheus",
        description="Find when a job's throughput dropped and rank the node, port, link or "
        "misplacement behind it, from the metrics a Prometheus server holds.",
        epilog="Exit codes: 0 judged (causes found, or no fabric cause found); 1 could not "
        "judge (fewer than 5 checks compared data of the baseline and the slow period on at "
        "least half the job's nodes, or the job's data in the window holds no baseline or "
        "slow period: the output says what is missing); 2 could not run (bad flags, "
        "Prometheus unreachable or refusing, no such job).",
    )
    g = p.add_argument_group("Prometheus")
    g.add_argument("--prometheus.url", dest="prom_url", required=True, metavar="URL")
    add_prometheus_timeout(g)
    g.add_argument(
        "--prometheus.max-body-bytes",
        dest="prom_max_body",
        type=byte_size,
        default=None,  # the client's DEFAULT_MAX_BODY_BYTES: not imported to build the parser
        metavar="SIZE",
        help="the largest answer read (64MiB, 64Mi, 64M or plain bytes); a bigger one is an "
        "error (default: 64MiB)",
    )
    g.add_argument(
        "--prometheus.max-nodes-per-query",
        dest="prom_max_names",
        type=count,
        default=None,  # explain.plan's MAX_NAMES_PER_QUERY: not imported to build the parser
        metavar="N",
        help="instances (or pods) one query names at most: a larger job's checks run as "
        "one query per group, each answer and query text bounded (default: 1024)",
    )
    g.add_argument(
        "--deadline",
        type=duration,
        default=300.0,
        metavar="DURATION",
        help="for the whole run: no request starts after it, each gets at most the time left "
        "(default: 5m); progress goes to stderr every 5 s once a run is that long",
    )
    g.add_argument("--prometheus.ca-file", dest="prom_ca", metavar="FILE")
    g.add_argument(
        "--prometheus.cert-file",
        dest="prom_cert",
        metavar="FILE",
        help="client certificate (mutual TLS)",
    )
    g.add_argument("--prometheus.key-file", dest="prom_key", metavar="FILE")
    g.add_argument(
        "--prometheus.insecure-skip-verify",
        dest="prom_insecure",
        action=argparse.BooleanOptionalAction,
        help="do not verify the server's certificate",
    )
    g.add_argument("--prometheus.username", dest="prom_user", metavar="NAME")
    g.add_argument("--prometheus.password-file", dest="prom_password_file", metavar="FILE")
    g.add_argument("--prometheus.bearer-token-file", dest="prom_token_file", metavar="FILE")
    j = p.add_argument_group("the job")
    j.add_argument(
        "--job",
        required=True,
        metavar="NAME",
        help="the job's name: the throughput series' job_name label",
    )
    j.add_argument("--namespace", default="", metavar="NS", help="its Kubernetes namespace")
    j.add_argument(
        "--pod-prefix",
        default=None,
        metavar="PREFIX",
        help="its pods' name prefix (default: the job's name and a dash)",
    )
    j.add_argument(
        "--nodes",
        default="",
        metavar="N1,N2",
        help="its nodes (instance label values), e.g. a Slurm job's node list",
    )
    w = p.add_argument_group("the window")
    w.add_argument(
        "--since",
        type=_time_arg,
        metavar="TIME",
        help="start (RFC 3339, unix seconds, or a duration ago like 6h)",
    )
    w.add_argument("--until", type=_time_arg, default="now", metavar="TIME")
    w.add_argument(
        "--window",
        type=duration,
        default=6 * 3600.0,
        metavar="DURATION",
        help="length when --since is not given (default: 6h)",
    )
    w.add_argument(
        "--change-at",
        type=_time_arg,
        metavar="TIME",
        help="the slowdown's start, when known (default: found in the throughput)",
    )
    o = p.add_argument_group("output")
    o.add_argument("--format", choices=("table", "json"), default="table")
    o.add_argument("--log.level", dest="log_level", choices=LEVELS, default="warning")
    o.add_argument("--log.format", dest="log_format", choices=("text", "json"), default="text")
    o.add_argument("--plot", metavar="FILE.png", help="throughput and top causes over time")
    o.add_argument(
        "--grafana.url",
        dest="grafana_url",
        default="",
        metavar="URL",
        help="Grafana base URL for links to the fabricscope dashboards' panels",
    )
