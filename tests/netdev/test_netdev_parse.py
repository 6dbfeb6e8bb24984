"""Pure parts of the netdev sampler: parsers, the ethtool include/classification, netlink
message conversion, and RDMA netdev discovery from sysfs trees."""

from __future__ import annotations

import errno
import re
from pathlib import Path

import pytest

from agent.core.errors import NoData
from agent.core.sysfs import Issues, ReadIssue, SysfsReader
from agent.netdev.sampler import NetdevSampler, read_rdma_netdevs
from agent.netdev.stats import (
    DEFAULT_ETHTOOL_INCLUDE,
    EthtoolStat,
    EthtoolStats,
    LinkStats64,
    NetlinkLink,
    PriorityStats,
    RdmaPort,
    parse_ethtool_stats,
    parse_ndev,
    parse_operstate,
    parse_speed,
    to_link,
    to_stats64,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
COUNTERS_RST = FIXTURES / "netdev-mlx5-counters" / "counters-rst-names.txt"


# -- parsers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("100000\n", 12_500_000_000),  # 100 GbE
        ("400000\n", 50_000_000_000),  # 400 GbE / NDR
        ("10000", 1_250_000_000),  # veth
        ("25000\n", 3_125_000_000),
        ("-1\n", None),  # SPEED_UNKNOWN
        ("0\n", None),
        ("4294967295\n", None),  # SPEED_UNKNOWN printed unsigned by old kernels
    ],
)
def test_parse_speed(text: str, expected: int | None) -> None:
    assert parse_speed(text) == expected


@pytest.mark.parametrize("text", ["", "fast\n", "100 Mb/s"])
def test_parse_speed_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        parse_speed(text)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("UP", "up"),
        ("DOWN", "down"),
        ("LOWERLAYERDOWN", "lowerlayerdown"),
        ("UNKNOWN", "unknown"),
        ("dormant\n", "dormant"),
        ("NOTPRESENT", "notpresent"),
        ("TESTING", "testing"),
    ],
)
def test_parse_operstate(value: str, expected: str) -> None:
    assert parse_operstate(value) == expected


def test_parse_operstate_rejects_unknown_words() -> None:
    with pytest.raises(ValueError):
        parse_operstate("SIDEWAYS")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("ens1f0np0\n", "ens1f0np0"), ("bond0", "bond0"), ("ib0.8001\n", "ib0.8001")],
)
def test_parse_ndev(text: str, expected: str) -> None:
    assert parse_ndev(text) == expected


@pytest.mark.parametrize("text", ["", "\n", "a/b", "x" * 16])
def test_parse_ndev_rejects_non_names(text: str) -> None:
    with pytest.raises(ValueError):
        parse_ndev(text)


def test_to_stats64_maps_every_kernel_field_and_leaves_missing_ones_absent() -> None:
    fields = {
        "rx_packets": 1, "tx_packets": 2, "rx_bytes": 3, "tx_bytes": 4, "rx_errors": 5,
        "tx_errors": 6, "rx_dropped": 7, "tx_dropped": 8, "multicast": 9, "collisions": 10,
        "rx_length_errors": 11, "rx_over_errors": 12, "rx_crc_errors": 13,
        "rx_frame_errors": 14, "rx_fifo_errors": 15, "rx_missed_errors": 16,
        "tx_aborted_errors": 17, "tx_carrier_errors": 18, "tx_fifo_errors": 19,
        "tx_heartbeat_errors": 20, "tx_window_errors": 21, "rx_compressed": 22,
    }  # fmt: skip
    got = to_stats64(fields)
    assert got == LinkStats64(*range(1, 23))  # tx_compressed absent: None
    assert to_stats64({}) == LinkStats64()


class FakeLinkMessage:
    """Stands in for pyroute2's ifinfmsg: ``msg["index"]`` and ``msg.get("IFLA_...")``."""

    def __init__(self, index: object, attrs: dict[str, object]) -> None:
        self.index = index
        self.attrs = attrs

    def get(self, key: str) -> object:
        return self.attrs.get(key)

    def __getitem__(self, key: str) -> object:
        assert key == "index"
        return self.index


def test_to_link_converts_a_full_message() -> None:
    msg = FakeLinkMessage(
        7,
        {
            "IFLA_IFNAME": "ens1f0np0",
            "IFLA_OPERSTATE": "UP",
            "IFLA_CARRIER": 1,
            "IFLA_CARRIER_CHANGES": 4,
            "IFLA_MTU": 4200,
            "IFLA_STATS64": {"rx_bytes": 10, "tx_bytes": 20},
        },
    )
    assert to_link(msg) == NetlinkLink(
        ifindex=7,
        name="ens1f0np0",
        operstate="up",
        carrier=1,
        carrier_changes=4,
        mtu_bytes=4200,
        stats=LinkStats64(rx_bytes=10, tx_bytes=20),
    )


