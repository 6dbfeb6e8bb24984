"""Wires the agent's runner to the exposition cache: every sampler attempt re-renders that
sampler's fragment once; the agent's own series and the node's findings, which every pass
changes, are marked stale and rendered once by the next scrape (not once per sampler pass),
so scrapes join cached bytes and render at most those two."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from agent.core.procstat import ProcessStats, read_process
from agent.core.runner import Runner, SamplerSpec, SamplerStatus
from agent.core.sampler import Snapshot
from agent.samplers import DEPENDENT, Latest
from exporter.metrics import findings
from exporter.metrics.catalog import SELF_OWNER, render_sampler, render_self
from exporter.metrics.exposition import ExpositionCache, FamilyCache, render_text
from exporter.metrics.spec import Detail, Families

log = logging.getLogger(__name__)


class AgentApp:
    """The runner plus the cache it feeds. ``ready()`` turns true once every sampler has
    made its first attempt. ``wall_clock`` stamps successes (the scenario lab replays
    simulated time through it). ``detail`` is ``--collector.detail``: how much each sampler's
    fragment carries (exporter/metrics/spec.py)."""

    def __init__(
        self,
        specs: Sequence[SamplerSpec],
        latest: Latest | None = None,
        *,
        wall_clock: Callable[[], float] = time.time,
        detail: Detail = "default",
        memory_limit_bytes: int | None = None,
        process_stats: Callable[[], ProcessStats | None] | None = read_process,
    ) -> None:
        self.detail: Detail = detail
        self._memory_limit = memory_limit_bytes
        self._process_stats = process_stats
        self.cache = ExpositionCache()
        self._render_errors: dict[str, int] = {}
        self._lock = threading.Lock()
        self._family_caches: dict[str, FamilyCache] = {}
        self.runner = Runner(specs, on_update=self._on_update, wall_clock=wall_clock, announce=True)
        if latest is not None:
            latest.bind(self._latest, self._status)
        self.cache.set_renderer(SELF_OWNER, self._self_text)

    def _self_text(self) -> bytes:
        """The agent's own series (rendered by a scrape: a failure costs them, not it)."""
        try:
            return render_text(self._self_families(), self._reuse(SELF_OWNER))
        except Exception:
            log.exception("rendering the agent's own series failed; they are withdrawn")
            return b""

    def _self_families(self) -> Families:
        with self._lock:
            errors = dict(self._render_errors)
        main = self._process_stats() if self._process_stats is not None else None
        return render_self(
            self.runner.statuses(),
            errors,
            self.detail,
            main=main,
            memory_limit_bytes=self._memory_limit,
        )

    def _reuse(self, owner: str) -> FamilyCache:
        with self._lock:
            cache = self._family_caches.get(owner)
            if cache is None:
                cache = self._family_caches[owner] = FamilyCache()
            return cache

    def _on_update(self, name: str) -> None:
        try:
            families = render_sampler(self.runner.status(name), self.detail)
            data = render_text(families, self._reuse(name))
        except Exception:
            # A rendering bug must cost this sampler's series, not the scrape; counted.
            log.exception("rendering sampler %s failed; its series are withdrawn", name)
            with self._lock:
                self._render_errors[name] = self._render_errors.get(name, 0) + 1
            data = b""
        self.cache.set_fragment(name, data)
        if name in findings.SOURCES:  # registered by the first source's pass, stale after each
            self.cache.set_renderer(findings.OWNER, self._findings_text)
        self.cache.invalidate(SELF_OWNER)

    def _findings_text(self) -> bytes:
        """The node's findings across samplers; a failure costs this fragment, counted."""
        out = Families(self.detail)
        try:
            findings.render(self.runner.statuses(), out)
        except Exception:
            log.exception("rendering the node's findings failed; their series are withdrawn")
            with self._lock:
                n = self._render_errors.get("findings", 0)
                self._render_errors["findings"] = n + 1
            return b""
        return render_text(out, self._reuse(findings.OWNER))

    def ready(self) -> bool:
        return all(st.attempts_total > 0 for st in self.runner.statuses().values())

    def _status(self, name: str) -> SamplerStatus | None:
        return self.runner.status(name) if name in self.runner.names else None

    def _latest(self, name: str) -> Snapshot | None:
        return self.runner.status(name).snapshot if name in self.runner.names else None

    def run_once(self) -> bytes:
        """One pass of every sampler: the independent ones in parallel, then the joining
        ones in order (attribution needs NVML's pass, workload needs attribution's)."""
        self.runner.run_once([n for n in self.runner.names if n not in DEPENDENT])
        for name in DEPENDENT:
            self.runner.run_once([name])
        return self.cache.body()
