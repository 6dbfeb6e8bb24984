"""The exposition cache's lazy fragments: the agent's own series and the node's findings are
rendered by the next scrape, once, however many sampler passes made them stale; a scrape
still serves what every pass before it captured."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from agent.config import AgentConfig, Sampling
from agent.core.sysfs import SysfsReader
from agent.samplers import Latest, build_specs
from exporter.app import AgentApp
from exporter.metrics import findings
from exporter.metrics.catalog import SELF_OWNER
from exporter.metrics.exposition import ExpositionCache, FamilyCache, render_text
from exporter.metrics.spec import Families, MetricSpec


def test_a_lazy_fragment_renders_once_per_body_after_any_number_of_invalidations() -> None:
    cache = ExpositionCache()
    calls = []

    def render() -> bytes:
        calls.append(1)
        return f"x_total {len(calls)}\n".encode()

    cache.set_fragment("a", b"a 1\n")
    cache.set_renderer("z", render)
    assert calls == []  # nothing rendered until someone asks
    assert cache.body() == b"a 1\nx_total 1\n"
    assert cache.body() == b"a 1\nx_total 1\n"  # not stale: not rendered again
    for _ in range(16):  # two passes of eight samplers between two scrapes
        cache.invalidate("z")
    assert cache.body() == b"a 1\nx_total 2\n"
    assert len(calls) == 2
    cache.invalidate("unknown")  # no renderer: nothing to do
    assert cache.body() == b"a 1\nx_total 2\n"


def test_gzip_follows_a_lazy_render() -> None:
    import gzip

    cache = ExpositionCache()
    n = [0]

    def render() -> bytes:
        n[0] += 1
        return f"y {n[0]}\n".encode()

    cache.set_renderer("y", render)
    assert gzip.decompress(cache.gzipped()) == b"y 1\n"
    cache.invalidate("y")
    assert gzip.decompress(cache.gzipped()) == b"y 2\n"


def test_concurrent_scrapes_render_a_stale_fragment_once() -> None:
    cache = ExpositionCache()
    started, release = threading.Event(), threading.Event()
    calls = []

    def render() -> bytes:
        calls.append(1)
        started.set()
        release.wait(10)
        return b"slow 1\n"

    cache.set_renderer("s", render)
    bodies: list[bytes] = []
    first = threading.Thread(target=lambda: bodies.append(cache.body()))
    first.start()
    assert started.wait(10)
    second = threading.Thread(target=lambda: bodies.append(cache.body()))
    second.start()
    release.set()
    first.join(10)
    second.join(10)
    assert bodies == [b"slow 1\n", b"slow 1\n"]
    assert len(calls) == 1


def test_the_agent_renders_its_own_series_and_findings_per_scrape_not_per_pass(
    dgx_sys_root: Path,
) -> None:
    """Three passes of every sampler, one scrape: the self and findings fragments are
    rendered once each (they were rendered after every sampler's pass), and the scrape
    shows the latest pass's counts."""
    config = AgentConfig(sampling=Sampling(frozenset({"pci", "infiniband", "netdev"})))
    latest = Latest()
    app = AgentApp(build_specs(config, SysfsReader(dgx_sys_root), latest=latest), latest)
    counted = {SELF_OWNER: 0, findings.OWNER: 0}
    original_self, original_findings = app._self_text, app._findings_text

    def self_text() -> bytes:
        counted[SELF_OWNER] += 1
        return original_self()

    def findings_text() -> bytes:
        counted[findings.OWNER] += 1
        return original_findings()

    app._self_text = self_text  # type: ignore[method-assign]
    app._findings_text = findings_text  # type: ignore[method-assign]
    app.cache.set_renderer(SELF_OWNER, app._self_text)
    for _ in range(3):
        app.runner.run_once()
    body = app.cache.body().decode()
    assert counted == {SELF_OWNER: 1, findings.OWNER: 1}
    assert 'fabricscope_sampler_attempts_total{sampler="pci"} 3.0' in body
    assert "fabricscope_findings{" in body
    assert app.cache.body().decode() == body  # no pass since: nothing rendered again
    assert counted == {SELF_OWNER: 1, findings.OWNER: 1}


def _families(step: int) -> Families:
    """Families that change in every way between renders: values, a label value, a family
    added and one gone, NaN, and an untouched one."""
    errors = MetricSpec("fabricscope_test_errors_total", "counter", "Errors.", ("port",))
    state = MetricSpec("fabricscope_test_state", "gauge", "State.", ("port", "reason"))
    extra = MetricSpec("fabricscope_test_extra", "gauge", "Only on odd steps.")
    fixed = MetricSpec("fabricscope_test_fixed_info", "gauge", "Never changes.", ("device",))
    out = Families("full")
    out.add(errors, step // 2, "1")  # the same on two renders, then moves
    out.add(errors, 0, "2")
    out.add(state, float("nan") if step == 3 else 1.0, "1", f'n"{step % 2}\\')
    if step % 2:
        out.add(extra, step)
    out.add(fixed, 1, "a")
    return out


def test_family_reuse_renders_byte_for_byte_what_a_full_render_gives() -> None:
    reuse = FamilyCache()
    for step in range(8):
        fams = _families(step)
        assert reuse.render(fams) == render_text(fams), step
        assert render_text(fams, reuse) == render_text(fams), step
    assert reuse.render(Families("full")) == render_text(Families("full")) == b""


def test_family_reuse_encodes_only_the_families_that_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from exporter.metrics import exposition

    encoded: list[str] = []
    real = exposition.generate_latest

    def counting(registry: Any) -> bytes:
        encoded.extend(m.name for m in registry.collect())
        return real(registry)

    monkeypatch.setattr(exposition, "generate_latest", counting)
    reuse = FamilyCache()
    reuse.render(_families(0))
    assert len(encoded) == 3  # the first render encodes all (no "extra" on even steps)
    encoded.clear()
    reuse.render(_families(0))
    assert encoded == []  # nothing changed: nothing encoded
    reuse.render(_families(2))  # errors moved (0 -> 1), state's label back to n"0\
    assert encoded == ["fabricscope_test_errors"]