def test_to_link_leaves_absent_attributes_absent() -> None:
    msg = FakeLinkMessage(3, {"IFLA_IFNAME": "ib0"})
    assert to_link(msg) == NetlinkLink(ifindex=3, name="ib0")


@pytest.mark.parametrize(
    "msg",
    [
        FakeLinkMessage(None, {"IFLA_IFNAME": "x"}),
        FakeLinkMessage(1, {}),
        FakeLinkMessage(1, {"IFLA_IFNAME": "x", "IFLA_MTU": "1500"}),
        FakeLinkMessage(1, {"IFLA_IFNAME": "x", "IFLA_STATS64": 5}),
        FakeLinkMessage(1, {"IFLA_IFNAME": "x", "IFLA_OPERSTATE": "WEIRD"}),
    ],
)
def test_to_link_rejects_malformed_messages(msg: FakeLinkMessage) -> None:
    with pytest.raises(ValueError):
        to_link(msg)


# -- the ethtool include pattern against the kernel's mlx5 counter names -------------------


def expand(template: str) -> list[str]:
    if "[i]" in template:
        return [template.replace("[i]", i) for i in ("", "0", "1")]
    if "[p]" in template:
        return [template.replace("[p]", str(p)) for p in range(8)]
    if "[l]" in template:
        return [template.replace("[l]", str(lane)) for lane in range(4)]
    return [template]


def mlx5_names() -> set[str]:
    templates = COUNTERS_RST.read_text().split()
    return {name for t in templates for name in expand(t)}


EXPECTED_MLX5_INCLUDED = {
    # physical port: wire totals, errors, BER inputs, pause, module events
    "rx_packets_phy", "tx_packets_phy", "rx_bytes_phy", "tx_bytes_phy",
    "rx_crc_errors_phy", "rx_in_range_len_errors_phy", "rx_out_of_range_len_phy",
    "rx_oversize_pkts_phy", "rx_symbol_err_phy", "rx_pause_ctrl_phy", "tx_pause_ctrl_phy",
    "rx_unsupported_op_phy", "rx_discards_phy", "tx_discards_phy", "tx_errors_phy",
    "rx_undersize_pkts_phy", "rx_fragments_phy", "rx_jabbers_phy", "link_down_events_phy",
    "rx_out_of_buffer", "module_bus_stuck", "module_high_temp", "module_bad_shorted",
    "module_unplug", "rx_buffer_passed_thres_phy", "tx_pause_storm_warning_events",
    "tx_pause_storm_error_events", "rx_bits_phy", "rx_pcs_symbol_err_phy",
    "rx_corrected_bits_phy", "rx_err_lane_0_phy", "rx_err_lane_1_phy", "rx_err_lane_2_phy",
    "rx_err_lane_3_phy", "rx_global_pause", "rx_global_pause_duration", "tx_global_pause",
    "tx_global_pause_duration", "rx_global_pause_transition",
    # vport: RoCE traffic, which the kernel's counters never see
    "rx_vport_rdma_unicast_packets", "rx_vport_rdma_unicast_bytes",
    "tx_vport_rdma_unicast_packets", "tx_vport_rdma_unicast_bytes",
    "rx_vport_rdma_multicast_packets", "rx_vport_rdma_multicast_bytes",
    "tx_vport_rdma_multicast_packets", "tx_vport_rdma_multicast_bytes",
    "dev_internal_queue_oob",
    # device: PCIe health and stalls, device buffers
    "rx_pci_signal_integrity", "tx_pci_signal_integrity", "outbound_pci_buffer_overflow",
    "outbound_pci_stalled_rd", "outbound_pci_stalled_wr", "outbound_pci_stalled_rd_events",
    "outbound_pci_stalled_wr_events", "dev_out_of_buffer",
} | {
    name
    for p in range(8)
    for name in (
        f"rx_prio{p}_pause", f"rx_prio{p}_pause_duration", f"rx_prio{p}_pause_transition",
        f"tx_prio{p}_pause", f"tx_prio{p}_pause_duration", f"rx_prio{p}_buf_discard",
        f"rx_prio{p}_cong_discard", f"rx_prio{p}_marked", f"rx_prio{p}_discards",
    )
}  # fmt: skip


def test_fixture_holds_the_documented_mlx5_names() -> None:
    names = mlx5_names()
    # 227 lines; rx/tx_packets/bytes are listed twice (software port and representor vPort)
    assert len(COUNTERS_RST.read_text().split()) == 227
    assert len(names) == 521
    for known in ("rx_prio3_pause", "rx0_packets", "rx_packets", "tx_queue_stopped"):
        assert known in names


