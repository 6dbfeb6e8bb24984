"""The agent's main process never loads the log parsers or RE2: the throughput child does.
What the main process imports to start the child, hold its snapshots and render them is
checked in a fresh interpreter."""

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
PARSERS = ("re2", "agent.throughput.formats", "agent.throughput.sampler")
heavy = [m for m in PARSERS if m in sys.modules]
assert not heavy, heavy
from agent.throughput.child import child_sampler  # the child's own import still works
assert "re2" not in sys.modules
"""


def test_the_main_process_does_not_load_the_parsers() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
