"""The pci sampler on real sysfs trees, and faults injected through the SysfsReader seam:
one bad file costs one value (and records an issue), never the device or the pass."""

from __future__ import annotations

import dataclasses
import errno
import os
from pathlib import Path

import pytest

from agent.core.errors import NoData
from agent.core.sysfs import ReadIssue, SysfsReader
from agent.pci.sampler import AcsState, NumaNode, PciDevice, PciLink, PciSampler, PciSnapshot

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

GPU0 = "devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:19:00.0"
SW0_DOWN_GPU = "devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0"
GPU3 = "devices/pci0000:59/0000:59:01.0/0000:5a:00.0/0000:5b:01.0/0000:5d:00.0"
MLX5_4 = "devices/pci0000:48/0000:48:01.0/0000:49:00.0/0000:4a:02.0/0000:4d:00.0"


@pytest.fixture
def hwloc_qib_sys_root() -> Path:
    """Real hwloc snapshot: QLogic qib0 HCA under one root port, 4 NUMA nodes, old kernel."""
    return FIXTURES / "hwloc-40intel64" / "sys"


@pytest.fixture
def hwloc_mlx4_sys_root() -> Path:
    """Real hwloc snapshot: ConnectX-3 mlx4_0 on NUMA node 1, no link files at all."""
    return FIXTURES / "hwloc-32em64t" / "sys"


@pytest.fixture
def dgx_snapshot(dgx_sys_root: Path) -> PciSnapshot:
    return PciSampler(SysfsReader(dgx_sys_root)).sample()


class FaultyReader(SysfsReader):
    """A reader that fails or lies for chosen paths: an OSError raises, a str/bytes is the
    content read; every path under a ``vanished`` prefix behaves as gone mid-scan."""

    def __init__(
        self,
        root: Path,
        faults: dict[str, OSError | str | bytes] | None = None,
        vanished: tuple[str, ...] = (),
    ) -> None:
        super().__init__(root)
        self.faults = faults or {}
        self.vanished = vanished

    def _canonical(self, rel: str) -> str:
        """A path through a ``bus/pci/devices`` link, as the ``devices/`` path it reaches."""
        parts = rel.split("/")
        if len(parts) > 4 and parts[:3] == ["bus", "pci", "devices"]:
            target = os.readlink(self.root / "/".join(parts[:4]))
            return os.path.normpath(os.path.join("bus/pci/devices", target, *parts[4:]))
        return rel

    def _gone(self, rel: str) -> bool:
        rel = self._canonical(rel)
        return any(rel == p or rel.startswith(p + "/") for p in self.vanished)

    def _fault(self, rel: str) -> OSError | str | bytes | None:
        if self._gone(rel):
            return FileNotFoundError(errno.ENOENT, "No such file or directory")
        return self.faults.get(self._canonical(rel))

    def read_text(self, rel: str) -> str:
        f = self._fault(rel)
        if isinstance(f, OSError):
            raise f
        if f is not None:
            return f if isinstance(f, str) else f.decode()
        return super().read_text(rel)

    def read_bytes(self, rel: str) -> bytes:
        f = self._fault(rel)
        if isinstance(f, OSError):
            raise f
        if f is not None:
            return f if isinstance(f, bytes) else f.encode()
        return super().read_bytes(rel)

    def readlink(self, rel: str) -> str:
        f = self._fault(rel)
        if isinstance(f, OSError):
            raise f
        return super().readlink(rel)

    def listdir(self, rel: str) -> list[str]:
        f = self._fault(rel)
        if isinstance(f, OSError):
            raise f
        return super().listdir(rel)

    def exists(self, rel: str) -> bool:
        return not self._gone(rel) and super().exists(rel)

    def is_dir(self, rel: str) -> bool:
        return not self._gone(rel) and super().is_dir(rel)


def sample(
    root: Path,
    faults: dict[str, OSError | str | bytes] | None = None,
    vanished: tuple[str, ...] = (),
) -> PciSnapshot:
    return PciSampler(FaultyReader(root, faults, vanished)).sample()


def device(snap: PciSnapshot, address: str) -> PciDevice:
    d = snap.get(address)
    assert d is not None, address
    return d


# -- real trees -----------------------------------------------------------------------------


