"""``fabricscope explain`` names NCCL traffic between NVLinked GPUs that does not use NVLink,
without a P2P baseline, on real data only: the expositions are the real agent's (``agent
--once``) replaying the snapshot of a lent 4x H100 (its sysfs and NVML recording,
tests/fixtures/snapshots) while reading the DDP job logs recorded on that machine
(tests/fixtures/nccl-logs/nccl-2.28.9-h100x4-ddp-*.log: P2P over the NVLinks at 47M tokens/s,
SHM with NCCL_P2P_DISABLE at 15M, sockets with SHM disabled too at 2.2M). Each run's
exposition is what that agent would export on every scrape while the run lasts, so the
history is that exposition every 15 s over its period, backfilled into a real Prometheus
(``promtool tsdb create-blocks-from openmetrics``), asked the bare-metal way (``--nodes``)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agentrun import fabricscope
from tests.lab.backfill import openmetrics_lines
from tests.promharness import PROMTOOL, Prometheus, start_prometheus

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "tests" / "fixtures" / "snapshots" / "h100x4.tar.gz"
LOGS = ROOT / "tests" / "fixtures" / "nccl-logs"
NODE = "h100x4"
STEP = 15.0
#: each run's period, seconds (the slow period is the second)
PERIOD = 900.0


def exposition(run: str) -> bytes:
    """The real agent's exposition for one recorded run (the job and NCCL series it reads)."""
    res = fabricscope(
        [
            "agent",
            "--once",
            f"--snapshot={SNAPSHOT}",
            f"--throughput.file={LOGS / f'nccl-2.28.9-h100x4-ddp-{run}.log'}=ddp",
            "--log.level=error",
        ]
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.encode()


def history(first: bytes, then: bytes, t0: float) -> Iterator[str]:
    for k in range(int(2 * PERIOD / STEP)):
        t = t0 + k * STEP
        yield from openmetrics_lines(first if t - t0 < PERIOD else then, NODE, t)


@pytest.fixture(scope="module")
def runs() -> dict[str, bytes]:
    return {r: exposition(r) for r in ("p2p", "shm", "socket")}


def serve(tmp: Path, first: bytes, then: bytes) -> tuple[Prometheus, float]:
    t0 = float(int(time.time() // 3600 * 3600) - 3 * 3600)
    om = tmp / "in.om"
    om.write_text("".join(history(first, then, t0)) + "# EOF\n")
    tsdb = tmp / "tsdb"
    done = subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(om), str(tsdb)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return start_prometheus(tmp / "prom", [], tsdb_path=tsdb), t0


def explain(prom: Prometheus, t0: float) -> dict[str, object]:
    start, change, end = t0, t0 + PERIOD, t0 + 2 * PERIOD - STEP
    res = fabricscope(
        [
            "explain",
            f"--prometheus.url={prom.url}",
            "--job=ddp",
            f"--nodes={NODE}",
            f"--since={time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(start))}",
            f"--until={time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(end))}",
            f"--change-at={time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(change))}",
            "--format=json",
        ],
        timeout=180,
    )
    assert res.returncode in (0, 1), res.stderr
    out: dict[str, object] = json.loads(res.stdout)
    return out


@pytest.mark.parametrize(
    ("first", "then"),
    [
        ("p2p", "shm"),  # the run that lost P2P: a P2P baseline exists
        ("shm", "socket"),  # SHM all along, then sockets: no P2P anywhere in the window
    ],
)
def test_explain_names_the_nvlink_bypass_without_a_p2p_baseline(
    tmp_path: Path, runs: dict[str, bytes], first: str, then: str
) -> None:
    prom, t0 = serve(tmp_path, runs[first], runs[then])
    with prom:
        report = explain(prom, t0)
    findings = report["findings"]
    assert isinstance(findings, list) and findings, report
    top = findings[0]
    assert isinstance(top, dict)
    assert top["cause"] == "nccl_nvlink", [f["cause"] for f in findings]
    assert top["stands_out"], top
    assert any(m.get("check") == "nccl_nvlink_bypass_share" for m in top["measurements"]), top


def test_explain_names_no_nvlink_bypass_when_p2p_stays(
    tmp_path: Path, runs: dict[str, bytes]
) -> None:
    """The same P2P run on both sides: nothing about NVLink stands out."""
    prom, t0 = serve(tmp_path, runs["p2p"], runs["p2p"])
    with prom:
        report = explain(prom, t0)
    findings = report["findings"]
    assert isinstance(findings, list)
    assert not [f for f in findings if f["cause"] == "nccl_nvlink" and f["stands_out"]], findings
