"""The infiniband sampler on real fixture trees, on kernel-layout trees built here, and under
faults injected through the SysfsReader seam; and its rendering into metric families."""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.core.errors import NoData
from agent.core.findings import Finding
from agent.core.sysfs import ReadIssue, SysfsReader
from agent.infiniband.findings import findings
from agent.infiniband.records import IbPort, InfinibandSnapshot, PortCounter, PortState
from agent.infiniband.sampler import InfinibandSampler
from exporter.metrics import infiniband as ib_metrics
from exporter.metrics import infiniband_counters
from exporter.metrics.exposition import render_text
from exporter.metrics.spec import Families
from tests.promharness import promtool_check_metrics

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
P = "fabricscope_infiniband_port_"

Series = dict[tuple[str, tuple[str, ...]], float]


# -- fixtures and helpers --------------------------------------------------------------


@pytest.fixture
def node_exporter_sys_root() -> Path:
    """node_exporter's sys.ttar: i40iw0 (all counters N/A) and mlx4_0 with counters_ext."""
    return FIXTURES / "node_exporter" / "sys"


@pytest.fixture
def node_exporter_golden() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """node_exporter's own e2e output for the tree above: its node_infiniband_* samples."""
    out = {}
    line_re = re.compile(r"^(\w+)\{(.*)\} (\S+)$")
    for line in (FIXTURES / "node_exporter" / "e2e-output.infiniband.txt").read_text().splitlines():
        m = line_re.match(line)
        if m is None:
            continue
        labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', m.group(2))))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


@pytest.fixture
def gpud_cx7_sys_root() -> Path:
    """Counters of a real H100 node's ConnectX-7 with four saturated PMA counters."""
    return FIXTURES / "gpud-pr943-cx7" / "sys"


@pytest.fixture
def issue966_sys_root() -> Path:
    """A real i40iw reached through its class symlink, every counter `N/A (no PMA)`."""
    return FIXTURES / "ne-issue966-i40iw" / "sys"


def sample(root: Path | SysfsReader) -> InfinibandSnapshot:
    reader = root if isinstance(root, SysfsReader) else SysfsReader(root)
    return InfinibandSampler(reader).sample()


def series(snap: InfinibandSnapshot) -> Series:
    out = Families()
    ib_metrics.render(snap, out)
    return {
        (spec.name, labels): value for spec, samples in out.items() for labels, value in samples
    }


def port_of(snap: InfinibandSnapshot, device: str, number: int) -> IbPort:
    (dev,) = [d for d in snap.devices if d.name == device]
    (port,) = [p for p in dev.ports if p.port == number]
    return port


def counter_of(port: IbPort, source: str, name: str) -> PortCounter:
    (c,) = [c for c in port.counters if (c.source, c.name) == (source, name)]
    return c


class FaultyReader(SysfsReader):
    """A reader that fails or lies for chosen paths, like a real host on a bad day."""

    def __init__(
        self,
        root: Path,
        *,
        read_errors: dict[str, int] | None = None,
        texts: dict[str, str] | None = None,
        list_errors: dict[str, int] | None = None,
        after_listdir: dict[str, Callable[[], None]] | None = None,
    ) -> None:
        super().__init__(root)
        self.read_errors = read_errors or {}
        self.texts = texts or {}
        self.list_errors = list_errors or {}
        self.after_listdir = after_listdir or {}

    def read_text(self, rel: str) -> str:
        if rel in self.read_errors:
            code = self.read_errors[rel]
            raise OSError(code, os.strerror(code), rel)
        if rel in self.texts:
            return self.texts[rel]
        return super().read_text(rel)

    def _listed(self, rel: str, entries: Callable[[str], list[str]]) -> list[str]:
        if rel in self.list_errors:
            code = self.list_errors[rel]
            raise OSError(code, os.strerror(code), rel)
        names = entries(rel)
        hook = self.after_listdir.get(rel)
        if hook is not None:
            hook()
        return names

    def listdir(self, rel: str) -> list[str]:
        return self._listed(rel, super().listdir)

    def listdir_files(self, rel: str) -> list[str]:
        return self._listed(rel, super().listdir_files)


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def link(root: Path, rel: str, target: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, path)


ROCE_PCI = "devices/pci0000:00/0000:00:01.0/0000:19:00.0"
IB_PCI = "devices/pci0000:80/0000:80:02.2/0000:82:00.0"


