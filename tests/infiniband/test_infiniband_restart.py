"""What the PMA step keeps across an agent restart (agent/infiniband/memory.py): with
--infiniband.reset-saturated the exported counter is "cleared + hardware"; a restarted agent
must carry on from there, never drop back to the hardware value (a counter reset to
Prometheus: errors that never happened). The PMA is tests/infiniband/pma_standin.py over a
fixture tree, so a clear really zeroes the tree's counter and the true count is known.
Hostile state files (huge, malformed, a symlink, a FIFO, unwritable) cost one warning and a
read issue, never a crash or a lost scrape."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from agent.core.sysfs import SysfsReader
from agent.infiniband.memory import MAX_BYTES, StateFile, decode
from agent.infiniband.pma import PmaReader
from agent.infiniband.records import InfinibandSnapshot
from agent.infiniband.sampler import InfinibandSampler
from tests.infiniband import pma_standin
from tests.infiniband.test_infiniband_pma import port_tree

STANDIN = Path(pma_standin.__file__)
DEV = "mlx5_0"


def agent(root: Path, state: Path | None, *, reset: bool = True) -> InfinibandSampler:
    """A fresh agent's infiniband sampler (a restart is a new one on the same files)."""
    pma = PmaReader(
        SysfsReader(root),
        mode="on",
        reset=reset,
        prefix=(sys.executable, str(STANDIN), str(root)),
        tool_timeout=20.0,
        pass_budget=40.0,
        state_file=str(state) if state else None,
    )
    return InfinibandSampler(SysfsReader(root), pma=pma)


def value(snap: InfinibandSnapshot, name: str) -> int:
    (c,) = [
        c
        for d in snap.devices
        for p in d.ports
        for c in p.counters
        if c.source == "counters" and c.name == name
    ]
    return c.value


def resets(snap: InfinibandSnapshot) -> int | None:
    src = snap.devices[0].ports[0].counter_source
    return src.resets_total if src else None


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return port_tree(
        tmp_path / "sys",
        DEV,
        {"symbol_error": 65535, "port_rcv_errors": 60000, "link_downed": 3, "port_xmit_data": 9},
    )


def test_a_restart_carries_on_from_cleared_plus_hardware(root: Path, tmp_path: Path) -> None:
    """Cleared at the first pass, 40 errors more, a restart: 65575, not 40 (before the state
    file, a restart exported 40: a counter reset to Prometheus, 40 errors counted twice)."""
    state = tmp_path / "state.json"
    first = agent(root, state)
    assert value(first.sample(), "symbol_error") == 65535  # held at its maximum, cleared
    pma_standin.add(root, DEV, 1, "symbol_error", 40)
    assert value(first.sample(), "symbol_error") == 65575
    restarted = agent(root, state)
    snap = restarted.sample()
    assert value(snap, "symbol_error") == 65575
    assert value(snap, "port_rcv_errors") == 60000
    assert resets(snap) == 1  # pma_resets_total carries on too
    assert not snap.issues
    pma_standin.add(root, DEV, 1, "symbol_error", 2)
    assert value(restarted.sample(), "symbol_error") == 65577


def test_a_clear_by_another_tool_or_a_reboot_while_the_agent_is_down_is_added(
    root: Path, tmp_path: Path
) -> None:
    """perfquery -R (or the HCA reset of a reboot) while no agent runs: the counter is found
    below its last exported value, which is added: the exported counter never goes down."""
    state = tmp_path / "state.json"
    first = agent(root, state)
    first.sample()
    pma_standin.add(root, DEV, 1, "symbol_error", 30)
    assert value(first.sample(), "symbol_error") == 65565
    pma_standin.write(pma_standin.counters_dir(root, DEV, 1) / "symbol_error", 0)
    pma_standin.add(root, DEV, 1, "symbol_error", 5)
    assert value(agent(root, state).sample(), "symbol_error") == 65570  # 30 lost to the clear


def test_a_crash_between_a_clear_and_the_write_counts_nothing_twice_or_backwards(
    root: Path, tmp_path: Path
) -> None:
    """The file still says the value before the clear (``last`` 50000, nothing cleared):
    the counter, now 0, is found below it, so 50000 is added: the export carries on from
    50000, as the last pass exported."""
    state = tmp_path / "state.json"
    pma_standin.write(pma_standin.counters_dir(root, DEV, 1) / "port_rcv_errors", 0)
    state.write_text(
        json.dumps({"version": 1, "ports": {f"{DEV}/1": {"last": {"port_rcv_errors": 50000}}}})
    )
    assert value(agent(root, state).sample(), "port_rcv_errors") == 50000


