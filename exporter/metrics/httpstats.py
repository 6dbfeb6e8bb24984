"""What the metrics server's connection limits did, as a series: an attack on ``/metrics``
(idle, half-sent or slowly read connections, wrong passwords) shows in Prometheus, not only
in the log.

The server's event loop counts (one thread: no lock needed for the counts); every second,
when something changed, it renders the counts into the exposition cache's ``_http``
fragment, so a scrape still only joins cached bytes.
"""

from __future__ import annotations

from exporter.metrics.spec import Families, MetricSpec

#: fixed vocabulary of ``reason``
REASONS = (
    "auth_busy",
    "auth_throttled",
    "refused",
    "evicted",
    "header_timeout",
    "idle_timeout",
    "send_timeout",
    "too_many_requests",
    "health_delayed",
)

CONNECTIONS_CLOSED = MetricSpec(
    "fabricscope_http_connections_closed_total",
    "counter",
    "Connections the metrics server closed or refused because of its limits, and requests "
    "it answered 503 for load, by reason: refused (the client's address, or the server, was "
    "at its connection limit with every connection in use), evicted (an idle or half-sent "
    "connection closed to make room for a newcomer), header_timeout (no complete request "
    "within the header timeout), idle_timeout (keep-alive), send_timeout (the client did not "
    "read the response in time), too_many_requests (no longer counted: /healthz shares one "
    "readiness check a second), auth_throttled (429 without a password check: the client's "
    "address or IPv6 /64 spent its failed-login budget or has a check running), auth_busy "
    "(503 without a password check: as many checks of new credentials queued as allowed in "
    "all), health_delayed (a /healthz request answered a second late: its address asked "
    "more than 10 a second).",
    ("reason",),
)
HEALTH_SPEC = MetricSpec(
    "fabricscope_http_health_connections_closed_total",
    "counter",
    "Connections the /healthz listener (--web.health-listen-address) closed or refused "
    "because of its limits, by reason, as fabricscope_http_connections_closed_total counts "
    "them for the metrics server (too_many_requests, auth_throttled and auth_busy stay 0: "
    "/healthz asks no password and one readiness check a second answers every request).",
    ("reason",),
)
SPECS = (CONNECTIONS_CLOSED, HEALTH_SPEC)
OWNER = "_http"
#: the health listener's fragment of the exposition cache
HEALTH_OWNER = "_http_health"


class HttpStats:
    """Counts by reason, rendered as ``spec``; ``dirty`` until rendered."""

    def __init__(self, spec: MetricSpec = CONNECTIONS_CLOSED) -> None:
        self.spec = spec
        self.counts: dict[str, int] = dict.fromkeys(REASONS, 0)
        self.dirty = True

    def count(self, reason: str) -> None:
        if reason not in self.counts:
            raise ValueError(f"unknown reason {reason!r}")
        self.counts[reason] += 1
        self.dirty = True

    def render(self, out: Families) -> None:
        for reason in REASONS:
            out.add(self.spec, self.counts[reason], reason)
        self.dirty = False