def test_hwloc_qib_tree(hwloc_qib_sys_root: Path) -> None:
    snap = PciSampler(SysfsReader(hwloc_qib_sys_root)).sample()
    all_cpus = tuple(range(40))
    assert snap.devices == (
        PciDevice(
            address="0000:40:03.0",
            role="bridge",
            sysfs_path="devices/pci0000:40/0000:40:03.0",
            host_bridge="pci0000:40",
            upstream=(),
            vendor=0x8086,
            device=0x340A,
            class_code=0x060400,
            numa_node=-1,
            cpus=all_cpus,
            link=PciLink(),
            driver="pcieport",
        ),
        PciDevice(
            address="0000:43:00.0",
            role="nic",
            sysfs_path="devices/pci0000:40/0000:40:03.0/0000:43:00.0",
            host_bridge="pci0000:40",
            upstream=("0000:40:03.0",),
            vendor=0x1077,
            device=0x7322,
            class_code=0x0C0600,
            numa_node=2,
            cpus=all_cpus,
            link=PciLink(speed_transfers_per_second=8_000_000_000, width=4),
            driver="ib_qib",
            rdma_devices=("qib0",),
            netdevs=("ib0",),
        ),
    )
    assert snap.numa_nodes == tuple(NumaNode(n, tuple(range(n, 40, 4))) for n in range(4))
    # the snapshot was taken unprivileged: 64-byte config, so ACS is unknown, not "off"
    assert snap.issues == (
        ReadIssue(
            "devices/pci0000:40/0000:40:03.0/config",
            "permission",
            "config space read returned 64 bytes; ACS lies in the extended space, readable "
            "only with CAP_SYS_ADMIN",
        ),
    )


def test_hwloc_mlx4_tree_without_link_files(hwloc_mlx4_sys_root: Path) -> None:
    snap = PciSampler(SysfsReader(hwloc_mlx4_sys_root)).sample()
    assert [(d.address, d.role) for d in snap.devices] == [
        ("0000:80:02.2", "bridge"),
        ("0000:82:00.0", "nic"),
    ]
    nic = device(snap, "0000:82:00.0")
    assert (nic.vendor, nic.device, nic.class_code) == (0x15B3, 0x1003, 0x028000)
    assert (nic.numa_node, nic.cpus, nic.driver) == (1, tuple(range(8, 16)), "mlx4_core")
    assert nic.rdma_devices == ("mlx4_0",)
    assert nic.link == PciLink()  # an old kernel has no link files: absent, not an issue
    assert [i.path for i in snap.issues] == ["devices/pci0000:80/0000:80:02.2/config"]
    assert snap.numa_nodes == (NumaNode(0, tuple(range(8))), NumaNode(1, tuple(range(8, 16))))


def test_dgx_tree_devices(dgx_snapshot: PciSnapshot) -> None:
    snap = dgx_snapshot
    assert snap.issues == ()
    gpus = [d.address for d in snap.by_role("gpu")]
    nics = [(d.address, d.rdma_devices) for d in snap.by_role("nic")]
    assert gpus == [f"0000:{b}:00.0" for b in ("19", "3b", "4c", "5d", "9b", "bb", "cb", "db")]
    assert [n[1] for n in nics] == [(f"mlx5_{i}",) for i in range(12)]
    assert len(snap.by_role("bridge")) == 34  # 8 x (root port, up, GPU down, NIC down) + 2
    # NVSwitches (NVIDIA "Bridge" class), their PMC switch and the NVMe drives are not ours
    for absent in ("0000:83:00.0", "0000:80:01.0", "0000:81:00.0", "0000:18:00.0"):
        assert snap.get(absent) is None
    assert snap.numa_nodes == (NumaNode(0, tuple(range(80))), NumaNode(1, tuple(range(80, 160))))

    assert device(snap, "0000:19:00.0") == PciDevice(
        address="0000:19:00.0",
        role="gpu",
        sysfs_path=GPU0,
        host_bridge="pci0000:15",
        upstream=("0000:15:01.0", "0000:16:00.0", "0000:17:01.0"),
        vendor=0x10DE,
        device=0x2330,
        class_code=0x030200,
        numa_node=0,
        cpus=tuple(range(80)),
        link=PciLink(32_000_000_000, 32_000_000_000, 16, 16),
        driver="nvidia",
    )
    cx6 = device(snap, "0000:1b:00.1")
    assert (cx6.device, cx6.driver, cx6.netdevs) == (0x101D, "mlx5_core", ("ens40f1np1",))
    assert cx6.link == PciLink(16_000_000_000, 16_000_000_000, 16, 16)
    assert device(snap, "0000:5e:00.0").numa_node == 1  # fault 1
    assert device(snap, "0000:5e:00.0").cpus == tuple(range(80, 160))

    root, up, down = (device(snap, a) for a in ("0000:15:01.0", "0000:16:00.0", "0000:17:01.0"))
    assert (root.port_type, root.acs, root.upstream) == ("root_port", AcsState(0x220, 0), ())
    assert (up.port_type, up.acs) == ("upstream_port", AcsState(None, 0))  # no ACS capability
    assert (down.port_type, down.acs) == ("downstream_port", AcsState(0x170, 0))
    assert down.sysfs_path == SW0_DOWN_GPU
    assert device(snap, "0000:b9:01.0").acs == AcsState(0x170, 0x001D)  # fault 3
    gen5 = 32_000_000_000
    assert device(snap, "0000:38:00.0").link == PciLink(gen5, gen5, 8, 16)  # fault 2


