"""bench/grpc_idle.py runs both client shapes against one real gRPC kubelet stand-in and
reports each one's CPU by thread (the figures themselves are the benchmark's, not checked)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_both_shapes_call_the_kubelet_and_are_accounted_by_thread(tmp_path: Path) -> None:
    out = tmp_path / "idle.json"
    got = subprocess.run(
        [
            *(sys.executable, "bench/grpc_idle.py"),
            *("--duration", "2", "--every", "0.5"),
            "--json",
            str(out),
        ],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode == 0, got.stderr[-2000:]
    result = json.loads(out.read_text())
    assert json.loads(got.stdout) == result
    for shape in ("kept", "per_call"):
        run = result[shape]
        assert run["calls"] >= 3, run
        assert run["seconds"] >= 2.0
        by_thread = sum(run["millicores_by_thread"].values())
        assert abs(run["millicores"] - by_thread) <= 0.01 * (1 + len(run["millicores_by_thread"]))
    assert result["kept"]["shape"] == "kept" and result["per_call"]["shape"] == "per-call"
