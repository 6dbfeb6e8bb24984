"""Runs the real ``fabricscope`` command in a subprocess, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

TIMEOUT = 120


def fabricscope(args: Sequence[str], timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", "exporter.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
