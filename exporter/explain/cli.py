"""``fabricscope explain``: why did this job get slow? (a Prometheus client, not a sampler)

    fabricscope explain --prometheus.url http://prometheus:9090 --namespace training \\
        --job llm --window 6h [--format json] [--plot explain.png]

Exit codes (also in ``--help``): 0 judged (causes found, or no fabric cause found), 1 could
not judge (too few checks had data of both periods, or the job's data holds no baseline or
slow period), 2 could not run (bad flags, Prometheus unreachable or refusing, no such job).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from exporter.explain import discover, render
from exporter.explain.client import (
    DEFAULT_MAX_BODY_BYTES,
    ClientSettings,
    PrometheusClient,
    PrometheusError,
)
from exporter.explain.plan import MAX_NAMES_PER_QUERY, RunLedger
from exporter.explain.report import ExplainError, explain
from exporter.explain.times import parse_time

__all__ = ["cmd_explain"]

log = logging.getLogger(__name__)


def cmd_explain(ns: argparse.Namespace) -> int:
    try:
        return _run(ns)
    except ExplainError as exc:
        print(f"fabricscope explain: {exc}", file=sys.stderr)
        return exc.exit_code
    except (PrometheusError, discover.JobNotFoundError) as exc:
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
            max_body_bytes=DEFAULT_MAX_BODY_BYTES if ns.prom_max_body is None else ns.prom_max_body,
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
        max_names=MAX_NAMES_PER_QUERY if ns.prom_max_names is None else ns.prom_max_names,
    )
    if report.warning:
        print(f"fabricscope explain: {report.warning}", file=sys.stderr)
    if report.verdict == "could not judge":
        print(f"fabricscope explain: could not judge: {report.reason}", file=sys.stderr)
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
    return report.exit_code