@pytest.fixture
def roce_sys_root(tmp_path: Path) -> Path:
    """A ConnectX-7 RoCE port laid out as the kernel lays it out (class symlink into the PCI
    function, `device` and `driver` links, gid_attrs, numa_node, net/). Constructed here:
    the layout follows drivers/infiniband/core/sysfs.c; the values are typed in by hand."""
    root = tmp_path / "sys"
    dev = f"{ROCE_PCI}/infiniband/mlx5_0"
    link(root, "class/infiniband/mlx5_0", f"../../{dev}")
    link(root, f"{dev}/device", "../../../0000:19:00.0")
    link(root, f"{ROCE_PCI}/driver", "../../../../bus/pci/drivers/mlx5_core")
    (root / "bus/pci/drivers/mlx5_core").mkdir(parents=True)
    write(root, f"{ROCE_PCI}/numa_node", "1\n")
    write(root, f"{ROCE_PCI}/net/eth2/dev_port", "0\n")
    for name, text in {
        "fw_ver": "28.39.1002\n",
        "board_id": "MT_0000000838\n",
        "hca_type": "MT4129\n",
        "node_guid": "a088:c203:0012:3456\n",
        "node_type": "1: CA\n",
    }.items():
        write(root, f"{dev}/{name}", text)
    p = f"{dev}/ports/1"
    for name, text in {
        "state": "4: ACTIVE\n",
        "phys_state": "5: LinkUp\n",
        "rate": "400 Gb/sec (4X NDR)\n",
        "link_layer": "Ethernet\n",
        "lid": "0x0\n",
        "sm_lid": "0x0\n",
        "gid_attrs/ndevs/0": "eth2\n",
        "counters/port_xmit_data": "1000\n",
        "counters/port_rcv_data": "2000\n",
        "counters/unicast_xmit_packets": "5\n",
        "counters/port_xmit_wait": "7\n",
        "counters/link_downed": "1\n",
        "hw_counters/lifespan": "10\n",
        "hw_counters/np_cnp_sent": "11\n",
        "hw_counters/rp_cnp_handled": "12\n",
        "hw_counters/np_ecn_marked_roce_packets": "13\n",
        "hw_counters/out_of_buffer": "14\n",
        "hw_counters/rx_vport_rdma_unicast_packets": "99\n",
    }.items():
        write(root, f"{p}/{name}", text)
    return root


@pytest.fixture
def ib_dual_port_sys_root(tmp_path: Path) -> Path:
    """A dual-port mlx4 on InfiniBand with IPoIB netdevs ib0/ib1 (constructed like the one
    above). Port 2 is down."""
    root = tmp_path / "sys"
    dev = f"{IB_PCI}/infiniband/mlx4_0"
    link(root, "class/infiniband/mlx4_0", f"../../{dev}")
    link(root, f"{dev}/device", "../../../0000:82:00.0")
    write(root, f"{IB_PCI}/numa_node", "-1\n")
    write(root, f"{IB_PCI}/net/ib0/dev_port", "0\n")
    write(root, f"{IB_PCI}/net/ib1/dev_port", "1\n")
    write(root, f"{dev}/fw_ver", "2.42.5000\n")
    for n, state, phys, lid in (
        (1, "4: ACTIVE", "5: LinkUp", "0x1a"),
        (2, "1: DOWN", "3: Disabled", "0x0"),
    ):
        p = f"{dev}/ports/{n}"
        write(root, f"{p}/state", state + "\n")
        write(root, f"{p}/phys_state", phys + "\n")
        write(root, f"{p}/rate", "40 Gb/sec (4X QDR)\n")
        write(root, f"{p}/link_layer", "InfiniBand\n")
        write(root, f"{p}/lid", lid + "\n")
        write(root, f"{p}/sm_lid", "0x1\n")
        # on an InfiniBand port this file exists but reading it fails (GID 0 has no netdev)
        write(root, f"{p}/gid_attrs/ndevs/0", "")
        write(root, f"{p}/counters/port_xmit_data", "4294967295\n")
        write(root, f"{p}/counters/symbol_error", "3\n")
    return root


def ib_reader(root: Path) -> FaultyReader:
    """How the kernel answers reads of gid_attrs/ndevs/0 on InfiniBand ports: EINVAL."""
    base = "class/infiniband/mlx4_0/ports"
    return FaultyReader(
        root, read_errors={f"{base}/{n}/gid_attrs/ndevs/0": errno.EINVAL for n in (1, 2)}
    )


# -- real fixture trees ----------------------------------------------------------------


def test_procfs_tree_devices_and_identity(procfs_sys_root: Path) -> None:
    snap = sample(procfs_sys_root)
    assert snap.issues == ()
    assert [d.name for d in snap.devices] == ["hfi1_0", "mlx4_0", "mlx5_0"]
    hfi1, mlx4, mlx5 = snap.devices
    assert (mlx5.fw_ver, mlx5.board_id, mlx5.hca_type, mlx5.node_guid) == (
        "14.28.2006",
        "SM_2001000001034",
        "MT4118",
        "0a7f:bc12:45ef:d23b",
    )
    assert hfi1.hca_type is None and hfi1.node_guid is None  # absent, not ""
    assert (
        hfi1.board_id == "HPE 100Gb 1-port OP101 QSFP28 x16 PCIe Gen3 with Intel Omni-Path Adapter"
    )
    # plain directories without a `device` link: no PCI address, no NUMA node, no netdev
    for dev in snap.devices:
        assert (dev.pci_bus_id, dev.numa_node, dev.driver) == (None, None, None)
        assert all(p.netdevs == () for p in dev.ports)
    assert [p.port for p in mlx4.ports] == [1, 2]


def test_procfs_mlx5_port(procfs_sys_root: Path) -> None:
    port = port_of(sample(procfs_sys_root), "mlx5_0", 1)
    assert port.state == PortState(4, "ACTIVE")
    # procfs edited phys_state to "4: ACTIVE" (see PROVENANCE.md); 4 is not LinkUp (5)
    assert port.phys_state == PortState(4, "ACTIVE")
    assert port.up is False
    assert port.rate_bytes_per_second == 3_125_000_000  # 25 Gb/sec (1X EDR)
    assert port.link_layer == "InfiniBand"
    assert (port.lid, port.sm_lid) == (None, None)
    xmit = counter_of(port, "counters", "port_xmit_data")
    assert (xmit.raw, xmit.value, xmit.width) == (2880761508848, 2880761508848 * 4, 64)
    assert counter_of(port, "counters", "port_rcv_data").value == 18126345378 * 4
    assert counter_of(port, "counters", "port_xmit_packets").value == 10907922116
    assert counter_of(port, "hw_counters", "out_of_sequence").value == 1
    assert counter_of(port, "hw_counters", "resp_cqe_error").value == 8109
    assert port.hw_counters_lifespan_seconds == pytest.approx(0.01)
    sources = [c.source for c in port.counters]
    assert (sources.count("counters"), sources.count("hw_counters")) == (21, 24)
    assert not any(c.name == "lifespan" for c in port.counters)


