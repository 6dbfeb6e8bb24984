"""End to end: the whole /metrics output of `fabricscope agent --once` over real fixture
trees, diffed against committed golden files and linted by the real promtool.

Regenerate after an intended change with ``make golden`` (UPDATE_GOLDEN=1)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.agentrun import fabricscope, normalise
from tests.promharness import promtool_check_metrics

GOLDEN = Path(__file__).resolve().parent / "golden"
FIXTURES = Path(__file__).resolve().parent / "fixtures"

TREES = {
    "dgx-h100": FIXTURES / "dgx-h100" / "sys",
    "procfs": FIXTURES / "procfs" / "sys",
    "node_exporter": FIXTURES / "node_exporter" / "sys",
}


#: (tree, --collector.detail): every tree at the shipped default, the DGX tree also at full
CASES = [(t, "default") for t in sorted(TREES)] + [("dgx-h100", "full")]


@pytest.mark.parametrize(("tree", "detail"), CASES)
def test_metrics_output_matches_golden_and_lints(tree: str, detail: str, tmp_path: Path) -> None:
    proc = fabricscope(
        [
            "agent",
            "--once",
            "--no-sampler.netdev",
            f"--path.sysfs={TREES[tree]}",
            # an empty procfs: the workload sampler must not see this host's /proc/modules
            f"--path.procfs={tmp_path}",
            "--kubelet.pod-resources-socket=",
            "--kubernetes.node-name=",
            # no pod logs: the throughput sampler must not read this host's /var/log/pods
            f"--path.pod-logs={tmp_path / 'no-pod-logs'}",
            "--log.level=error",
            f"--collector.detail={detail}",
        ]
    )
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    promtool_check_metrics(text)
    golden = GOLDEN / (f"{tree}.prom" if detail == "default" else f"{tree}.{detail}.prom")
    got = normalise(text)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(got)
    assert golden.read_text() == got, f"golden {golden.name} differs: run `make golden` if intended"
