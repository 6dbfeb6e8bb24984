"""Turns accumulated families into the Prometheus text format (via prometheus_client's
encoder) and keeps the rendered bytes per sampler, so a scrape only concatenates cached
fragments and never samples.

A fragment that many updates invalidate (the agent's own series and the node's findings
change with every sampler's pass: 8 samplers, a pass each every 15 s) is rendered lazily: an
update only marks it stale, and the next ``body()`` renders it once, so it costs one render
per scrape (every 30 s) instead of one per sampler pass."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterable, Sequence

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from exporter.metrics.spec import Families, MetricSpec

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Static(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self._metrics


def _metric(spec: MetricSpec, samples: Sequence[tuple[tuple[str, ...], float]]) -> Metric:
    m = Metric(spec.family_name, spec.help, spec.type)
    for label_values, value in samples:
        m.add_sample(spec.name, dict(zip(spec.labels, label_values, strict=True)), value)
    return m


def to_metrics(families: Families) -> list[Metric]:
    return [_metric(spec, samples) for spec, samples in families.items()]


def render_text(families: Families, reuse: FamilyCache | None = None) -> bytes:
    """The classic text exposition (version 0.0.4) of ``families``; with ``reuse``, a
    family whose samples are those it last rendered is not encoded again."""
    if reuse is not None:
        return reuse.render(families)
    return generate_latest(_Static(to_metrics(families)))


class FamilyCache:
    """The text of each family one owner last rendered, kept with its samples: a family
    whose samples (label values and values) are unchanged is reused, the others encoded by
    prometheus_client as before. The text format is each family's text in order, so the
    result is byte for byte what :func:`render_text` gives. Most of a node's families hold
    the same samples pass after pass (identity and state series, error counters at zero),
    and encoding is most of what rendering costs (about 9 us a sample). Holds the latest
    render's families only."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, tuple[list[tuple[tuple[str, ...], float]], bytes]] = {}

    def render(self, families: Families) -> bytes:
        with self._lock:
            parts: list[bytes] = []
            kept: dict[str, tuple[list[tuple[tuple[str, ...], float]], bytes]] = {}
            for spec, samples in families.items():
                old = self._last.get(spec.name)
                if old is not None and old[0] == samples:
                    text = old[1]
                else:
                    text = generate_latest(_Static([_metric(spec, samples)]))
                kept[spec.name] = (samples, text)
                parts.append(text)
            self._last = kept
            return b"".join(parts)


class ExpositionCache:
    """Rendered fragments keyed by owner (a sampler name, or ``_self`` for the agent's own
    series). ``body()`` joins them in owner order; the gzip form is computed once per
    change, not once per scrape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._render_lock = threading.Lock()  # one lazy render at a time, never under _lock
        self._fragments: dict[str, bytes] = {}
        self._renderers: dict[str, Callable[[], bytes]] = {}
        self._stale: set[str] = set()
        self._body: bytes | None = None
        self._gzipped: bytes | None = None

    def set_renderer(self, owner: str, render: Callable[[], bytes]) -> None:
        """Render ``owner``'s fragment lazily: ``render`` is called by the first ``body()``
        after each :meth:`invalidate` (and after this call), on the caller's thread. It must
        not raise: a renderer catches its own failures and returns what it can."""
        with self._lock:
            self._renderers[owner] = render
            self._stale.add(owner)
            self._body = None
            self._gzipped = None

    def invalidate(self, owner: str) -> None:
        """``owner``'s lazy fragment is out of date: rendered again by the next ``body()``."""
        with self._lock:
            if owner in self._renderers:
                self._stale.add(owner)
                self._body = None
                self._gzipped = None

    def _render_stale(self) -> None:
        # under _render_lock: a body() beside a render waits for it, never joins without it
        with self._lock:
            stale = [(o, self._renderers[o]) for o in sorted(self._stale)]
            self._stale.clear()
        for owner, render in stale:
            self.set_fragment(owner, render())

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
        with self._render_lock:
            if self._stale:  # an invalidation racing this read is rendered by the next body()
                self._render_stale()
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
