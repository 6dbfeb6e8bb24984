"""Builds the stand-in NVML library (``tests/nvml_standin/libnvidia-ml.c``) that the tests
load in place of NVIDIA's through ``LD_LIBRARY_PATH``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "nvml_standin" / "libnvidia-ml.c"


def build_standin(libdir: Path) -> Path:
    """Compile the stand-in into ``libdir/libnvidia-ml.so.1`` (warnings are errors);
    returns ``libdir``."""
    gcc = shutil.which("gcc")
    assert gcc, "gcc is needed to build the stand-in NVML library (scripts/test.sh installs it)"
    out = str(libdir / "libnvidia-ml.so.1")
    cmd = [gcc, "-Wall", "-Werror", "-shared", "-fPIC", "-o", out, str(SOURCE)]
    subprocess.run(cmd, check=True, timeout=120)
    return libdir


def run_against_standin(libdir: Path, code: str, **env: str) -> str:
    """Run ``code`` in a fresh Python at the repository root that loads the stand-in from
    ``libdir`` as NVIDIA's library (the loader reads ``LD_LIBRARY_PATH`` at start), with
    ``env`` added to this process's environment; its stdout (its stderr in the assertion
    when it fails)."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, LD_LIBRARY_PATH=str(libdir), **env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=SOURCE.parents[2],
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