def test_no_pci_bus_is_no_data(tmp_path: Path) -> None:
    with pytest.raises(NoData):
        PciSampler(SysfsReader(tmp_path)).sample()


def test_empty_pci_bus_is_an_empty_snapshot(tmp_path: Path) -> None:
    (tmp_path / "bus/pci/devices").mkdir(parents=True)
    assert PciSampler(SysfsReader(tmp_path)).sample() == PciSnapshot()


# -- faults through the reader seam ---------------------------------------------------------


def replaced(snap: PciSnapshot, address: str, **changes: object) -> tuple[PciDevice, ...]:
    """``snap.devices`` with one device's fields changed."""
    return tuple(
        dataclasses.replace(d, **changes) if d.address == address else d  # type: ignore[arg-type]
        for d in snap.devices
    )


def test_garbage_link_speed_costs_that_value(dgx_sys_root: Path, dgx_snapshot: PciSnapshot) -> None:
    path = f"{GPU0}/current_link_speed"
    snap = sample(dgx_sys_root, faults={path: "fast\n"})
    gpu = device(dgx_snapshot, "0000:19:00.0")
    link = dataclasses.replace(gpu.link, speed_transfers_per_second=None)
    assert snap.devices == replaced(dgx_snapshot, "0000:19:00.0", link=link)
    assert snap.issues == (ReadIssue(path, "parse", "not a PCIe link speed: 'fast'"),)
    assert snap.numa_nodes == dgx_snapshot.numa_nodes


def test_eacces_on_config_makes_acs_unknown(dgx_sys_root: Path, dgx_snapshot: PciSnapshot) -> None:
    path = f"{SW0_DOWN_GPU}/config"
    snap = sample(dgx_sys_root, faults={path: PermissionError(errno.EACCES, "Permission denied")})
    assert snap.devices == replaced(dgx_snapshot, "0000:17:01.0", acs=None, port_type=None)
    assert snap.issues == (ReadIssue(path, "permission", "Permission denied"),)


def test_truncated_config_is_unknown_not_disabled(
    dgx_sys_root: Path, dgx_snapshot: PciSnapshot
) -> None:
    b9 = "devices/pci0000:b7/0000:b7:01.0/0000:b8:00.0/0000:b9:01.0"
    full = (dgx_sys_root / b9 / "config").read_bytes()
    snap = sample(dgx_sys_root, faults={f"{b9}/config": full[:64]})
    assert device(snap, "0000:b9:01.0").acs is None
    assert device(snap, "0000:b9:01.0").port_type is None  # the PCIe capability is at 0x68
    assert [(i.path, i.reason) for i in snap.issues] == [(f"{b9}/config", "permission")]


def test_eio_on_numa_node_costs_that_value(dgx_sys_root: Path, dgx_snapshot: PciSnapshot) -> None:
    path = f"{MLX5_4}/numa_node"
    snap = sample(dgx_sys_root, faults={path: OSError(errno.EIO, "Input/output error")})
    assert snap.devices == replaced(dgx_snapshot, "0000:4d:00.0", numa_node=None)
    assert snap.issues == (ReadIssue(path, "io", "Input/output error"),)