def test_procfs_hfi1_data_counters_are_flits_of_8_bytes(procfs_sys_root: Path) -> None:
    port = port_of(sample(procfs_sys_root), "hfi1_0", 1)
    # hfi1 fills PortXmitData from C_DC_XMIT_FLITS (hfi1 mad.c); node_exporter multiplies by 4
    assert counter_of(port, "counters", "port_xmit_data").value == 273558326543 * 8
    assert counter_of(port, "counters", "port_rcv_data").value == 345091702026 * 8
    assert counter_of(port, "counters", "port_xmit_packets").value == 568318856
    assert port.up is True
    assert port.rate_bytes_per_second == 12_500_000_000


def test_procfs_mlx4_ports_sorted_and_64bit_by_value(procfs_sys_root: Path) -> None:
    snap = sample(procfs_sys_root)
    for n, wait in ((1, 3599), (2, 3846)):
        port = port_of(snap, "mlx4_0", n)
        assert counter_of(port, "counters", "port_xmit_wait").value == wait
        # no unicast_* files, but port_xmit_data holds more than 32 bits: the ext table
        assert counter_of(port, "counters", "port_rcv_data").width == 64
        assert port.rate_bytes_per_second == 5_000_000_000


def test_node_exporter_i40iw_all_no_pma(node_exporter_sys_root: Path) -> None:
    snap = sample(node_exporter_sys_root)
    port = port_of(snap, "i40iw0", 1)
    assert port.counters == ()
    base = "class/infiniband/i40iw0/ports/1/counters"
    names = sorted(os.listdir(node_exporter_sys_root / base))
    assert len(names) == 17
    assert snap.issues == tuple(
        ReadIssue(f"{base}/{n}", "unsupported", "N/A (no PMA)") for n in names
    )
    # the rest of the device and port is all there
    assert (port.state, port.phys_state) == (PortState(4, "ACTIVE"), PortState(5, "LinkUp"))
    assert port.rate_bytes_per_second == 1_250_000_000  # "10 Gb/sec (4X)"
    got = series(snap)
    i40iw = {k for k in got if k[1][0] == "i40iw0"}
    assert {name for name, _ in i40iw} == {
        "fabricscope_infiniband_device_info",
        P + "info",
        P + "state",
        P + "physical_state",
        P + "up",
        P + "rate_bytes_per_second",
        P + "link_width",
        P + "lane_speed_bytes_per_second",
        P + "rate_degraded",
    }
    assert (port.width, port.speed) == (4, "SDR")  # "(4X)": kernels that print SDR as nothing
    # and mlx4_0 beside it lost nothing
    assert got[(P + "transmit_wait_total", ("mlx4_0", "1"))] == 4294967295


def test_node_exporter_counters_ext_preferred_and_twin_generic(
    node_exporter_sys_root: Path,
) -> None:
    got = series(sample(node_exporter_sys_root))
    # port 2's counters/port_rcv_data reads 0, its counters_ext/port_rcv_data_64 4631917
    assert got[(P + "received_bytes_total", ("mlx4_0", "2"))] == 4631917 * 4
    assert got[(P + "generic_total", ("mlx4_0", "2", "counters", "port_rcv_data"))] == 0
    assert got[(P + "transmitted_unicast_packets_total", ("mlx4_0", "2"))] == 61239
    assert got[(P + "generic_total", ("mlx4_0", "2", "counters", "unicast_xmit_packets"))] == 0
    # port_rcv_discards has no PMA width in the kernel table: exported, never "saturated"
    assert got[(P + "receive_discards_total", ("mlx4_0", "1"))] == 0
    assert not any(k[1][-1] == "port_rcv_discards" for k in got if k[0] == P + "pma_saturated")


