"""bench/bench_sizing.py measures the NVML sampler's memory per GPU in a process of its own:
NVIDIA's library crashed the process that loaded it on a 2x H200 with NVLinks, and that
crash must not take the sizing run's other figures with it (docs/development.md). A crashed
measurement is started again, and every crash is reported with what it printed."""

from __future__ import annotations

import sys
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
    assert got["crashes"] == ["ended by signal 11"] * b.PER_GPU_ATTEMPTS
    assert got["error"] == (
        f"the per-GPU measurement failed {b.PER_GPU_ATTEMPTS} times, last ended by signal 11"
    )


def test_a_crash_then_a_measurement_keeps_the_figures_and_names_the_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first process aborts as a corrupted heap does (glibc's message, then SIGABRT under
    Python's fault handler); the second measures."""
    mark = tmp_path / "crashed-once"
    code = (
        "import os, sys, pathlib\n"
        f"m = pathlib.Path({str(mark)!r})\n"
        "if not m.exists():\n"
        "    m.touch()\n"
        "    print('free(): invalid pointer', file=sys.stderr, flush=True)\n"
        "    os.abort()\n"
        'print(\'{"gpus": 2.0, "bytes": 76684.0, "per_gpu_bytes": 38342.0}\')\n'
    )
    got = b.nvml_per_gpu_apart(True, argv=[sys.executable, "-X", "faulthandler", "-c", code])
    assert got["gpus"] == 2.0 and got["per_gpu_bytes"] == 38342.0
    assert "error" not in got
    (crash,) = got["crashes"]
    assert crash.startswith("ended by signal 6: free(): invalid pointer | Fatal Python error")
    assert 'File "<string>", line 6' in crash  # the call it died in
    assert "the per-GPU measurement ended by signal 6" in capsys.readouterr().err


def test_the_crash_line_is_one_printable_line_of_what_matters() -> None:
    assert b.crash_line("") == ""
    assert b.crash_line("a\n\nlast words\n") == "last words"
    noisy = "x\x1b[31m" * 200
    line = b.crash_line(noisy)
    assert "\x1b" not in line and len(line) == 300


def test_the_measurement_apart_gives_what_the_function_gives() -> None:
    apart = b.nvml_per_gpu_apart(False)
    assert set(apart) == {"gpus_2_bytes", "gpus_8_bytes", "per_gpu_bytes"}
    assert float(apart["gpus_8_bytes"]) > float(apart["gpus_2_bytes"]) > 0
