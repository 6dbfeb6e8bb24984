"""bench/probe_accuracy.py, the helper of scripts/gpu_probe_accuracy.sh: its nccl-tests parser
on real nccl-tests logs (tests/fixtures/nccl-tests: 8x A100 from microsoft/superbenchmark, and
one H200 at one rank recorded by this project; see PROVENANCE.md), and the whole helper end
to end with the probe over gloo on CPU (its GPU runs are in docs/performance.md)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "nccl-tests" / "microsoft-superbenchmark"
H200_1RANK = Path(__file__).resolve().parents[1] / "fixtures" / "nccl-tests" / "h200-1rank"


def helper() -> ModuleType:
    if "probe_accuracy" in sys.modules:
        return sys.modules["probe_accuracy"]
    spec = importlib.util.spec_from_file_location(
        "probe_accuracy", ROOT / "bench" / "probe_accuracy.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["probe_accuracy"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def run_helper(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "bench/probe_accuracy.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_parser_reads_the_in_place_columns_of_a_real_log() -> None:
    acc = helper()
    rows = acc.parse_nccl_tests((LOGS / "nccl_allreduce.log").read_text())
    # 0 B twice, then 4 B .. 8 GiB: one row per size; NCCL INFO and comment lines skipped
    assert min(rows) == 0 and max(rows) == 8 << 30
    assert 8192 in rows and (1 << 20) in rows
    # the row "8192 2048 float sum 35.91 0.23 0.40 N/A 36.07 0.23 0.40 N/A": in-place
    assert rows[8192] == acc.Row(8192, 36.07, 0.40)
    for row in rows.values():
        assert row.time_us > 0 and row.busbw_gbps >= 0


def test_parser_reads_the_current_layout_with_a_wrong_count() -> None:
    """nccl-tests today (src/util.cu writeBenchmarkLineBody): a redop and root column, and
    ``#wrong`` as a number instead of N/A."""
    acc = helper()
    text = (
        "#       size         count      type   redop    root     time   algbw   busbw #wrong"
        "     time   algbw   busbw #wrong\n"
        "     1048576        262144     float     sum      -1    22.41   46.79   46.79      0"
        "    22.02   47.62   47.62      0\n"
        "# Avg bus bandwidth    : 47.2\n"
    )
    assert acc.parse_nccl_tests(text) == {1 << 20: acc.Row(1 << 20, 22.02, 47.62)}
    assert acc.parse_nccl_tests(text, "out-of-place") == {1 << 20: acc.Row(1 << 20, 22.41, 46.79)}


def test_parser_reads_the_out_of_place_column_of_a_real_log() -> None:
    """What the probe's sendrecv (a second receive buffer) is compared with."""
    acc = helper()
    rows = acc.parse_nccl_tests((LOGS / "nccl_allreduce.log").read_text(), "out-of-place")
    assert rows[8192] == acc.Row(8192, 35.91, 0.40)
    with pytest.raises(ValueError, match="column"):
        acc.parse_nccl_tests("", "both")


@pytest.mark.parametrize(
    ("size", "ratio", "ok"),
    [
        (1 << 20, 0.91, True),
        (1 << 20, 0.89, False),
        (8192, 0.81, True),
        (8192, 1.19, True),
        (8192, 0.79, False),
        (8192, None, False),
    ],
)
def test_targets(size: int, ratio: float | None, ok: bool) -> None:
    assert helper().within(size, ratio) is ok