def test_device_vanished_mid_scan(dgx_sys_root: Path, dgx_snapshot: PciSnapshot) -> None:
    snap = sample(dgx_sys_root, vanished=(GPU3,))
    # the GPU and its switch downstream port (on no other path) leave the snapshot
    gone = ("0000:5d:00.0", "0000:5b:01.0")
    assert snap.devices == tuple(d for d in dgx_snapshot.devices if d.address not in gone)
    assert snap.issues == (
        ReadIssue("bus/pci/devices/0000:5d:00.0/vendor", "vanished", "No such file or directory"),
    )


def test_bridge_vanished_mid_scan_keeps_its_devices(
    dgx_sys_root: Path, dgx_snapshot: PciSnapshot
) -> None:
    gone = "devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:03.0"  # ConnectX-6 Dx port
    snap = sample(dgx_sys_root, vanished=(gone,))
    # its functions were listed before it went: they vanish too; the GPU and mlx5_0 stay
    assert snap.get("0000:1b:00.0") is None and snap.get("0000:1b:00.1") is None
    assert snap.get("0000:19:00.0") == dgx_snapshot.get("0000:19:00.0")
    assert snap.get("0000:1a:00.0") == dgx_snapshot.get("0000:1a:00.0")
    assert [(i.path, i.reason) for i in snap.issues] == [
        (f"bus/pci/devices/{a}/vendor", "vanished")
        for a in ("0000:17:03.0", "0000:1b:00.0", "0000:1b:00.1")
    ]


def test_unreadable_bridge_files_keep_the_path(
    dgx_sys_root: Path, dgx_snapshot: PciSnapshot
) -> None:
    eacces = PermissionError(errno.EACCES, "Permission denied")
    files = ("vendor", "device", "class", "numa_node", "local_cpulist", "config")
    snap = sample(dgx_sys_root, faults={f"{SW0_DOWN_GPU}/{f}": eacces for f in files})
    bridge = device(snap, "0000:17:01.0")
    assert (bridge.vendor, bridge.device, bridge.class_code, bridge.numa_node) == (None,) * 4
    assert (bridge.cpus, bridge.acs) == (None, None)
    assert bridge.link == device(dgx_snapshot, "0000:17:01.0").link
    assert snap.get("0000:19:00.0") == dgx_snapshot.get("0000:19:00.0")
    assert sorted(i.path.rsplit("/", 1)[1] for i in snap.issues) == sorted(files)


def test_broken_driver_link_and_unlistable_infiniband(
    dgx_sys_root: Path, dgx_snapshot: PciSnapshot
) -> None:
    eio = OSError(errno.EIO, "Input/output error")
    snap = sample(dgx_sys_root, faults={f"{MLX5_4}/driver": eio, f"{MLX5_4}/infiniband": eio})
    assert snap.devices == replaced(dgx_snapshot, "0000:4d:00.0", driver=None, rdma_devices=())
    assert [i.path for i in snap.issues] == [f"{MLX5_4}/driver", f"{MLX5_4}/infiniband"]


def test_garbage_numa_cpulist(dgx_sys_root: Path, dgx_snapshot: PciSnapshot) -> None:
    path = "devices/system/node/node1/cpulist"
    snap = sample(dgx_sys_root, faults={path: "eighty\n"})
    assert snap.numa_nodes == (dgx_snapshot.numa_nodes[0], NumaNode(1, None))
    assert snap.devices == dgx_snapshot.devices
    assert [(i.path, i.reason) for i in snap.issues] == [(path, "parse")]


def test_entry_resolving_outside_the_root(tmp_path: Path) -> None:
    """An absolute link (a snapshot taken with ``cp -a`` of /sys) leaves the root: skipped."""
    outside = tmp_path / "elsewhere" / "0000:01:00.0"
    outside.mkdir(parents=True)
    (outside / "vendor").write_text("0x10de\n")
    (outside / "class").write_text("0x030200\n")
    root = tmp_path / "sys"
    (root / "bus/pci/devices").mkdir(parents=True)
    (root / "bus/pci/devices/0000:01:00.0").symlink_to(outside)
    snap = PciSampler(SysfsReader(root)).sample()
    assert snap.devices == ()
    assert [(i.path, i.reason) for i in snap.issues] == [
        ("bus/pci/devices/0000:01:00.0", "vanished")
    ]
