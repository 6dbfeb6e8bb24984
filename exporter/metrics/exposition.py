"""Turns accumulated families into the Prometheus text format (via prometheus_client's
encoder) and keeps the rendered bytes per sampler, so a scrape only concatenates cached
fragments and never samples or re-renders."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterable

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from exporter.metrics.spec import Families

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Static(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self._metrics


def to_metrics(families: Families) -> list[Metric]:
    out = []
    for spec, samples in families.items():
        m = Metric(spec.family_name, spec.help, spec.type)
        for label_values, value in samples:
            m.add_sample(spec.name, dict(zip(spec.labels, label_values, strict=True)), value)
        out.append(m)
    return out


def render_text(families: Families) -> bytes:
    """The classic text exposition (version 0.0.4) of ``families``."""
    return generate_latest(_Static(to_metrics(families)))


class ExpositionCache:
    """Rendered fragments keyed by owner (a sampler name, or ``_self`` for the agent's own
    series). ``body()`` joins them in owner order; the gzip form is computed once per
    change, not once per scrape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fragments: dict[str, bytes] = {}
        self._body: bytes | None = None
        self._gzipped: bytes | None = None

    def set_fragment(self, owner: str, data: bytes) -> None:
        with self._lock:
            if self._fragments.get(owner) == data:
                return
            self._fragments[owner] = data
            self._body = None
            self._gzipped = None

    def update(self, owner: str, render: Callable[[], Families]) -> None:
        self.set_fragment(owner, render_text(render()))

    def body(self) -> bytes:
        with self._lock:
            if self._body is None:
                self._body = b"".join(v for _, v in sorted(self._fragments.items()))
            return self._body

    def gzipped(self) -> bytes:
        body = self.body()
        with self._lock:
            if self._gzipped is None:
                self._gzipped = gzip.compress(body, compresslevel=6, mtime=0)
            return self._gzipped
