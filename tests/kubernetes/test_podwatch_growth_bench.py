"""``bench/podwatch_growth.py``, briefly: the pod watch against its stand-in API server (a
process of its own) over a few hundred watches and relists, its memory fitted per watch, and
the stand-in gone afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_growth_benchmark_watches_relists_fits_and_stops_its_server(tmp_path: Path) -> None:
    out = tmp_path / "growth.json"
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "podwatch_growth.py"),
            *("--watches", "300", "--samples", "10", "--pods", "20", "--json", str(out)),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    # a run this short fits the warm-up's growth: "above" (exit 1) is its honest verdict
    assert run.returncode in (0, 1), run.stderr[-2000:]
    got = json.loads(out.read_text())
    assert got["errors"] == []
    assert got["pods_in_index_at_end"] == 20  # one added and one deleted a watch: still 20
    watches = [w for w, *_ in got["samples"]]
    assert len(watches) == 10 and watches == sorted(watches) and watches[-1] >= 300
    assert got["lists"] >= watches[-1] // 10  # a 410 every tenth watch: a relist each
    growth = got["growth"]["rss"]
    assert growth["samples"] == sum(w > 30 for w in watches)  # the first tenth not fitted
    assert (run.returncode == 1) == (growth["verdict"] == "above")
    assert not Path(f"/proc/{got['server_pid']}").exists()  # the stand-in was stopped
