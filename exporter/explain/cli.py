"""``fabricscope explain``: why did this job get slow? (a Prometheus client, not a sampler)

    fabricscope explain --prometheus.url http://prometheus:9090 --namespace training \\
        --job llm --window 6h [--format json] [--plot explain.png]
"""

from __future__ import annotations

import argparse
import datetime
import logging
import re
import sys
import time
from typing import Any

from agent.core.logsetup import LEVELS
from exporter.explain import discover, render
from exporter.explain.client import (
    DEFAULT_MAX_BODY_BYTES,
    ClientSettings,
    PrometheusClient,
    PrometheusError,
)
from exporter.explain.plan import MAX_NAMES_PER_QUERY, RunLedger
from exporter.explain.report import ExplainError, explain

log = logging.getLogger(__name__)

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d|w)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: str) -> float:
    m = _DURATION.match(value.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"not a duration like 90m, 6h or 2d: {value!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def _byte_count(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of bytes: {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte: {value!r}")
    return n


def parse_time(value: str, now: float | None = None) -> float:
    """``now``, a unix time, an RFC 3339 time (``2026-11-24T14:20:00Z``; no zone: UTC), or a
    duration ago (``2h``, ``-2h``)."""
    v = value.strip()
    now = time.time() if now is None else now
    if v == "now":
        return now
    try:
        return float(v)
    except ValueError:
        pass
    if _DURATION.match(v.lstrip("-")):
        return now - parse_duration(v.lstrip("-"))
    try:
        dt = datetime.datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time (now, unix seconds, RFC 3339, or a duration ago like 2h): {value!r}"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=datetime.UTC)
    return dt.timestamp()


def _time_arg(value: str) -> str:
    parse_time(value)  # validate now; evaluated against one "now" later
    return value


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value!r}")
    return n


def add_parser(sub: Any) -> None:
    """Register ``explain`` on the ``fabricscope`` subcommand parser."""
    p = sub.add_parser(
        "explain",
        help="rank the fabric causes of a job's slowdown, from Prometheus",
        description="Find when a job's throughput dropped and rank the node, port, link or "
        "misplacement behind it, from the metrics a Prometheus server holds.",
    )
    g = p.add_argument_group("Prometheus")
    g.add_argument("--prometheus.url", dest="prom_url", required=True, metavar="URL")
    g.add_argument(
        "--prometheus.timeout",
        dest="prom_timeout",
        type=parse_duration,
        default=10.0,
        metavar="DURATION",
        help="per request: connect, headers and the whole answer (default: 10s)",
    )
    g.add_argument(
        "--prometheus.max-body-bytes",
        dest="prom_max_body",
        type=_byte_count,
        default=DEFAULT_MAX_BODY_BYTES,
        metavar="BYTES",
        help="the largest answer read; a bigger one is an error (default: %(default)s, 64 MiB)",
    )
    g.add_argument(
        "--prometheus.max-nodes-per-query",
        dest="prom_max_names",
        type=_positive_int,
        default=MAX_NAMES_PER_QUERY,
        metavar="N",
        help="instances (or pods) one query names at most: a larger job's checks run as "
        "one query per group, each reading a bounded number of samples (default: %(default)s)",
    )
    g.add_argument(
        "--deadline",
        type=parse_duration,
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
        action="store_true",
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
        type=parse_duration,
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


def cmd_explain(ns: argparse.Namespace) -> int:
    try:
        return _run(ns)
    except (PrometheusError, ExplainError, discover.JobNotFoundError) as exc:
        print(f"fabricscope explain: {exc}", file=sys.stderr)
        return 2


def _run(ns: argparse.Namespace) -> int:
    now = time.time()
    end = parse_time(ns.until, now)
    start = parse_time(ns.since, now) if ns.since else end - ns.window
    if start >= end:
        raise ExplainError("--since must be before --until")
    change_at = parse_time(ns.change_at, now) if ns.change_at else None
    ledger = RunLedger(ns.deadline, stream=sys.stderr)
    client = PrometheusClient(
        ClientSettings(
            url=ns.prom_url,
            timeout=ns.prom_timeout,
            max_body_bytes=ns.prom_max_body,
            ca_file=ns.prom_ca,
            cert_file=ns.prom_cert,
            key_file=ns.prom_key,
            insecure=ns.prom_insecure,
            username=ns.prom_user,
            password_file=ns.prom_password_file,
            bearer_token_file=ns.prom_token_file,
        ),
        hook=ledger,
    )
    nodes = tuple(n for n in (x.strip() for x in ns.nodes.split(",")) if n)
    job = discover.JobSpec(ns.job, ns.namespace, ns.pod_prefix, nodes)
    report = explain(
        client,
        job,
        start,
        end,
        change_at=change_at,
        grafana=ns.grafana_url,
        max_names=ns.prom_max_names,
    )
    if ns.plot:
        from exporter.explain.plot import PlotUnavailableError, plot

        try:
            plot(client, report, ns.plot)
        except PlotUnavailableError as exc:
            raise ExplainError(str(exc)) from None
        except OSError as exc:
            raise ExplainError(f"cannot write {ns.plot}: {exc.strerror}") from None
    sys.stdout.write(render.to_json(report) if ns.format == "json" else render.text(report))
    log.info(
        "answered with %d queries, %.1f MB received (%.1f MB uncompressed) in %.1fs",
        ledger.requests,
        ledger.wire_bytes / 1e6,
        ledger.body_bytes / 1e6,
        ledger.elapsed(),
    )
    return 0
