"""exporter/metrics/pci.py: the exact series rendered from PCI snapshots, linted by promtool."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.core.sysfs import SysfsReader
from agent.pci.sampler import AcsState, NumaNode, PciDevice, PciLink, PciSampler, PciSnapshot
from exporter.metrics import pci
from exporter.metrics.exposition import render_text
from exporter.metrics.spec import Families
from tests.promharness import promtool_check_metrics

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def series(snap: PciSnapshot) -> Series:
    out = Families()
    pci.render(snap, out)
    return {
        (spec.name, tuple(zip(spec.labels, labels, strict=True))): value
        for spec, samples in out.items()
        for labels, value in samples
    }


def named(s: Series, name: str) -> dict[tuple[str, ...], float]:
    return {tuple(v for _, v in labels): value for (n, labels), value in s.items() if n == name}


GEN4 = 16_000_000_000
SMALL = PciSnapshot(
    devices=(
        PciDevice(
            address="0000:00:01.0",
            role="bridge",
            sysfs_path="devices/pci0000:00/0000:00:01.0",
            host_bridge="pci0000:00",
            upstream=(),
            vendor=0x1022,
            device=0x14AB,
            class_code=0x060400,
            numa_node=0,
            link=PciLink(GEN4, GEN4, 16, 16),
            driver="pcieport",
            port_type="root_port",
            acs=AcsState(0x2A0, 0x001D),
        ),
        PciDevice(
            address="0000:01:00.0",
            role="gpu",
            sysfs_path="devices/pci0000:00/0000:00:01.0/0000:01:00.0",
            host_bridge="pci0000:00",
            upstream=("0000:00:01.0",),
            vendor=0x10DE,
            device=0x26B1,
            class_code=0x030000,
            numa_node=0,
            cpus=(0, 1, 2, 3),
            link=PciLink(2_500_000_000, GEN4, 16, 16),  # idle GPU: speed down, width full
            driver="nvidia",
        ),
        PciDevice(
            address="0000:21:00.0",
            role="nic",
            sysfs_path="devices/pci0000:20/0000:20:03.1/0000:21:00.0",
            host_bridge="pci0000:20",
            upstream=("0000:20:03.1",),
            vendor=0x15B3,
            device=0x1021,
            class_code=0x020000,
            numa_node=-1,
            link=PciLink(GEN4, None, 8, 16),
            rdma_devices=("mlx5_0",),
        ),
        PciDevice(
            address="0000:20:03.1",
            role="bridge",
            sysfs_path="devices/pci0000:20/0000:20:03.1",
            host_bridge="pci0000:20",
            upstream=(),
        ),
    ),
    numa_nodes=(NumaNode(0, (0, 1, 2, 3)), NumaNode(1, None)),
)


def test_render_small_snapshot_exactly() -> None:
    assert series(SMALL) == {
        (
            "fabricscope_pci_device_info",
            (
                ("pci_bus_id", "0000:00:01.0"),
                ("role", "bridge"),
                ("vendor", "0x1022"),
                ("model", "0x14ab"),
                ("driver", "pcieport"),
                ("parent_pci_bus_id", ""),
                ("numa_node", "0"),
                ("port_type", "root_port"),
            ),
        ): 1.0,
        (
            "fabricscope_pci_device_info",
            (
                ("pci_bus_id", "0000:01:00.0"),
                ("role", "gpu"),
                ("vendor", "0x10de"),
                ("model", "0x26b1"),
                ("driver", "nvidia"),
                ("parent_pci_bus_id", "0000:00:01.0"),
                ("numa_node", "0"),
                ("port_type", ""),
            ),
        ): 1.0,
        (
            "fabricscope_pci_device_info",
            (
                ("pci_bus_id", "0000:21:00.0"),
                ("role", "nic"),
                ("vendor", "0x15b3"),
                ("model", "0x1021"),
                ("driver", ""),
                ("parent_pci_bus_id", "0000:20:03.1"),
                ("numa_node", "-1"),
                ("port_type", ""),
            ),
        ): 1.0,
        (
            "fabricscope_pci_device_info",
            (
                ("pci_bus_id", "0000:20:03.1"),
                ("role", "bridge"),
                ("vendor", ""),
                ("model", ""),
                ("driver", ""),
                ("parent_pci_bus_id", ""),
                ("numa_node", ""),
                ("port_type", ""),
            ),
        ): 1.0,
        (
            "fabricscope_pci_link_speed_transfers_per_second",
            (("pci_bus_id", "0000:00:01.0"),),
        ): 16e9,
        (
            "fabricscope_pci_link_speed_transfers_per_second",
            (("pci_bus_id", "0000:01:00.0"),),
        ): 2.5e9,
        (
            "fabricscope_pci_link_speed_transfers_per_second",
            (("pci_bus_id", "0000:21:00.0"),),
        ): 16e9,
        (
            "fabricscope_pci_link_max_speed_transfers_per_second",
            (("pci_bus_id", "0000:00:01.0"),),
        ): 16e9,
        (
            "fabricscope_pci_link_max_speed_transfers_per_second",
            (("pci_bus_id", "0000:01:00.0"),),
        ): 16e9,
        ("fabricscope_pci_link_width", (("pci_bus_id", "0000:00:01.0"),)): 16.0,
        ("fabricscope_pci_link_width", (("pci_bus_id", "0000:01:00.0"),)): 16.0,
        ("fabricscope_pci_link_width", (("pci_bus_id", "0000:21:00.0"),)): 8.0,
        ("fabricscope_pci_link_max_width", (("pci_bus_id", "0000:00:01.0"),)): 16.0,
        ("fabricscope_pci_link_max_width", (("pci_bus_id", "0000:01:00.0"),)): 16.0,
        ("fabricscope_pci_link_max_width", (("pci_bus_id", "0000:21:00.0"),)): 16.0,
        # the root port redirects P2P: exported, though no finding is raised for root ports
        ("fabricscope_pci_acs_p2p_redirect_enabled", (("pci_bus_id", "0000:00:01.0"),)): 1.0,
        ("fabricscope_pci_link_width_degraded", (("pci_bus_id", "0000:01:00.0"),)): 0.0,
        ("fabricscope_pci_link_width_degraded", (("pci_bus_id", "0000:21:00.0"),)): 1.0,
        ("fabricscope_pci_link_reported", (("pci_bus_id", "0000:01:00.0"),)): 1.0,
        ("fabricscope_pci_link_reported", (("pci_bus_id", "0000:21:00.0"),)): 1.0,
        # ACS per bridge on a path: the root port's register, and a bridge never read
        ("fabricscope_pci_acs_info", (("pci_bus_id", "0000:00:01.0"), ("state", "redirect"))): 1.0,
        (
            "fabricscope_pci_acs_info",
            (("pci_bus_id", "0000:20:03.1"), ("state", "unreadable")),
        ): 1.0,
        ("fabricscope_numa_node_info", (("numa_node", "0"), ("cpus", "0-3"))): 1.0,
        ("fabricscope_numa_node_info", (("numa_node", "1"), ("cpus", ""))): 1.0,
        (
            "fabricscope_topology_gpu_nic_path_info",
            (("pci_bus_id", "0000:01:00.0"), ("device", "mlx5_0"), ("path_type", "SYS")),
        ): 1.0,
        (
            "fabricscope_topology_gpu_nic_path_rank",
            (("pci_bus_id", "0000:01:00.0"), ("device", "mlx5_0")),
        ): 5.0,
        ("fabricscope_topology_gpu_nearest_nic_path_rank", (("pci_bus_id", "0000:01:00.0"),)): 5.0,
        # the NIC's NUMA node is -1 (unknown): cross-NUMA cannot be told, the series is absent
    }


@pytest.fixture
def dgx_series(dgx_sys_root: Path) -> Series:
    return series(PciSampler(SysfsReader(dgx_sys_root)).sample())


def test_render_dgx(dgx_series: Series) -> None:
    s = dgx_series
    info = named(s, "fabricscope_pci_device_info")
    assert len(info) == 54
    gpu = ("0000:19:00.0", "gpu", "0x10de", "0x2330", "nvidia", "0000:17:01.0", "0", "")
    assert gpu in info
    nic = ("0000:5e:00.0", "nic", "0x15b3", "0x1021", "mlx5_core", "0000:5b:02.0", "1", "")
    assert nic in info
    assert ("0000:15:01.0", "bridge", "0x8086", "0x352a", "pcieport", "", "0", "root_port") in info
    acs = named(s, "fabricscope_pci_acs_p2p_redirect_enabled")
    assert len(acs) == 34  # every bridge: root privileges read the whole config space
    assert {k for k, v in acs.items() if v == 1} == {("0000:b9:01.0",), ("0000:b9:02.0",)}
    assert acs["0000:16:00.0",] == 0  # no ACS capability on switch upstream ports
    degraded = named(s, "fabricscope_pci_link_width_degraded")
    assert {k for k, v in degraded.items() if v == 1} == {("0000:38:00.0",)}
    assert ("0000:37:01.0",) not in degraded  # the root port's link is judged at 38:00.0
    assert len(degraded) == 8 + 12 + 8  # GPUs, NICs, switch upstream ports
    assert named(s, "fabricscope_pci_link_width")["0000:38:00.0",] == 8
    assert named(s, "fabricscope_pci_link_max_speed_transfers_per_second")["0000:19:00.0",] == 32e9
    assert named(s, "fabricscope_numa_node_info") == {("0", "0-79"): 1, ("1", "80-159"): 1}
    paths = named(s, "fabricscope_topology_gpu_nic_path_info")
    assert len(paths) == 8 * 12
    assert ("0000:bb:00.0", "mlx5_9", "PIX") in paths
    assert ("0000:bb:00.0", "mlx5_0", "SYS") in paths
    ranks = named(s, "fabricscope_topology_gpu_nic_path_rank")
    assert ranks["0000:19:00.0", "mlx5_3"] == 4
    cross = named(s, "fabricscope_topology_gpu_nearest_nic_cross_numa")
    assert {k for k, v in cross.items() if v == 1} == {("0000:5d:00.0",)}
    assert len(cross) == 8
    assert set(named(s, "fabricscope_topology_gpu_nearest_nic_path_rank").values()) == {1}


def test_unknown_acs_is_absent_not_zero() -> None:
    snap = PciSampler(SysfsReader(FIXTURES / "hwloc-40intel64" / "sys")).sample()
    s = series(snap)
    assert named(s, "fabricscope_pci_acs_p2p_redirect_enabled") == {}
    assert named(s, "fabricscope_pci_link_speed_transfers_per_second") == {("0000:43:00.0",): 8e9}
    assert named(s, "fabricscope_pci_link_max_speed_transfers_per_second") == {}
    assert named(s, "fabricscope_topology_gpu_nic_path_info") == {}  # no GPUs on this host


def test_dgx_exposition_passes_promtool(dgx_sys_root: Path, tmp_path: Path) -> None:
    out = Families()
    pci.render(PciSampler(SysfsReader(dgx_sys_root)).sample(), out)
    text = render_text(out)
    promtool_check_metrics(text)
    assert text.count(b"# TYPE ") == len(pci.SPECS)
