"""A real agent asking RAS stand-ins (tests/ras_standin.py) only, for the RAS attack tests:
its command line and the series it exports per job."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from agent.config import DEFAULT_OFF, SAMPLER_NAMES
from tests.promharness import free_port

ROOT = Path(__file__).resolve().parents[2]
#: every sampler but the RAS one off
OTHERS = [f"--no-sampler.{n}" for n in SAMPLER_NAMES if n != "ras" and n not in DEFAULT_OFF]


def start_ras_agent(
    tmp_path: Path, endpoints: Mapping[str, int], max_answer_bytes: int, *extra: str
) -> tuple[subprocess.Popen[bytes], int, Path]:
    """A real agent asking the RAS ports ``endpoints`` (job name -> port on 127.0.0.1)
    every 2 s; (process, metrics port, log file)."""
    port = free_port()
    log = tmp_path / "agent.log"
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "exporter.cli", "agent", *OTHERS),
                *(f"--path.procfs={tmp_path}", f"--web.listen-address=127.0.0.1:{port}"),
                *(f"--ras.endpoint=127.0.0.1:{p}={name}" for name, p in endpoints.items()),
                *("--ras.interval=2s", "--ras.timeout=1500ms", "--ras.gather-timeout=1"),
                f"--ras.max-answer-bytes={max_answer_bytes}",
                *extra,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**env, "PYTHONUNBUFFERED": "1"},
            cwd=ROOT,
        )
    return proc, port, log


def value(body: str, name: str, job: str, **labels: str) -> float | None:
    """The value of series ``name`` of job ``job`` with ``labels``; None when absent."""
    for line in body.splitlines():
        if not line.startswith(name + "{") or f'job_name="{job}"' not in line:
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None
