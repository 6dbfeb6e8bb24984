"""bench/bench_sizing.py measures the NVML sampler's memory per GPU in a process of its own:
NVIDIA's library crashed the process that loaded it on a 2x H200 with NVLinks, and that
crash must not take the sizing run's other figures with it (docs/development.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import bench_sizing as b


def test_a_crash_of_the_measurement_is_a_figure_of_zero_gpus_and_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    crashing = tmp_path / "python"
    crashing.write_text("#!/bin/sh\nkill -SEGV $$\n")
    crashing.chmod(0o755)
    monkeypatch.setattr(b.sys, "executable", str(crashing))
    got = b.nvml_per_gpu_apart(True)
    assert got["gpus"] == 0.0
    assert got["error"] == "the per-GPU measurement ended by signal 11"


def test_the_measurement_apart_gives_what_the_function_gives() -> None:
    apart = b.nvml_per_gpu_apart(False)
    assert set(apart) == {"gpus_2_bytes", "gpus_8_bytes", "per_gpu_bytes"}
    assert float(apart["gpus_8_bytes"]) > float(apart["gpus_2_bytes"]) > 0
