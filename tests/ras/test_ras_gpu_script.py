"""The GPU proof's own evaluation of the alert expressions (scripts/gpu_ras_verify.py: no
Prometheus runs on the GPU machine) agrees with deploy/rules/ras.rules.yaml on the cases
tests/rules/ras.test.yaml holds, and its RAS answer reader reads the recorded answers."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gpu_ras_verify", ROOT / "scripts/gpu_ras_verify.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_ras_verify"] = mod
    spec.loader.exec_module(mod)
    return mod


V = load()
EP = {"namespace": "", "job_name": "", "ras_endpoint": "127.0.0.1:28028"}


def job(unchanged: float, *, mismatched: int = 0, unresponsive: int = 0, named: str = "") -> list:
    out = [
        ("fabricscope_nccl_ras_counts_unchanged_seconds", dict(EP), unchanged),
        ("fabricscope_nccl_ras_mismatched_communicators", dict(EP), float(mismatched)),
        ("fabricscope_nccl_ras_ranks", dict(EP, state="responsive"), 3.0),
        ("fabricscope_nccl_ras_ranks", dict(EP, state="unresponsive"), float(unresponsive)),
        ("fabricscope_nccl_ras_ranks", dict(EP, state="dead"), 0.0),
        ("fabricscope_nccl_ras_async_error_ranks", dict(EP, kind="remote_error"), 0.0),
    ]
    if named:
        labels = dict(EP, rank="3", state=named, host="192.0.2.2", pid="5170", gpu="3")
        out.append(("fabricscope_nccl_ras_rank_info", labels, 1.0))
    return out


def test_rank_unresponsive_needs_the_counts_stopped_too() -> None:
    assert V.rank_unresponsive_expr(job(90, unresponsive=1, named="unresponsive"))
    assert V.rank_unresponsive_expr(job(90, named="dead"))
    # the recorded resume: RAS still says dead, the counts move
    assert not V.rank_unresponsive_expr(job(0, named="dead"))
    assert not V.rank_unresponsive_expr(job(90, named="lagging"))


def test_job_hung_needs_a_divergence() -> None:
    assert V.job_hung_expr(job(700, unresponsive=1), 600)
    assert V.job_hung_expr(job(700, mismatched=1), 600)
    assert not V.job_hung_expr(job(700), 600)  # a pause between epochs, a long collective
    assert not V.job_hung_expr(job(500, unresponsive=1), 600)


def test_the_recorded_answers_read_as_ras_says() -> None:
    records = [json.loads(x) for x in (ROOT / "tests/fixtures/ras/answers.jsonl").open()]
    by_tag = {r["tag"]: r for r in records}
    assert V.ras_view(by_tag["healthy-json-status"]) == dict.fromkeys(range(4), "responsive")
    assert V.ras_view(by_tag["stopped+3-json-verbose"])[3] == "unresponsive"
    assert V.ras_view(by_tag["stopped+80-json-verbose"])[3] == "dead"
    assert V.ras_view(by_tag["stopped+65-json-verbose"]) is None  # no answer
