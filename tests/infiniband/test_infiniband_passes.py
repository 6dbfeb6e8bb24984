"""The InfiniBand sampler across passes: what a steady pass reads again and what it keeps.

The alerts over InfiniBand series rely on these (docs/alerts.md): FabricscopeInfinibandPortDown
and the flap alerts need each port's state of every pass, FabricscopeInfinibandPortRateDegraded
its rate, the error-rate alerts every counter of every pass; FabricscopeNicFirmwareMixed
(for: 1h) a firmware release, which changes only with a reset of the card, and a reset
bounces its links. A device's identity is kept between passes and read again when a link
state or the node GUID changes, and on the static refresh.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from agent.core.sysfs import SysfsReader
from agent.infiniband.records import IbDevice, InfinibandSnapshot
from agent.infiniband.sampler import InfinibandSampler

MLX5_4 = "class/infiniband/mlx5_4"


class CountingReader(SysfsReader):
    """Counts the files, links and paths it is asked about."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: collections.Counter[str] = collections.Counter()

    def read_bytes(self, rel: str) -> bytes:
        self.reads[rel] += 1
        return super().read_bytes(rel)

    def readlink(self, rel: str) -> str:
        self.reads[rel] += 1
        return super().readlink(rel)

    def realpath(self, rel: str) -> str:
        self.reads[rel] += 1
        return super().realpath(rel)


def device_named(snap: InfinibandSnapshot, name: str) -> IbDevice:
    return next(d for d in snap.devices if d.name == name)


def write(root: Path, rel: str, text: str) -> None:
    (root / rel).resolve().write_text(text + "\n")


def test_a_steady_pass_reads_every_port_and_counter_not_the_identity(dgx_sys_root: Path) -> None:
    reader = CountingReader(dgx_sys_root)
    sampler = InfinibandSampler(reader)
    first = sampler.sample()
    first_reads = set(reader.reads)
    reader.reads.clear()
    second = sampler.sample()
    assert second == first
    read = set(reader.reads)
    for name in ("fw_ver", "board_id", "hca_type", "node_type", "device", "device/driver"):
        assert f"{MLX5_4}/{name}" in first_reads
        assert f"{MLX5_4}/{name}" not in read  # the old sampler read each of them again
    assert f"{MLX5_4}/node_guid" in read
    port_files = {r for r in first_reads if r.startswith(f"{MLX5_4}/ports/")}
    assert port_files and port_files <= read  # state, rate, LIDs, netdev, every counter


def test_a_port_going_down_shows_on_the_next_pass_and_rereads_the_card(dgx_sys_copy: Path) -> None:
    sampler = InfinibandSampler(SysfsReader(dgx_sys_copy))
    before = device_named(sampler.sample(), "mlx5_4")
    assert before.ports[0].state is not None and before.ports[0].state.name == "ACTIVE"
    write(dgx_sys_copy, f"{MLX5_4}/ports/1/state", "1: DOWN")
    write(dgx_sys_copy, f"{MLX5_4}/fw_ver", "28.99.9999")  # a firmware reset bounces the links
    after = device_named(sampler.sample(), "mlx5_4")
    assert after.ports[0].state is not None and after.ports[0].state.name == "DOWN"
    assert after.fw_ver == "28.99.9999"


def test_identity_is_read_again_on_the_refresh(dgx_sys_copy: Path) -> None:
    sampler = InfinibandSampler(SysfsReader(dgx_sys_copy), static_refresh_passes=3)
    old = device_named(sampler.sample(), "mlx5_4").fw_ver
    write(dgx_sys_copy, f"{MLX5_4}/fw_ver", "28.99.9999")  # no link bounced: kept until the refresh
    got = [device_named(sampler.sample(), "mlx5_4").fw_ver for _ in range(3)]
    assert got == [old, old, "28.99.9999"]


def test_counters_move_on_every_pass(dgx_sys_copy: Path) -> None:
    sampler = InfinibandSampler(SysfsReader(dgx_sys_copy))
    sampler.sample()
    write(dgx_sys_copy, f"{MLX5_4}/ports/1/counters/symbol_error", "77")
    port = device_named(sampler.sample(), "mlx5_4").ports[0]
    assert {c.name: c.value for c in port.counters}["symbol_error"] == 77


def test_a_device_gone_on_a_steady_pass_is_left_out(dgx_sys_copy: Path) -> None:
    sampler = InfinibandSampler(SysfsReader(dgx_sys_copy))
    first = sampler.sample()
    (dgx_sys_copy / MLX5_4).unlink()
    snap = sampler.sample()
    assert [d.name for d in snap.devices] == [d.name for d in first.devices if d.name != "mlx5_4"]
    assert not snap.issues


def test_static_refresh_passes_must_be_positive(dgx_sys_root: Path) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        InfinibandSampler(SysfsReader(dgx_sys_root), static_refresh_passes=0)