def test_default_ethtool_include_keeps_exactly_the_expected_mlx5_statistics() -> None:
    kept = {n for n in mlx5_names() if DEFAULT_ETHTOOL_INCLUDE.fullmatch(n)}
    assert kept == EXPECTED_MLX5_INCLUDED


def test_default_ethtool_include_drops_per_ring_and_veth_statistics() -> None:
    for name in (
        "rx0_packets", "ch1_events", "rx_prio0_bytes", "tx_prio7_packets", "rx_csum_none",
        "peer_ifindex", "rx_queue_0_xdp_packets", "tx_queue_0_xdp_xmit",
        "xrx_prio0_pause", "rx_prio0_pause_x",
    ):  # fmt: skip
        assert not DEFAULT_ETHTOOL_INCLUDE.fullmatch(name), name


# -- ethtool classification ----------------------------------------------------------------


def test_parse_ethtool_stats_routes_named_statistics_and_converts_units() -> None:
    pairs = [
        ("rx_prio3_pause", 11),
        ("tx_prio3_pause", 12),
        ("rx_prio3_pause_duration", 2_500_000),  # µs
        ("tx_prio3_pause_duration", 1_000),
        ("rx_prio3_discards", 13),
        ("rx_prio3_buf_discard", 14),
        ("rx_prio3_cong_discard", 15),
        ("rx_prio3_marked", 16),
        ("rx_prio0_pause", 1),
        ("rx_pause_ctrl_phy", 21),
        ("tx_pause_ctrl_phy", 22),
        ("tx_pause_storm_warning_events", 23),
        ("tx_pause_storm_error_events", 24),
        ("rx_discards_phy", 25),
        ("tx_discards_phy", 26),
        ("rx_out_of_buffer", 27),
        ("outbound_pci_stalled_rd", 40),  # percent
        ("outbound_pci_stalled_wr", 5),
        ("rx_corrected_bits_phy", 1234),
        ("rx_prio3_pause_transition", 9),
        ("rx0_packets", 99),  # not included by default
    ]
    got = parse_ethtool_stats(pairs, DEFAULT_ETHTOOL_INCLUDE)
    assert got == EthtoolStats(
        priorities=(
            PriorityStats(priority=0, rx_pause_frames=1),
            PriorityStats(
                priority=3,
                rx_pause_frames=11,
                tx_pause_frames=12,
                rx_pause_duration_seconds=2.5,
                tx_pause_duration_seconds=0.001,
                rx_discarded_no_buffer=13,
                rx_discarded_host_buffer=14,
                rx_discarded_host_congestion=15,
                rx_ecn_marked=16,
            ),
        ),
        rx_pause_frames=21,
        tx_pause_frames=22,
        pause_storm_warning_events=23,
        pause_storm_error_events=24,
        rx_discards_phy=25,
        tx_discards_phy=26,
        rx_out_of_buffer=27,
        pcie_stalled_reads_ratio=0.4,
        pcie_stalled_writes_ratio=0.05,
        counters=(
            EthtoolStat("rx_corrected_bits_phy", 1234),
            EthtoolStat("rx_prio3_pause_transition", 9),
        ),
    )


def test_parse_ethtool_stats_generic_gauges_duplicates_and_filtering() -> None:
    include = re.compile(r"peer_ifindex|rx_queue_\d+_xdp_packets|tx_prio\d_discards")
    pairs = [
        ("peer_ifindex", 5),
        ("rx_queue_0_xdp_packets", 7),
        ("rx_queue_0_xdp_packets", 8),  # a driver repeating a name: first value kept
        ("rx_queue_0_drops", 3),  # not included
        ("tx_prio1_discards", 4),  # no such named field for tx: generic counter
    ]
    assert parse_ethtool_stats(pairs, include) == EthtoolStats(
        counters=(EthtoolStat("rx_queue_0_xdp_packets", 7), EthtoolStat("tx_prio1_discards", 4)),
        gauges=(EthtoolStat("peer_ifindex", 5),),
    )
    assert parse_ethtool_stats(pairs, DEFAULT_ETHTOOL_INCLUDE) == EthtoolStats()