def test_a_64bit_counter_is_not_handed_back_to_its_sysfs_twin_after_a_restart(
    root: Path, tmp_path: Path
) -> None:
    """A counter a 64-bit read supplied before the restart stays absent while the new run's
    64-bit read fails, never its stuck 32-bit twin (a drop Prometheus reads as a reset)."""
    state = tmp_path / "state.json"
    state.write_text(
        json.dumps({"version": 1, "ports": {f"{DEV}/1": {"extended": ["port_xmit_data"]}}})
    )
    failing = PmaReader(
        SysfsReader(root), mode="on", prefix=("false",), state_file=str(state), tool_timeout=5
    )
    snap = InfinibandSampler(SysfsReader(root), pma=failing).sample()
    names = {c.name for c in snap.devices[0].ports[0].counters if c.source == "counters"}
    assert "port_xmit_data" not in names and "symbol_error" in names


def test_no_pma_port_no_file(tmp_path: Path) -> None:
    """An agent with nothing to keep (no InfiniBand port, or nothing cleared) never writes."""
    root = port_tree(tmp_path / "sys", DEV, {"symbol_error": 3})
    (root / "class/infiniband" / DEV / "ports/1/link_layer").write_text("Ethernet\n")
    state = tmp_path / "state.json"
    snap = agent(root, state).sample()
    assert not state.exists() and not snap.issues


def test_without_reset_mode_the_kept_counts_are_kept_but_not_applied(
    root: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state.json"
    first = agent(root, state)
    first.sample()
    kept = state.read_text()
    snap = agent(root, state, reset=False).sample()
    assert value(snap, "symbol_error") == 0  # the hardware value: reset mode is off
    assert decode(state.read_text())[(DEV, 1)].cleared == decode(kept)[(DEV, 1)].cleared


def _hostile(tmp_path: Path, kind: str) -> Path:
    state = tmp_path / "state.json"
    if kind == "huge":
        state.write_text('{"version": 1, "ports": {}, "pad": "' + "x" * MAX_BYTES + '"}')
    elif kind == "garbage":
        state.write_bytes(b"\x00\xff not json")
    elif kind == "deep":
        state.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "negative":
        state.write_text('{"version": 1, "ports": {"mlx5_0/1": {"cleared": {"x": -5}}}}')
    elif kind == "float":
        state.write_text('{"version": 1, "ports": {"mlx5_0/1": {"cleared": {"x": 1e300}}}}')
    elif kind == "badkey":
        state.write_text('{"version": 1, "ports": {"../../etc/1": {}}}')
    elif kind == "toomany":
        ports = {f"d{i}/1": {} for i in range(2000)}
        state.write_text(json.dumps({"version": 1, "ports": ports}))
    elif kind == "symlink":
        (tmp_path / "elsewhere.json").write_text('{"version": 1, "ports": {}}')
        state.symlink_to(tmp_path / "elsewhere.json")
    elif kind == "fifo":
        os.mkfifo(state)
    elif kind == "directory":
        state.mkdir()
    return state


@pytest.mark.parametrize(
    "kind",
    [
        "huge",
        "garbage",
        "deep",
        "negative",
        "float",
        "badkey",
        "toomany",
        "symlink",
        "fifo",
        "directory",
    ],
)
def test_a_hostile_state_file_costs_one_warning_never_the_counters(
    root: Path, tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    state = _hostile(tmp_path, kind)
    snap = agent(root, state).sample()
    assert value(snap, "symbol_error") == 65535  # from the hardware, as on a first start
    assert any(i.path == str(state) for i in snap.issues)
    warned = [r for r in caplog.records if "state file" in r.getMessage()]
    assert warned and all(r.levelname == "WARNING" for r in warned)
    assert all(len(r.getMessage()) < 400 for r in warned)  # one line, no dump of the file


def test_an_unwritable_state_file_is_said_and_the_counters_still_exported(
    root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "missing-dir" / "state.json"
    s = agent(root, state)
    snap = s.sample()
    assert value(snap, "symbol_error") == 65535
    (issue,) = [i for i in snap.issues if i.path == str(state)]
    assert issue.reason == "io" and "cannot write" in issue.detail
    s.sample()
    warned = [r for r in caplog.records if "cannot write" in r.getMessage()]
    assert len(warned) == 1  # said once, not every pass


def test_the_file_is_replaced_whole(root: Path, tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    s = agent(root, state)
    s.sample()
    assert not Path(f"{state}.tmp").exists()
    assert decode(state.read_text())[(DEV, 1)].cleared == {
        "port_rcv_errors": 60000,
        "symbol_error": 65535,
    }
    assert oct(state.stat().st_mode & 0o777) == "0o600"
    assert StateFile(str(state)).load()[1] == ""