#: node_exporter metric -> (source, counter file) it is made from
NE_COUNTERS = {
    "node_infiniband_legacy_data_received_bytes_total": ("counters_ext", "port_rcv_data_64"),
    "node_infiniband_legacy_data_transmitted_bytes_total": ("counters_ext", "port_xmit_data_64"),
    "node_infiniband_legacy_multicast_packets_received_total": (
        "counters_ext",
        "port_multicast_rcv_packets",
    ),
    "node_infiniband_legacy_multicast_packets_transmitted_total": (
        "counters_ext",
        "port_multicast_xmit_packets",
    ),
    "node_infiniband_legacy_packets_received_total": ("counters_ext", "port_rcv_packets_64"),
    "node_infiniband_legacy_packets_transmitted_total": ("counters_ext", "port_xmit_packets_64"),
    "node_infiniband_legacy_unicast_packets_received_total": (
        "counters_ext",
        "port_unicast_rcv_packets",
    ),
    "node_infiniband_legacy_unicast_packets_transmitted_total": (
        "counters_ext",
        "port_unicast_xmit_packets",
    ),
    "node_infiniband_link_downed_total": ("counters", "link_downed"),
    "node_infiniband_link_error_recovery_total": ("counters", "link_error_recovery"),
    "node_infiniband_multicast_packets_received_total": ("counters", "multicast_rcv_packets"),
    "node_infiniband_multicast_packets_transmitted_total": ("counters", "multicast_xmit_packets"),
    "node_infiniband_port_constraint_errors_received_total": (
        "counters",
        "port_rcv_constraint_errors",
    ),
    "node_infiniband_port_constraint_errors_transmitted_total": (
        "counters",
        "port_xmit_constraint_errors",
    ),
    "node_infiniband_port_data_received_bytes_total": ("counters", "port_rcv_data"),
    "node_infiniband_port_data_transmitted_bytes_total": ("counters", "port_xmit_data"),
    "node_infiniband_port_discards_received_total": ("counters", "port_rcv_discards"),
    "node_infiniband_port_discards_transmitted_total": ("counters", "port_xmit_discards"),
    "node_infiniband_port_errors_received_total": ("counters", "port_rcv_errors"),
    "node_infiniband_port_packets_received_total": ("counters", "port_rcv_packets"),
    "node_infiniband_port_packets_transmitted_total": ("counters", "port_xmit_packets"),
    "node_infiniband_port_transmit_wait_total": ("counters", "port_xmit_wait"),
    "node_infiniband_unicast_packets_received_total": ("counters", "unicast_rcv_packets"),
    "node_infiniband_unicast_packets_transmitted_total": ("counters", "unicast_xmit_packets"),
}


def test_units_agree_with_node_exporter_golden_output(
    node_exporter_sys_root: Path,
    node_exporter_golden: dict[tuple[str, tuple[tuple[str, str], ...]], float],
) -> None:
    """Every node_infiniband_* sample node_exporter documents for its own fixture equals the
    value fabricscope reads from the same files: the same x4 for data words, same rate."""
    snap = sample(node_exporter_sys_root)
    compared = set()
    for (name, labels), want in node_exporter_golden.items():
        lab = dict(labels)
        if name == "node_infiniband_info":
            (dev,) = [d for d in snap.devices if d.name == lab["device"]]
            assert (dev.board_id, dev.fw_ver, dev.hca_type) == (
                lab["board_id"],
                lab["firmware_version"],
                lab["hca_type"],
            )
            compared.add(name)
            continue
        port = port_of(snap, lab["device"], int(lab["port"]))
        if name == "node_infiniband_rate_bytes_per_second":
            got: float | None = port.rate_bytes_per_second
        elif name == "node_infiniband_state_id":
            got = port.state.number if port.state else None
        elif name == "node_infiniband_physical_state_id":
            got = port.phys_state.number if port.phys_state else None
        else:
            got = counter_of(port, *NE_COUNTERS[name]).value
        assert got == want, (name, lab)
        compared.add(name)
    assert len(compared) == len(NE_COUNTERS) + 4  # every node_infiniband family checked
    # and the rendered byte counters carry those same numbers
    got_series = series(snap)
    golden = node_exporter_golden
    dp1 = (("device", "mlx4_0"), ("port", "1"))
    assert (
        got_series[(P + "received_bytes_total", ("mlx4_0", "1"))]
        == golden[("node_infiniband_legacy_data_received_bytes_total", dp1)]
    )
    assert (
        got_series[(P + "generic_total", ("mlx4_0", "1", "counters", "port_xmit_data"))]
        == (golden[("node_infiniband_port_data_transmitted_bytes_total", dp1)])
    )


def test_gpud_cx7_saturated_counters_flagged(gpud_cx7_sys_root: Path) -> None:
    snap = sample(gpud_cx7_sys_root)
    got = series(snap)
    saturated = {k[1][2]: v for k, v in got.items() if k[0] == P + "pma_saturated"}
    assert {k for k, v in saturated.items() if v == 1} == {
        "port_xmit_wait",
        "link_downed",
        "port_xmit_discards",
        "excessive_buffer_overrun_errors",
    }
    # the 13 narrow PMA counters get the gauge; the 64-bit data/packet ones do not
    assert len(saturated) == 13
    assert "port_xmit_data" not in saturated
    assert got[(P + "transmit_wait_total", ("mlx5_1", "1"))] == 4294967295
    assert got[(P + "transmitted_bytes_total", ("mlx5_1", "1"))] == 205143497464492 * 4
    assert got[(P + "receive_switch_relay_errors_total", ("mlx5_1", "1"))] == 2
    assert findings(snap) == [
        Finding(
            "counter_saturated",
            f"mlx5_1/1/{name}",
            f"counters/{name} on mlx5_1 port 1 sits at {raw}, the maximum of its {width}-bit "
            "width: it no longer counts until it is cleared (--infiniband.reset-saturated, or "
            "perfquery -R).",
        )
        for name, raw, width in sorted(
            [
                ("excessive_buffer_overrun_errors", 15, 4),
                ("link_downed", 255, 8),
                ("port_xmit_discards", 65535, 16),
                ("port_xmit_wait", 4294967295, 32),
            ]
        )
    ]
    # the dump has only counters/: the four port files every kernel port has are recorded
    base = "class/infiniband/mlx5_1/ports/1"
    assert [(i.path, i.reason) for i in snap.issues] == [
        (f"{base}/{n}", "vanished") for n in ("state", "phys_state", "rate", "link_layer")
    ]


