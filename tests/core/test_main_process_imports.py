"""What the agent's main process loads to start its children, hold their snapshots and
render them, checked in a fresh interpreter: never the log parsers or RE2 (the throughput
child's), nor the probe's machinery when the probe is off."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import agent.samplers
import agent.throughput.child
import agent.throughput.records
import exporter.metrics.catalog
import exporter.app
import exporter.cli.agent_run
PARSERS = ("re2", "agent.throughput.formats", "agent.throughput.sampler", "agent.probe.sampler")
heavy = [m for m in PARSERS if m in sys.modules]
assert not heavy, heavy
from agent.throughput.child import child_sampler  # the child's own import still works
assert "re2" not in sys.modules
"""


def test_the_main_process_loads_neither_the_parsers_nor_the_probe() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
