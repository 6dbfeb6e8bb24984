"""Builds the stand-in NVML library (``tests/nvml_standin/libnvidia-ml.c``) that the tests
load in place of NVIDIA's through ``LD_LIBRARY_PATH``."""

from __future__ import annotations

import shutil
import subprocess
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