def test_issue966_symlinked_i40iw_keeps_device_and_port_series(issue966_sys_root: Path) -> None:
    snap = sample(issue966_sys_root)
    (dev,) = snap.devices
    assert dev.pci_bus_id == "0000:09:00.0"  # from the resolved class link
    assert dev.numa_node is None  # the dump has no numa_node
    assert dev.ports[0].counters == ()
    base = "class/infiniband/i40iw0/ports/1"
    unsupported = [i.path for i in snap.issues if i.reason == "unsupported"]
    assert unsupported == [
        f"{base}/counters/{n}" for n in sorted(os.listdir(issue966_sys_root / base / "counters"))
    ]
    assert len(unsupported) == 8
    assert [i.reason for i in snap.issues].count("vanished") == 4
    got = series(snap)
    assert got == {
        (
            "fabricscope_infiniband_device_info",
            ("i40iw0", "", "", "", "", "", "0000:09:00.0", ""),
        ): 1.0,
        (P + "info", ("i40iw0", "1", "", "", "")): 1.0,
    }


# -- kernel-layout trees built here ----------------------------------------------------


def test_roce_port_identity_netdev_and_congestion_counters(roce_sys_root: Path) -> None:
    snap = sample(roce_sys_root)
    assert snap.issues == ()
    (dev,) = snap.devices
    assert (dev.pci_bus_id, dev.numa_node, dev.driver, dev.node_type) == (
        "0000:19:00.0",
        1,
        "mlx5_core",
        "CA",
    )
    port = dev.ports[0]
    assert port.netdevs == ("eth2",)
    assert (port.lid, port.sm_lid, port.link_layer) == (0, 0, "Ethernet")
    got = series(snap)
    dp = ("mlx5_0", "1")
    assert got == {
        (
            "fabricscope_infiniband_device_info",
            (
                "mlx5_0",
                "28.39.1002",
                "MT_0000000838",
                "MT4129",
                "a088:c203:0012:3456",
                "CA",
                "0000:19:00.0",
                "1",
            ),
        ): 1,
        (P + "info", ("mlx5_0", "1", "Ethernet", "0", "eth2")): 1,
        (P + "state", dp): 4,
        (P + "physical_state", dp): 5,
        (P + "up", dp): 1,
        (P + "rate_bytes_per_second", dp): 50_000_000_000,
        (P + "link_width", dp): 4,
        (P + "lane_speed_bytes_per_second", dp): 12_500_000_000,  # NDR: 100 Gb/s a lane
        # one port of its model: no peers; the sampler's first pass: its history is now
        (P + "rate_degraded", (*dp, "history")): 0,
        (P + "sm_lid", dp): 0,
        (P + "hw_counters_lifespan_seconds", dp): 0.01,
        (P + "transmitted_bytes_total", dp): 4000,
        (P + "received_bytes_total", dp): 8000,
        (P + "transmitted_unicast_packets_total", dp): 5,
        (P + "transmit_wait_total", dp): 7,
        (P + "link_downed_total", dp): 1,
        (P + "cnp_sent_total", dp): 11,
        (P + "cnp_handled_total", dp): 12,
        (P + "ecn_marked_roce_packets_total", dp): 13,
        (P + "out_of_buffer_total", dp): 14,
        (P + "generic_total", (*dp, "hw_counters", "rx_vport_rdma_unicast_packets")): 99,
        (P + "pma_saturated", (*dp, "port_xmit_wait")): 0,
        (P + "pma_saturated", (*dp, "link_downed")): 0,
        (P + "pma_saturated_counters", dp): 0,
    }


def test_ib_ports_take_netdev_by_dev_port_and_disabled_port_is_info(
    ib_dual_port_sys_root: Path,
) -> None:
    snap = sample(ib_reader(ib_dual_port_sys_root))
    assert snap.issues == ()  # EINVAL from gid_attrs/ndevs/0 is the normal IB answer
    (dev,) = snap.devices
    assert (dev.pci_bus_id, dev.numa_node) == ("0000:82:00.0", -1)
    assert [(p.port, p.netdevs, p.lid, p.up) for p in dev.ports] == [
        (1, ("ib0",), 26, True),
        (2, ("ib1",), 0, False),
    ]
    got = series(snap)
    assert got[(P + "info", ("mlx4_0", "1", "InfiniBand", "26", "ib0"))] == 1
    assert (
        got[
            (
                "fabricscope_infiniband_device_info",
                ("mlx4_0", "2.42.5000", "", "", "", "", "0000:82:00.0", "-1"),
            )
        ]
        == 1
    )
    # no unicast files and no value above 32 bits: port_xmit_data is taken as 32-bit
    assert got[(P + "pma_saturated", ("mlx4_0", "1", "port_xmit_data"))] == 1
    cleared = (
        "it no longer counts until it is cleared (--infiniband.reset-saturated, or perfquery -R)."
    )
    assert findings(snap) == [
        Finding(
            "counter_saturated",
            "mlx4_0/1/port_xmit_data",
            "counters/port_xmit_data on mlx4_0 port 1 sits at 4294967295, the maximum of its "
            f"32-bit width: {cleared}",
        ),
        Finding(
            "counter_saturated",
            "mlx4_0/2/port_xmit_data",
            "counters/port_xmit_data on mlx4_0 port 2 sits at 4294967295, the maximum of its "
            f"32-bit width: {cleared}",
        ),
        # an administrator's choice: info, not the critical port_down the alert leaves out
        Finding(
            "port_disabled",
            "mlx4_0/2",
            "mlx4_0 port 2 is switched off (physical state Disabled).",
        ),
    ]
    assert [f.severity for f in findings(snap)] == ["info", "info", "info"]


