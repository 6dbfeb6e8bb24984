"""Runs the real ``fabricscope`` command in a subprocess, as a user would."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from agent.config import DEFAULT_OFF, SAMPLER_NAMES

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


#: series whose values differ run to run; their values are masked in the golden file
DYNAMIC = re.compile(
    r"^(fabricscope_sampler_duration_seconds|fabricscope_sampler_last_success_timestamp_seconds"
    r"|fabricscope_sampler_cpu_seconds_total"
    r"|fabricscope_build_info|fabricscope_infiniband_port_pma_saturated_since_timestamp_seconds"
    r"|process_resident_memory_bytes|process_cpu_seconds_total|process_open_fds"
    r"|process_start_time_seconds)\{"
)


def throughput_once(
    files: Sequence[str], tmp_path: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    """``fabricscope agent --once`` with only the throughput sampler on: each of ``files`` is
    a ``--throughput.file`` value (``PATH[=JOB]``), no pod logs, errors only on stderr."""
    return fabricscope(
        [
            "agent",
            "--once",
            *(f"--throughput.file={f}" for f in files),
            f"--path.pod-logs={tmp_path / 'no-pods'}",
            *(
                f"--no-sampler.{n}"
                for n in SAMPLER_NAMES
                if n != "throughput" and n not in DEFAULT_OFF
            ),
            "--log.level=error",
            *extra,
        ],
        timeout=60,
    )


def normalise(text: str) -> str:
    out = []
    for raw in text.splitlines():
        line = raw
        if DYNAMIC.match(raw):
            line = raw.rsplit(" ", 1)[0] + " <dynamic>"
            line = re.sub(r'python_version="[^"]*"', 'python_version="<dynamic>"', line)
        out.append(line)
    return "\n".join(out) + "\n"
