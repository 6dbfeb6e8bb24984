"""bench/nvml_fresh_passes.py: each run a fresh process, every way it ended counted per
variant and environment, and every crash kept with the line that says where it died."""

from __future__ import annotations

import sys
from pathlib import Path

from bench import nvml_fresh_passes as f


def test_each_run_is_a_fresh_process_and_each_crash_is_kept(tmp_path: Path) -> None:
    mark = tmp_path / "runs"
    code = (
        "import os, pathlib, sys\n"
        f"m = pathlib.Path({str(mark)!r})\n"
        "n = len(m.read_text()) if m.exists() else 0\n"
        "m.write_text('x' * (n + 1))\n"
        "if n % 2 and os.environ.get('BROKEN') == '1':\n"
        "    print('free(): invalid pointer', file=sys.stderr, flush=True)\n"
        "    os.abort()\n"
    )
    got = f.run(
        {"odd_runs_abort": [sys.executable, "-X", "faulthandler", "-c", code]},
        {"plain": {}, "broken": {"BROKEN": "1"}},
        runs=4,
    )
    assert got["ended"] == {
        "plain/odd_runs_abort": {"ok": 4},
        "broken/odd_runs_abort": {"ok": 2, "signal 6": 2},
    }
    crashes = got["crashes"]
    assert isinstance(crashes, list) and [c["run"] for c in crashes] == [1, 3]
    assert all(c["environment"] == "broken" for c in crashes)
    assert crashes[0]["line"].startswith("free(): invalid pointer | Fatal Python error: Abort")


def test_the_variants_are_python_that_compiles() -> None:
    for name, code in f.VARIANTS.items():
        compile(code, name, "exec")