# -- RDMA netdev discovery -----------------------------------------------------------------


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def rdma_tree(root: Path) -> Path:
    """A sysfs tree in the real layout: a RoCE port with a VLAN netdev in its GID table, a
    RoCE LAG device whose GIDs point at bond0, a dual-port IB HCA with IPoIB netdevs told
    apart by dev_port, and a device without netdevs."""
    ib = "class/infiniband"
    write(root, f"{ib}/mlx5_0/ports/1/link_layer", "Ethernet\n")
    write(root, f"{ib}/mlx5_0/ports/1/gid_attrs/ndevs/0", "ens1f0np0\n")
    write(root, f"{ib}/mlx5_0/ports/1/gid_attrs/ndevs/1", "ens1f0np0\n")
    write(root, f"{ib}/mlx5_0/ports/1/gid_attrs/ndevs/2", "ens1f0np0.100\n")
    write(root, f"{ib}/mlx5_0/ports/1/gid_attrs/ndevs/3", "")  # made unreadable below
    write(root, f"{ib}/mlx5_0/device/net/ens1f0np0/dev_port", "0\n")
    write(root, f"{ib}/mlx5_bond_0/ports/1/link_layer", "Ethernet\n")
    write(root, f"{ib}/mlx5_bond_0/ports/1/gid_attrs/ndevs/0", "bond0\n")
    write(root, f"{ib}/mlx5_bond_0/device/net/ens2f0np0/dev_port", "0\n")
    write(root, f"{ib}/mlx4_0/ports/1/link_layer", "InfiniBand\n")
    write(root, f"{ib}/mlx4_0/ports/2/link_layer", "InfiniBand\n")
    write(root, f"{ib}/mlx4_0/ports/1/gid_attrs/ndevs/0", "never-read\n")
    write(root, f"{ib}/mlx4_0/device/net/ib0/dev_port", "0\n")
    write(root, f"{ib}/mlx4_0/device/net/ib1/dev_port", "1\n")
    write(root, f"{ib}/mlx4_0/device/net/ibx/dev_port", "7\n")  # no port 8: port unknown
    write(root, f"{ib}/hfi1_0/ports/1/link_layer", "InfiniBand\n")
    return root


class FaultyReader(SysfsReader):
    """Raises a chosen OSError for chosen paths, like sysfs attributes do."""

    def __init__(self, root: Path, faults: dict[str, int]) -> None:
        super().__init__(root)
        self.faults = faults
        self.read: list[str] = []

    def read_text(self, rel: str) -> str:
        self.read.append(rel)
        if rel in self.faults:
            raise OSError(self.faults[rel], "injected")
        return super().read_text(rel)


def test_read_rdma_netdevs_from_gid_tables_and_device_net(tmp_path: Path) -> None:
    gid3 = "class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/3"
    sys = FaultyReader(rdma_tree(tmp_path), {gid3: errno.EINVAL})  # an empty GID entry
    issues = Issues(sys)
    got = read_rdma_netdevs(sys, issues)
    assert got == {
        "ens1f0np0": {RdmaPort("mlx5_0", 1)},
        "ens1f0np0.100": {RdmaPort("mlx5_0", 1)},
        "bond0": {RdmaPort("mlx5_bond_0", 1)},
        "ens2f0np0": {RdmaPort("mlx5_bond_0", 1)},
        "ib0": {RdmaPort("mlx4_0", 1)},
        "ib1": {RdmaPort("mlx4_0", 2)},
        "ibx": set(),
    }
    assert issues.freeze() == ()
    # InfiniBand ports have no netdev behind their GIDs: their ndevs are never read
    assert not any("mlx4_0/ports/1/gid_attrs" in rel for rel in sys.read)


def test_read_rdma_netdevs_records_unreadable_entries_and_keeps_the_rest(tmp_path: Path) -> None:
    gid2 = "class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/2"
    gid3 = "class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/3"
    sys = FaultyReader(rdma_tree(tmp_path), {gid2: errno.EACCES, gid3: errno.ENODATA})
    issues = Issues(sys)
    got = read_rdma_netdevs(sys, issues)
    assert "ens1f0np0.100" not in got
    assert got["ens1f0np0"] == {RdmaPort("mlx5_0", 1)}
    assert got["ib1"] == {RdmaPort("mlx4_0", 2)}
    assert issues.freeze() == (ReadIssue(gid2, "permission", "injected"),)


def test_read_rdma_netdevs_without_rdma_is_empty(tmp_path: Path) -> None:
    sys = SysfsReader(tmp_path)
    issues = Issues(sys)
    assert read_rdma_netdevs(sys, issues) == {}
    assert issues.freeze() == ()


def test_sampler_without_rdma_netdevs_or_include_has_no_data(tmp_path: Path) -> None:
    with pytest.raises(NoData):
        NetdevSampler(SysfsReader(tmp_path)).sample()


def test_sampler_on_a_real_tree_without_netdev_links_has_no_data() -> None:
    # prometheus/procfs's fixture: mlx4, mlx5 and hfi1 devices, but no gid_attrs/ndevs and
    # no device/net directories, as sysfs snapshots taken without them look
    sys = SysfsReader(FIXTURES / "procfs" / "sys")
    issues = Issues(sys)
    assert read_rdma_netdevs(sys, issues) == {}
    assert issues.freeze() == ()
    with pytest.raises(NoData):
        NetdevSampler(sys).sample()