def test_the_helper_end_to_end_over_gloo(tmp_path: Path) -> None:
    logs = tmp_path / "nccl-tests"
    logs.mkdir()
    shutil.copy(LOGS / "nccl_allreduce.log", logs / "all_reduce_perf.log")
    out = tmp_path / "out"
    done = run_helper(
        *("--nccl-tests-dir", str(logs), "--out", str(out), "--backend", "gloo"),
        *("--sizes", "8K,64K", "--timings", "eager", "--heatmap"),
    )
    # CPU gloo is nowhere near 8 A100s: off target, exit 1, but every number is there
    assert done.returncode == 1, done.stderr
    rows = json.loads((out / "accuracy.json").read_text())
    ar = [r for r in rows if r["collective"] == "all_reduce"]
    assert [r["size_bytes"] for r in ar] == [8192, 65536]
    for r in ar:
        assert r["nccl_tests_busbw_gbps"] > 0 and r["probe_eager_time_us"] > 0
        assert r["nccl_tests_column"] == "in-place"
        # the ratio is nccl-tests' time over the probe's (the busbw ratio when both ran
        # the same rank count; this log is 8 ranks, the probe 2)
        assert r["ratio_eager"] == pytest.approx(r["nccl_tests_time_us"] / r["probe_eager_time_us"])
        # auto, the judged timing, was not asked for: no figure, off target
        assert r["probe_time_us"] is None and r["on_target"] is False
    assert any(r["collective"] == "latency" and r["probe_eager_time_us"] for r in rows)
    table = (out / "accuracy.md").read_text()
    assert table.startswith("| collective | size |") and "| all_reduce | 8 KiB |" in table
    assert (out / "heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_parser_reads_a_one_rank_h200_log() -> None:
    """At one rank nccl-tests prints busbw 0 for all_reduce, and its in-place sendrecv moves
    nothing (2-3 us at every size) while out of place copies: why sendrecv is compared with
    the out-of-place column."""
    acc = helper()
    ar = acc.parse_nccl_tests((H200_1RANK / "all_reduce_perf.log").read_text())
    assert sorted(ar) == [8192 << i for i in range(14)]
    assert ar[8192] == acc.Row(8192, 0.29, 0.0)
    sr = (H200_1RANK / "sendrecv_perf.log").read_text()
    assert acc.parse_nccl_tests(sr, "out-of-place")[64 << 20] == acc.Row(64 << 20, 42.74, 1570.2)
    assert acc.parse_nccl_tests(sr)[64 << 20].time_us == 3.50  # in place: no copy


def test_one_rank_check_reads_times_where_all_reduce_has_no_bus_bandwidth(
    tmp_path: Path,
) -> None:
    """``--ranks 1`` (the one-GPU timing check) against the H200's one-rank nccl-tests logs:
    all_reduce on one rank has busbw 0 on both sides, so the ratio comes from the times, and
    it is shown, not judged (nothing moves). gloo cannot send to itself: sendrecv is
    reported as not run, not a crash, and counts as off target."""
    out = tmp_path / "out"
    done = run_helper(
        *("--nccl-tests-dir", str(H200_1RANK), "--out", str(out), "--backend", "gloo"),
        *("--sizes", "8K", "--timings", "auto", "--ranks", "1"),
    )
    assert done.returncode == 1, done.stderr  # sendrecv has no figure: off target
    assert "# probe sendrecv: not run: sendrecv needs world_size >= 2" in done.stderr
    rows = json.loads((out / "accuracy.json").read_text())
    (ar,) = [r for r in rows if r["collective"] == "all_reduce"]
    assert ar["ranks"] == 1 and ar["nccl_tests_busbw_gbps"] == 0.0
    assert ar["probe_busbw_gbps"] == 0.0  # bus factor 0 at one rank
    assert ar["ratio"] == pytest.approx(0.29 / ar["probe_time_us"])
    assert ar["on_target"] is None
    (sr,) = [r for r in rows if r["collective"] == "sendrecv"]
    assert sr["nccl_tests_column"] == "out-of-place" and sr["nccl_tests_time_us"] == 10.56
    assert sr["probe_time_us"] is None and sr["on_target"] is False
    assert "(one rank: no work)" in (out / "accuracy.md").read_text()


def test_heatmap_needs_two_ranks(tmp_path: Path) -> None:
    done = run_helper(
        *("--nccl-tests-dir", str(tmp_path), "--out", str(tmp_path)),
        *("--ranks", "1", "--heatmap"),
        timeout=60,
    )
    assert done.returncode == 2 and "--ranks must be >= 1, and >= 2 with --heatmap" in done.stderr
