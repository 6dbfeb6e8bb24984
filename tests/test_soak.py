"""The soak benchmark's short variant in CI: bench/soak.py runs the real agent for a minute
under pod churn (watch restarts, a 410 relist), rotated busy logs, scrapes and SIGKILLed NVML
children, fits each process's RSS and PSS over time and checks the fit against a bound.

A minute resolves only a gross leak: one page of jitter over 30 s is about 12 MiB a day, and
a warm process still settles for minutes, so the bound here (10 GiB a day: 7 MiB a minute, a
leak that would hit the chart's limit within the hour) catches what retains a pod list, a
scrape body or a child per pass. The hours-long run in docs/performance.md is the one that
speaks to 1 MiB a day."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_short_soak_stays_within_the_bound(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    proc = subprocess.run(
        [
            sys.executable, str(ROOT / "bench" / "soak.py"),
            "--warmup", "20", "--duration", "30", "--every", "2", "--scrape", "2",
            "--churn", "1", "--rotate", "10", "--kill-child", "15",
            "--max-slope", "10240", "--json", str(out),
        ],
        capture_output=True, text=True, timeout=240, check=False, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "soak: PASS" in proc.stdout
    result = json.loads(out.read_text())
    # the load happened: every process sampled, children killed and replaced, logs rotated
    assert {"main", "nvml child", "throughput child"} <= set(result["processes"])
    assert result["nvml_child_kills"] >= 2 and result["nvml_child_restarts"] >= 1
    assert result["log_rotations"] >= 3 and result["scrapes"] >= 15
    assert all(result["processes"][p]["samples"] >= 5 for p in ("main", "throughput child"))
