"""The accuracy benchmark's fixed CI slice (bench/explain_accuracy.py): six cases of six
classes at 16 nodes, generated from seed 11 (a spine, a cable erring at its switch end, one
pod's NCCL falling back to sockets, a hung rank, a healthy window, two faults at once), each
backfilled into a real Prometheus and asked as an SRE would ask; every one must come out
right (top-1 100 %, no false cause on the healthy window), as it did when the slice was
fixed. It fails on a regression: without the checks of a cable's switch end its cable case
ranks nothing first. With them, one case replayed from a full run: the healthy 64-node
window of seed 25 (case 67) where two background trickles under one leaf named the leaf
before the leaf test weighed how strongly its ports err (it fails on that code). 10 s on
a quiet machine, 17-23 s on the loaded 2-core one. The full benchmark and its table of misses:
docs/explain.md; the spine at 1,024 nodes is held by tests/explain/test_explain_switches.py
(two of 71 leaves' links to one spine), which a slice of this size cannot afford."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SLICE = "spine,cable_far_end,nccl_socket,hung_rank,healthy,two_faults"
#: cases of full runs that once came out wrong (seed:case:class:nodes)
REPLAYED = "25:67:healthy:64"


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "explain_accuracy", ROOT / "bench" / "explain_accuracy.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["explain_accuracy"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_ci_slice_comes_out_right(tmp_path: Path) -> None:
    bench = _bench()
    out = tmp_path / "slice.json"
    args = ["--seed", "11", "--cases", "6", "--sizes", "16", "--classes", SLICE]
    args += ["--replay", REPLAYED, "--workdir", str(tmp_path / "work"), "--json", str(out)]
    rc = bench.main([*args, "--min-top1", "1.0", "--max-false", "0.0"])
    summary = json.loads(out.read_text())
    assert rc == 0, summary["misses"]
    assert summary["all"]["cases"] == 7
    replayed = [(c["seed"], c["case"], c["class"], c["nodes"]) for c in summary["cases"]][-1]
    assert replayed == (25, 67, "healthy", 64)
    assert summary["all"]["top1"] == 1.0 and summary["all"]["false_causes"] == 0.0


def test_cases_are_drawn_from_the_seed() -> None:
    """The same seed gives the same cases; the generator covers the 15 classes."""
    bench = _bench()
    a = bench.cases_for(5, 30, [64, 1024], list(bench.CLASSES))
    b = bench.cases_for(5, 30, [64, 1024], list(bench.CLASSES))
    assert [(c.cls, c.nodes, c.faults, c.leaves) for c in a] == [
        (c.cls, c.nodes, c.faults, c.leaves) for c in b
    ]
    assert len(bench.CLASSES) == 15 and {c.cls for c in a} == set(bench.CLASSES)
    two = [c for c in a if c.cls == "two_faults"]
    assert two and all(len(c.faults) == 2 for c in two)
    for c in two:
        nodes = [f.node for f in c.faults if f.node >= 0]  # a switch fault has none
        assert len(set(nodes)) == len(nodes), c.faults
    assert all(not c.faults for c in a if c.cls == "healthy")
    # a stronger background (--trickle) is the same trickles on the same ports, scaled
    weak, strong = bench.make_case(5, 3, "healthy", 64), bench.make_case(5, 3, "healthy", 64, 2.0)
    for kind in ("trickles", "far_trickles", "uplink_trickles"):
        w, s = getattr(weak, kind), getattr(strong, kind)
        assert w and w.keys() == s.keys()
        assert all(s[k] == pytest.approx(4 * w[k]) for k in w)
        assert max(s.values()) <= 2.0 / 60
