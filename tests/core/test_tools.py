"""The bounded tool runner (agent/core/tools.py) against real processes: a tool that hangs
is killed with everything it started, a flood of output is cut, a failure says why."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from agent.core.tools import ToolError, ToolTimeout, run_tool


def test_output_and_time() -> None:
    out = run_tool(["printf", "Lid:....7\\n"], timeout=5)
    assert out.stdout == "Lid:....7\n"
    assert 0 <= out.seconds < 5


def test_a_hanging_tool_is_killed_with_its_children(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = f"sleep 60 & echo $! > {pids}; echo $$ >> {pids}; wait"
    t0 = time.monotonic()
    with pytest.raises(ToolTimeout):
        run_tool(["sh", "-c", script], timeout=0.5)
    assert time.monotonic() - t0 < 3
    for pid in map(int, pids.read_text().split()):
        assert _dies(pid), f"process {pid} of the killed tool is still running"


def _dies(pid: int, within: float = 2.0) -> bool:
    """Gone, or a zombie waiting for its reaper, within ``within`` seconds (SIGKILL is
    delivered asynchronously)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        time.sleep(0.02)
    return False


def test_a_tool_that_closes_its_output_but_never_exits_is_killed() -> None:
    with pytest.raises(ToolTimeout):
        run_tool(["sh", "-c", "exec >/dev/null 2>&1; sleep 60"], timeout=0.5)


def test_a_flood_of_output_is_cut() -> None:
    t0 = time.monotonic()
    with pytest.raises(ToolError) as err:
        run_tool(["yes"], timeout=10, max_bytes=100_000)
    assert err.value.reason == "parse"
    assert time.monotonic() - t0 < 5


def test_a_failure_says_why_in_one_line() -> None:
    argv = [
        sys.executable,
        "-c",
        "import sys; print('ibwarn: cannot open UMAD port', file="
        "sys.stderr); print('detail', file=sys.stderr); sys.exit(255)",
    ]
    with pytest.raises(ToolError) as err:
        run_tool(argv, timeout=10)
    assert err.value.reason == "io"
    assert "cannot open UMAD port" in str(err.value) and "\n" not in str(err.value)


def test_a_missing_tool(tmp_path: Path) -> None:
    with pytest.raises(ToolError) as err:
        run_tool([str(tmp_path / "smpquery")], timeout=1)
    assert err.value.reason == "io"
    exe = tmp_path / "noexec"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o600)
    with pytest.raises(ToolError) as err:
        run_tool([str(exe)], timeout=1)
    assert err.value.reason == "permission"
