"""The series budget in CI: bench/series_budget.py counts what the real agent exports for an
8-GPU, 8-NIC node (the DGX fixture tree, the 2x H200 NVML recording, modelled netdevs) and
fails when the InfiniBand or the RoCE node's default detail costs more than 1,200 series, the
ibpeer sampler's fabric map included. The counts the docs quote (docs/performance.md,
docs/install.md, the README) are the ones the script writes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "series_budget.py"


def run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, object]]:
    out = tmp_path / "budget.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--json", str(out), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return proc, json.loads(out.read_text()) if out.exists() else {}


Counts = dict[str, dict[str, dict[str, int]]]


@pytest.fixture(scope="module")
def budget(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Counts]:
    proc, counts = run(tmp_path_factory.mktemp("budget"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout, counts  # type: ignore[return-value]


def test_default_detail_is_within_the_budget_and_full_keeps_everything(
    budget: tuple[str, Counts],
) -> None:
    stdout, counts = budget
    assert "series_budget: ok" in stdout
    totals = {
        (node, detail): c["total"]
        for node, by_detail in counts.items()
        for detail, c in by_detail.items()
    }
    assert totals[("ib", "default")] <= 1200 and totals[("roce", "default")] <= 1200
    # the fabric map: 7 cables' far ends and 7 uplinks read (the 8th port is down)
    assert counts["ib"]["default"]["ibpeer"] == 28  # type: ignore[index]
    for node in ("ib", "roce"):
        assert totals[(node, "minimal")] <= totals[(node, "default")] < totals[(node, "full")]
    # the model is whole: at full the node costs what was measured before the folds
    # (about 3,000 on InfiniBand without netdevs), so a sampler silently missing would show
    assert totals[("ib", "full")] > 3500 and totals[("roce", "full")] > 4000
    ib = counts["ib"]["default"]
    assert ib["nvml (per GPU x 8)"] > 8 * 20 and ib["infiniband"] > 12 * 20


def test_the_script_fails_above_the_budget(tmp_path: Path) -> None:
    proc, _ = run(tmp_path, "--budget", "1000")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL" in proc.stdout and "over the budget of 1000" in proc.stdout


def test_the_script_checks_the_roce_node_too(budget: tuple[str, Counts], tmp_path: Path) -> None:
    """A budget the InfiniBand node meets and the RoCE node does not fails on RoCE alone."""
    _, counts = budget
    ib = counts["ib"]["default"]["total"]  # type: ignore[index]
    roce = counts["roce"]["default"]["total"]  # type: ignore[index]
    assert ib < roce, "the RoCE node (12 Ethernet ports) exports more than the InfiniBand one"
    proc, _ = run(tmp_path, "--budget", str(ib))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"8-GPU RoCE node exports {roce} series" in proc.stdout
    assert "InfiniBand node exports" not in proc.stdout


#: the rows of docs/performance.md's table and the script's areas each sums
DOC_ROWS = {
    "InfiniBand / RDMA ports": ("infiniband",),
    "netdev": ("netdev",),
    "ibpeer (7 cables' far ends, 7 uplinks)": ("ibpeer",),
    "NVML (8 GPUs)": ("nvml (node)", "nvml (per GPU x 8)"),
    "PCI + topology": ("pci", "topology"),
    "agent, findings, workload": ("agent", "other"),
    "**total**": ("total",),
}
COLUMNS = [(n, d) for n in ("ib", "roce") for d in ("minimal", "default", "full")]


def number(text: str) -> int:
    return int(text.strip().strip("*").replace(",", ""))


def test_the_docs_quote_the_counts_the_script_writes(budget: tuple[str, Counts]) -> None:
    _, counts = budget
    perf = (ROOT / "docs" / "performance.md").read_text()
    rows = {}
    for line in perf[perf.index("## What a node costs Prometheus") :].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in DOC_ROWS:
            rows[cells[0]] = [number(c) for c in cells[1:]]
    assert set(rows) == set(DOC_ROWS), "docs/performance.md's series table lost a row"
    for row, areas in DOC_ROWS.items():
        got = [sum(counts[n][d].get(a, 0) for a in areas) for n, d in COLUMNS]
        assert rows[row] == got, f"docs/performance.md, {row}: {rows[row]}; the script: {got}"
    # docs/install.md's fleet table: per node, then 1,000 nodes at a 30 s scrape, and
    # Prometheus's memory at 2-7.2 GiB per million series (rounded as printed)
    install = (ROOT / "docs" / "install.md").read_text()
    for detail in ("minimal", "default", "full"):
        line = next(ln for ln in install.splitlines() if ln.startswith(f"| {detail} "))
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        ib, roce = counts["ib"][detail]["total"], counts["roce"][detail]["total"]
        assert [number(x) for x in cells[1].split("/")] == [ib, roce], line
        expected = [
            (ib / 1000, roce / 1000),  # million series
            (ib / 30, roce / 30),  # thousand samples a second
            (ib / 1000 * 2, roce / 1000 * 7.2),  # GiB
        ]
        for cell, (low, high) in zip(cells[2:5], expected, strict=True):
            a, b = (float(x) for x in re.findall(r"[\d.]+", cell)[:2])
            assert abs(a - low) <= 0.03 * low and abs(b - high) <= 0.03 * high, (cell, low, high)
    readme = (ROOT / "README.md").read_text()
    ib, roce = counts["ib"]["default"]["total"], counts["roce"]["default"]["total"]
    assert f"{ib:,} (InfiniBand) / {roce:,} (RoCE)" in readme
