"""What rendering a sampler's fragment costs, encoding every family each pass (as before)
against reusing the text of families whose samples did not change
(``exporter.metrics.exposition.FamilyCache``), on the DGX fixture tree's real samplers
(PCI, InfiniBand, netdev, and the 4x H100 NVML recording repeated to 8 GPUs) at the default
detail.

The fixture does not change between passes, so "unchanged" is the best case. Two cases are
closer to a busy node: every counter (``*_total``) family changed each pass, and every
sample of every family changed (the worst case: nothing reused, the cache's own cost only).
CPU seconds (``time.process_time``) per render of all fragments, median of ``--repeat``.

    python bench/bench_render.py [--repeat 30] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.config import AgentConfig, Sampling  # noqa: E402
from agent.core.sysfs import SysfsReader  # noqa: E402
from agent.nvml.record import ReplayNvml, load  # noqa: E402
from agent.nvml.sampler import NvmlSampler  # noqa: E402
from agent.samplers import Latest, build_specs  # noqa: E402
from exporter.app import AgentApp  # noqa: E402
from exporter.metrics.catalog import render_sampler  # noqa: E402
from exporter.metrics.exposition import FamilyCache, render_text  # noqa: E402
from exporter.metrics.spec import Families  # noqa: E402

DGX = ROOT / "tests" / "fixtures" / "dgx-h100" / "sys"
H100X4 = ROOT / "tests" / "fixtures" / "nvml" / "h100x4.recording.json"


def eight_gpus() -> ReplayNvml:
    """The 4x H100 recording with GPUs 4-7 answering as GPUs 0-3 (UUIDs made distinct)."""
    rec = load(H100X4)
    calls = dict(rec["calls"])  # type: ignore[arg-type]
    for key, entry in list(calls.items()):
        m = re.match(r"(\w+)\(([0-3])((?:,\d+)*)\)$", key)
        if m:
            g = int(m.group(2)) + 4
            e = json.loads(json.dumps(entry))
            if m.group(1) == "nvmlDeviceGetUUID":
                e["value"] = e["value"][:-2] + f"{g:02d}"
            calls[f"{m.group(1)}({g}{m.group(3)})"] = e
    calls["nvmlDeviceGetCount()"] = {"value": 8}
    return ReplayNvml({**rec, "calls": calls, "events": []})


def fragments() -> dict[str, Families]:
    config = AgentConfig(sampling=Sampling(frozenset({"pci", "infiniband", "netdev"})))
    latest = Latest()
    specs = build_specs(config, SysfsReader(DGX), latest=latest)
    app = AgentApp(specs, latest)
    app.runner.run_once()
    out = {n: render_sampler(app.runner.status(n), "default") for n in app.runner.names}
    nvml = NvmlSampler(eight_gpus, watch_xid=False)
    nvml.sample()
    snap = nvml.sample()
    from dataclasses import replace

    from agent.core.runner import SamplerStatus

    st = replace(SamplerStatus("nvml"), attempts_total=2, success=True, snapshot=snap)
    out["nvml"] = render_sampler(st, "default")
    return out


def changed(families: Families, k: int, which: str) -> Families:
    """``families`` with the values of ``which`` families (``counters`` or ``all``) moved
    by ``k``."""
    out = Families("full")
    for spec, samples in families.items():
        move = which == "all" or spec.name.endswith("_total")
        out.declare(spec)
        for labels, value in samples:
            out.add(spec, value + k if move else value, *labels)
    return out


def timed(fn: Callable[[], None], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def measure(frags: dict[str, Families], case: str, repeat: int) -> dict[str, float]:
    """CPU per render of every fragment, before and after, for one case."""
    caches = {n: FamilyCache() for n in frags}
    for n, f in frags.items():  # the first render fills the caches
        caches[n].render(f)
    k = [0]

    def plain() -> None:
        k[0] += 1
        for f in frags.values():
            render_text(f if case == "unchanged" else changed(f, k[0], case))

    def reused() -> None:
        k[0] += 1
        for n, f in frags.items():
            caches[n].render(f if case == "unchanged" else changed(f, k[0], case))

    def build_only() -> None:  # what making the changed families costs, taken off both
        k[0] += 1
        if case != "unchanged":
            for f in frags.values():
                changed(f, k[0], case)

    base = timed(build_only, repeat)
    before = timed(plain, repeat) - base
    after = timed(reused, repeat) - base
    for n, f in frags.items():  # the output is the same, byte for byte
        cur = f if case == "unchanged" else changed(f, 999_999, case)
        assert caches[n].render(cur) == render_text(cur), n
    return {
        "before_ms": round(before * 1000, 3),
        "after_ms": round(after * 1000, 3),
        "ratio": round(after / before, 3) if before else 0.0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--json", type=Path, default=None)
    ns = ap.parse_args()
    frags = fragments()
    series = {n: len(f) for n, f in frags.items()}
    result: dict[str, object] = {
        "machine": f"{platform.node()}: {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "series": series,
        "series_total": sum(series.values()),
    }
    cases = {case: measure(frags, case, ns.repeat) for case in ("unchanged", "counters", "all")}
    result["render_all_fragments"] = cases
    print(json.dumps(result, indent=2))
    if ns.json:
        ns.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
