"""``bench/netdev_growth.py``, briefly: it samples real veths in a namespace of its own,
reads their ethtool statistics, fits its RSS over its passes and removes the namespace
(run as its own process: it enters the namespace it makes). Needs root and ``ip``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def test_the_growth_benchmark_reads_veths_fits_its_rss_and_leaves_no_namespace(
    tmp_path: Path,
) -> None:
    before = _namespaces()
    out = tmp_path / "growth.json"
    argv = ["--veths", "2", "--queues", "4", "--passes", "300", "--samples", "10"]
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "netdev_growth.py"), *argv, "--json", str(out)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    # a run this short fits the warm-up's growth: "above" (exit 1) is its honest verdict
    assert run.returncode in (0, 1), run.stderr[-2000:]
    got = json.loads(out.read_text())
    assert got["netdevs_sampled"] == 2
    assert got["netdevs_with_ethtool_read"] == 2
    assert len(got["samples"]) == 10
    assert [p for p, _ in got["samples"]] == list(range(30, 301, 30))
    growth = got["growth_at_15s"]
    assert growth["samples"] == 9  # the first tenth of the passes is not fitted
    assert growth["verdict"] in ("below", "above", "unresolved")
    assert (run.returncode == 1) == (growth["verdict"] == "above")
    assert _namespaces() == before