def test_netdev_read_error_other_than_einval_is_recorded(ib_dual_port_sys_root: Path) -> None:
    rel = "class/infiniband/mlx4_0/ports/1/gid_attrs/ndevs/0"
    reader = ib_reader(ib_dual_port_sys_root)
    reader.read_errors[rel] = errno.EACCES
    snap = sample(reader)
    assert [(i.path, i.reason) for i in snap.issues] == [(rel, "permission")]
    assert port_of(snap, "mlx4_0", 1).netdevs == ("ib0",)  # the fallback still finds it


def test_hfi1_found_by_driver_link(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    pci = "devices/pci0000:00/0000:00:02.0/0000:05:00.0"
    dev = f"{pci}/infiniband/opa0"  # renamed by udev: the name no longer says hfi1
    link(root, "class/infiniband/opa0", f"../../{dev}")
    link(root, f"{dev}/device", "../../../0000:05:00.0")
    link(root, f"{pci}/driver", "../../../../bus/pci/drivers/hfi1")
    write(root, f"{dev}/ports/1/counters/port_xmit_data", "10\n")
    for name, text in (
        ("state", "4: ACTIVE\n"),
        ("phys_state", "5: LinkUp\n"),
        ("rate", "100 Gb/sec (4X EDR)\n"),
        ("link_layer", "InfiniBand\n"),
    ):
        write(root, f"{dev}/ports/1/{name}", text)
    port = port_of(sample(root), "opa0", 1)
    assert counter_of(port, "counters", "port_xmit_data").value == 80


def test_non_numeric_port_entry_is_an_issue_not_a_crash(roce_sys_root: Path) -> None:
    (roce_sys_root / ROCE_PCI / "infiniband/mlx5_0/ports/lost+found").mkdir()
    snap = sample(roce_sys_root)
    assert [(i.path, i.reason) for i in snap.issues] == [
        ("class/infiniband/mlx5_0/ports/lost+found", "parse")
    ]
    assert [p.port for p in snap.devices[0].ports] == [1]


def test_no_class_dir_is_no_data(tmp_path: Path) -> None:
    with pytest.raises(NoData):
        sample(tmp_path)
    (tmp_path / "class/infiniband").mkdir(parents=True)
    with pytest.raises(NoData):
        sample(tmp_path)


def test_unlistable_class_dir_is_an_issue_not_an_exception(procfs_sys_root: Path) -> None:
    snap = sample(FaultyReader(procfs_sys_root, list_errors={"class/infiniband": errno.EACCES}))
    assert snap.devices == ()
    assert [(i.path, i.reason) for i in snap.issues] == [("class/infiniband", "permission")]


# -- fault injection -------------------------------------------------------------------

MLX5 = "class/infiniband/mlx5_0/ports/1"
MLX4 = "class/infiniband/mlx4_0/ports"
HFI1 = "class/infiniband/hfi1_0/ports/1"


@pytest.mark.parametrize(
    ("path", "fault", "reason", "lost"),
    [
        (
            f"{MLX5}/counters/port_xmit_data",
            errno.EACCES,
            "permission",
            {(P + "transmitted_bytes_total", ("mlx5_0", "1"))},
        ),
        (
            f"{MLX5}/hw_counters/out_of_sequence",
            errno.EIO,
            "io",
            {(P + "out_of_sequence_total", ("mlx5_0", "1"))},
        ),
        (
            f"{HFI1}/counters/link_downed",
            errno.ENOENT,  # listed, then gone before the read
            "vanished",
            {
                (P + "link_downed_total", ("hfi1_0", "1")),
                (P + "pma_saturated", ("hfi1_0", "1", "link_downed")),
            },
        ),
        (
            f"{MLX4}/2/counters/symbol_error",
            "\x00\xffgarbage\n",
            "parse",
            {
                (P + "symbol_errors_total", ("mlx4_0", "2")),
                (P + "pma_saturated", ("mlx4_0", "2", "symbol_error")),
            },
        ),
        (
            f"{MLX5}/counters/port_xmit_wait",
            "N/A (no PMA)\n",
            "unsupported",
            {
                (P + "transmit_wait_total", ("mlx5_0", "1")),
                (P + "pma_saturated", ("mlx5_0", "1", "port_xmit_wait")),
            },
        ),
        (
            f"{MLX5}/counters/port_rcv_errors",
            "-3\n",
            "parse",
            {
                (P + "receive_errors_total", ("mlx5_0", "1")),
                (P + "pma_saturated", ("mlx5_0", "1", "port_rcv_errors")),
            },
        ),
        (
            f"{MLX5}/counters/symbol_error",
            "184467440737095516160\n",
            "parse",
            {
                (P + "symbol_errors_total", ("mlx5_0", "1")),
                (P + "pma_saturated", ("mlx5_0", "1", "symbol_error")),
            },
        ),
        (
            f"{MLX5}/rate",
            errno.EACCES,
            "permission",
            {
                (P + "rate_bytes_per_second", ("mlx5_0", "1")),
                (P + "link_width", ("mlx5_0", "1")),
                (P + "lane_speed_bytes_per_second", ("mlx5_0", "1")),
            },
        ),
        (
            f"{MLX5}/state",
            "bogus\n",
            "parse",
            {(P + "state", ("mlx5_0", "1")), (P + "up", ("mlx5_0", "1"))},
        ),
        (
            f"{MLX4}/1/phys_state",
            errno.EIO,
            "io",
            {
                (P + "physical_state", ("mlx4_0", "1")),
                (P + "up", ("mlx4_0", "1")),
                # not known to be up: its rate is not judged
                (P + "rate_degraded", ("mlx4_0", "1", "history")),
            },
        ),
        (
            f"{MLX5}/hw_counters/lifespan",
            errno.EIO,
            "io",
            {(P + "hw_counters_lifespan_seconds", ("mlx5_0", "1"))},
        ),
    ],
)
def test_one_bad_file_costs_exactly_its_series(
    procfs_sys_root: Path, path: str, fault: int | str, reason: str, lost: set[object]
) -> None:
    clean = series(sample(procfs_sys_root))
    if isinstance(fault, int):
        reader = FaultyReader(procfs_sys_root, read_errors={path: fault})
    else:
        reader = FaultyReader(procfs_sys_root, texts={path: fault})
    snap = sample(reader)
    assert [(i.path, i.reason) for i in snap.issues] == [(path, reason)]
    got = series(snap)
    assert set(clean) - set(got) == lost
    assert set(got) - set(clean) == set()
    assert all(got[k] == clean[k] for k in got)


def test_unlistable_counter_dir_costs_that_dir_only(procfs_sys_root: Path) -> None:
    clean = series(sample(procfs_sys_root))
    rel = f"{MLX5}/hw_counters"
    snap = sample(FaultyReader(procfs_sys_root, list_errors={rel: errno.EIO}))
    assert [(i.path, i.reason) for i in snap.issues] == [(rel, "io")]
    got = series(snap)
    hw = [
        c
        for c in port_of(sample(procfs_sys_root), "mlx5_0", 1).counters
        if c.source == "hw_counters"
    ]
    specs = [infiniband_counters.dedicated_spec(c.source, c.name) for c in hw]
    expected = {(spec.name, ("mlx5_0", "1")) for spec in specs if spec is not None}
    assert len(expected) == len(hw) == 24
    expected.add((P + "hw_counters_lifespan_seconds", ("mlx5_0", "1")))
    assert set(clean) - set(got) == expected
    assert set(got) - set(clean) == set()


def test_unreadable_identity_file_blanks_that_label_only(procfs_sys_root: Path) -> None:
    clean = series(sample(procfs_sys_root))
    rel = "class/infiniband/mlx4_0/fw_ver"
    snap = sample(FaultyReader(procfs_sys_root, read_errors={rel: errno.EACCES}))
    assert [(i.path, i.reason) for i in snap.issues] == [(rel, "permission")]
    got = series(snap)
    before = ("mlx4_0", "2.31.5050", "SM_1141000001000", "MT4099", "", "", "", "")
    after = ("mlx4_0", "", "SM_1141000001000", "MT4099", "", "", "", "")
    info = "fabricscope_infiniband_device_info"
    assert set(clean) - set(got) == {(info, before)}
    assert set(got) - set(clean) == {(info, after)}


def test_device_vanishing_mid_scan_costs_that_device_only(
    procfs_sys_root: Path, tmp_path: Path
) -> None:
    root = tmp_path / "sys"
    shutil.copytree(procfs_sys_root, root, symlinks=True)
    clean = series(sample(root))

    def unplug() -> None:
        shutil.rmtree(root / "class/infiniband/mlx4_0")

    snap = sample(FaultyReader(root, after_listdir={"class/infiniband/mlx4_0/ports": unplug}))
    assert [d.name for d in snap.devices] == ["hfi1_0", "mlx5_0"]
    assert [(i.path, i.reason) for i in snap.issues] == [("class/infiniband/mlx4_0", "vanished")]
    got = series(snap)
    assert got == {k: v for k, v in clean.items() if k[1][0] != "mlx4_0"}


# -- rendering -------------------------------------------------------------------------


def test_render_exact_values_procfs(procfs_sys_root: Path) -> None:
    got = series(sample(procfs_sys_root))
    m5, h1 = ("mlx5_0", "1"), ("hfi1_0", "1")
    assert got[(P + "transmitted_bytes_total", m5)] == 2880761508848 * 4
    assert got[(P + "received_bytes_total", m5)] == 18126345378 * 4
    assert got[(P + "transmitted_bytes_total", h1)] == 273558326543 * 8
    assert got[(P + "transmitted_packets_total", m5)] == 10907922116
    assert got[(P + "received_unicast_packets_total", m5)] == 541889824
    assert got[(P + "requester_cqe_errors_total", m5)] == 3481
    assert got[(P + "responder_cqe_errors_total", m5)] == 8109
    assert got[(P + "duplicate_requests_total", m5)] == 41
    assert got[(P + "local_ack_timeout_errors_total", m5)] == 131
    assert got[(P + "roce_slow_restart_cnps_total", m5)] == 131
    assert got[(P + "hw_counters_lifespan_seconds", m5)] == 0.01  # not 0, as node_exporter has
    assert got[(P + "rate_bytes_per_second", m5)] == 3_125_000_000
    assert got[(P + "state", m5)] == 4
    assert got[(P + "up", m5)] == 0
    assert got[(P + "up", h1)] == 1
    assert got[(P + "info", ("mlx4_0", "2", "InfiniBand", "", ""))] == 1
    assert got[(P + "link_width", ("mlx4_0", "2"))] == 4
    assert got[(P + "lane_speed_bytes_per_second", ("mlx4_0", "2"))] == 1_250_000_000  # QDR
    assert (
        got[
            (
                "fabricscope_infiniband_device_info",
                (
                    "mlx5_0",
                    "14.28.2006",
                    "SM_2001000001034",
                    "MT4118",
                    "0a7f:bc12:45ef:d23b",
                    "",
                    "",
                    "",
                ),
            )
        ]
        == 1
    )
    assert not any(k[0] == P + "generic_total" for k in got)  # every procfs file is known


@pytest.mark.parametrize("tree", ["procfs", "node_exporter", "gpud-pr943-cx7", "ne-issue966-i40iw"])
def test_every_counter_file_is_exported_exactly_once(tree: str) -> None:
    snap = sample(FIXTURES / tree / "sys")
    for dev in snap.devices:
        for port in dev.ports:
            dedicated, generic = infiniband_counters.split_counters(port.counters)
            exported = [c for _, c in dedicated] + generic
            assert sorted(exported, key=lambda c: (c.source, c.name)) == list(port.counters)
            assert len({spec.name for spec, _ in dedicated}) == len(dedicated)


def test_rendered_families_are_all_in_the_catalog(
    procfs_sys_root: Path, node_exporter_sys_root: Path, roce_sys_root: Path
) -> None:
    names = {spec.name for spec in ib_metrics.SPECS}
    assert len(names) == len(ib_metrics.SPECS)
    for root in (procfs_sys_root, node_exporter_sys_root, roce_sys_root):
        out = Families()
        ib_metrics.render(sample(root), out)
        assert {spec.name for spec, _ in out.items()} <= names


def test_exposition_is_stable_whatever_the_device_order(procfs_sys_root: Path) -> None:
    snap = sample(procfs_sys_root)
    shuffled = InfinibandSnapshot(devices=tuple(reversed(snap.devices)), issues=snap.issues)
    a, b = Families(), Families()
    ib_metrics.render(snap, a)
    ib_metrics.render(shuffled, b)
    text = render_text(a)
    assert text == render_text(b)
    lines = [ln for ln in text.decode().splitlines() if ln.startswith(P + "transmit_wait_total{")]
    assert lines == [
        'fabricscope_infiniband_port_transmit_wait_total{device="hfi1_0",port="1"} 0.0',
        'fabricscope_infiniband_port_transmit_wait_total{device="mlx4_0",port="1"} 3599.0',
        'fabricscope_infiniband_port_transmit_wait_total{device="mlx4_0",port="2"} 3846.0',
        'fabricscope_infiniband_port_transmit_wait_total{device="mlx5_0",port="1"} 0.0',
    ]


def test_findings_on_real_trees(procfs_sys_root: Path, node_exporter_sys_root: Path) -> None:
    # procfs's mlx5_0 reads phys_state "4: ACTIVE" (4 is PortConfigurationTraining in the
    # kernel's list): not LinkUp, so fabricscope_infiniband_port_up is 0 and the port-down
    # alert fires on it; the finding agrees with the alert
    assert [(f.kind, f.subject, f.detail) for f in findings(sample(procfs_sys_root))] == [
        (
            "port_down",
            "mlx5_0/1",
            "mlx5_0 port 1 is ACTIVE but its physical state is ACTIVE, not LinkUp.",
        )
    ]
    assert [(f.kind, f.subject) for f in findings(sample(node_exporter_sys_root))] == [
        ("counter_saturated", "mlx4_0/1/port_xmit_wait")
    ]


def test_exposition_passes_promtool_lint(
    procfs_sys_root: Path, node_exporter_sys_root: Path, roce_sys_root: Path
) -> None:
    out = Families()
    for root in (procfs_sys_root, node_exporter_sys_root, roce_sys_root):
        ib_metrics.render(sample(root), out)
    promtool_check_metrics(render_text(out))


def test_a_saturated_roce_counter_is_told_no_remedy_exists_never_a_clear(
    roce_sys_root: Path, tmp_path: Path
) -> None:
    """On an Ethernet-link port nothing can clear a PMA counter (perfquery needs an InfiniBand
    subnet; the PMA step skips such ports, reset mode or not): the finding says so and points
    at the netdev's 64-bit ethtool statistics, never at --infiniband.reset-saturated or
    perfquery -R as a remedy. (The value is planted at the 32-bit maximum.)"""
    from agent.infiniband.pma import PmaReader

    p = roce_sys_root / "class/infiniband/mlx5_0/ports/1/counters/port_xmit_wait"
    p.write_text(f"{2**32 - 1}\n")
    pma = PmaReader(SysfsReader(roce_sys_root), mode="on", reset=True, prefix=("false",))
    snap = InfinibandSampler(SysfsReader(roce_sys_root), pma=pma).sample()
    assert snap.tool_calls == 0  # nothing was even tried
    (found,) = [f for f in findings(snap) if f.kind == "counter_saturated"]
    assert found.subject == "mlx5_0/1/port_xmit_wait"
    assert "no remedy exists on this Ethernet port" in found.detail
    assert "until it is cleared" not in found.detail
    assert "on its netdev (eth2)" in found.detail
    assert "fabricscope_netdev_ethtool_statistic_total" in found.detail
    # the statistics it names are ones the netdev sampler reads and keeps at default detail
    from agent.netdev.stats import DEFAULT_ETHTOOL_INCLUDE
    from exporter.metrics.netdev import DEFAULT_DETAIL_STATISTICS

    for name in ("rx_vport_rdma_unicast_bytes", "rx_symbol_err_phy", "rx_crc_errors_phy"):
        assert name in found.detail
        assert DEFAULT_ETHTOOL_INCLUDE.fullmatch(name) and DEFAULT_DETAIL_STATISTICS.fullmatch(name)
