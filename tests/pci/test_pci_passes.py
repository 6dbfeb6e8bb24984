"""The pci sampler across passes: what a steady pass reads again and what it keeps.

The alerts over PCI series rely on these (docs/alerts.md): FabricscopePcieLinkWidthDegraded
and FabricscopePcieLinkSpeedDegraded need the current width and speed of every pass (their
``for: 15m`` starts when a pass shows the drop), the ACS alerts a bridge's config space of
every pass, the topology joins a GPU or NIC that appears, leaves or gets its RDMA driver on
the next pass. What cannot change while a function sits at its address is kept, and read
again on the static refresh.
"""

from __future__ import annotations

import collections
import errno
from pathlib import Path

import pytest

from agent.core.sysfs import ReadIssue, SysfsReader
from agent.pci.sampler import PciSampler
from tests.pci.test_pci_reader import GPU0, GPU3, SW0_DOWN_GPU, FaultyReader, device

NVME = "0000:18:00.0"  # a Micron NVMe drive on the DGX tree: none of the sampler's business


class CountingReader(FaultyReader):
    """A FaultyReader that counts the files it reads, by path."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: collections.Counter[str] = collections.Counter()

    def read_bytes(self, rel: str) -> bytes:
        self.reads[rel] += 1
        return super().read_bytes(rel)

    def read_text(self, rel: str) -> str:
        self.reads[rel] += 1
        return super().read_text(rel)


def test_a_steady_pass_reads_what_can_change_and_returns_the_same(dgx_sys_root: Path) -> None:
    reader = CountingReader(dgx_sys_root)
    sampler = PciSampler(reader)
    first = sampler.sample()
    first_reads = sum(reader.reads.values())
    reader.reads.clear()
    second = sampler.sample()
    assert second == first
    read = set(reader.reads)
    # the old sampler read every file again: 561 on this tree
    assert sum(reader.reads.values()) < first_reads / 2, (first_reads, len(read))
    for dev in first.devices:
        assert f"{dev.sysfs_path}/current_link_speed" in read, dev.address
        assert f"{dev.sysfs_path}/current_link_width" in read, dev.address
        assert (f"{dev.sysfs_path}/config" in read) == (dev.role == "bridge"), dev.address
        assert f"{dev.sysfs_path}/numa_node" not in read, dev.address
        assert f"{dev.sysfs_path}/max_link_width" not in read, dev.address
    assert f"bus/pci/devices/{NVME}/vendor" not in read  # none of ours: classified once


def test_a_link_that_drops_width_or_speed_shows_on_the_next_pass(dgx_sys_copy: Path) -> None:
    sampler = PciSampler(SysfsReader(dgx_sys_copy))
    before = device(sampler.sample(), "0000:19:00.0")
    assert (before.link.width, before.link.speed_transfers_per_second) == (16, 32_000_000_000)
    (dgx_sys_copy / GPU0 / "current_link_width").write_text("8\n")
    (dgx_sys_copy / GPU0 / "current_link_speed").write_text("16.0 GT/s PCIe\n")
    (dgx_sys_copy / SW0_DOWN_GPU / "current_link_width").write_text("8\n")
    snap = sampler.sample()
    gpu, bridge = device(snap, "0000:19:00.0"), device(snap, "0000:17:01.0")
    assert (gpu.link.width, gpu.link.speed_transfers_per_second) == (8, 16_000_000_000)
    assert gpu.link.max_width == 16  # kept, as read on the first pass
    assert bridge.link.width == 8


def test_a_function_gone_mid_scan_is_left_out_on_a_steady_pass(dgx_sys_root: Path) -> None:
    reader = FaultyReader(dgx_sys_root)
    sampler = PciSampler(reader)
    first = sampler.sample()
    reader.vanished = (GPU3,)
    snap = sampler.sample()
    gone = ("0000:5d:00.0", "0000:5b:01.0")  # the GPU and the switch port only it hangs off
    assert snap.devices == tuple(d for d in first.devices if d.address not in gone)
    assert snap.issues == (
        ReadIssue("bus/pci/devices/0000:5d:00.0/vendor", "vanished", "No such file or directory"),
    )
    reader.vanished = ()
    assert sampler.sample() == first  # back: read whole again


def test_a_function_removed_from_the_bus_leaves_on_the_next_pass(dgx_sys_copy: Path) -> None:
    sampler = PciSampler(SysfsReader(dgx_sys_copy))
    assert device(sampler.sample(), "0000:19:00.0").role == "gpu"
    (dgx_sys_copy / "bus/pci/devices/0000:19:00.0").unlink()
    assert sampler.sample().get("0000:19:00.0") is None


def test_an_rdma_driver_bound_after_the_first_pass_shows_on_the_next(dgx_sys_copy: Path) -> None:
    sampler = PciSampler(SysfsReader(dgx_sys_copy))
    assert sampler.sample().get(NVME) is None
    (dgx_sys_copy / f"bus/pci/devices/{NVME}/infiniband/irdma0").mkdir(parents=True)
    nic = device(sampler.sample(), NVME)
    assert (nic.role, nic.rdma_devices) == ("nic", ("irdma0",))


def test_static_facts_are_read_again_on_the_refresh(dgx_sys_copy: Path) -> None:
    sampler = PciSampler(SysfsReader(dgx_sys_copy), static_refresh_passes=3)
    assert device(sampler.sample(), "0000:19:00.0").numa_node == 0
    (dgx_sys_copy / GPU0 / "numa_node").write_text("1\n")
    assert [device(sampler.sample(), "0000:19:00.0").numa_node for _ in range(3)] == [0, 0, 1]


def test_a_fact_that_failed_is_read_again_on_the_next_pass(dgx_sys_root: Path) -> None:
    path = f"{GPU0}/numa_node"
    reader = FaultyReader(dgx_sys_root, {path: OSError(errno.EIO, "Input/output error")})
    sampler = PciSampler(reader)
    for _ in range(2):  # not kept as absent: each pass tries, and says so
        snap = sampler.sample()
        assert device(snap, "0000:19:00.0").numa_node is None
        assert snap.issues == (ReadIssue(path, "io", "Input/output error"),)
    reader.faults = {}
    assert device(sampler.sample(), "0000:19:00.0").numa_node == 0
    assert not sampler.sample().issues


def test_static_refresh_passes_must_be_positive(dgx_sys_root: Path) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        PciSampler(SysfsReader(dgx_sys_root), static_refresh_passes=0)
