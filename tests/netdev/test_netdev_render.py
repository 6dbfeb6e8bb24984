"""Rendering of netdev snapshots into metric families, with exact values."""

from __future__ import annotations

from dataclasses import replace

from agent.netdev.stats import (
    EthtoolStat,
    EthtoolStats,
    LinkStats64,
    NetdevSample,
    NetdevSnapshot,
    PriorityStats,
    RdmaPort,
)
from exporter.metrics import netdev
from exporter.metrics.catalog import all_specs
from exporter.metrics.exposition import render_text
from exporter.metrics.spec import Detail, Families

Series = dict[tuple[str, tuple[str, ...]], float]


def rendered(snap: NetdevSnapshot) -> Series:
    out = Families()
    netdev.render(snap, out)
    return {
        (spec.name, labels): value for spec, samples in out.items() for labels, value in samples
    }


ROCE = NetdevSample(
    name="ens1f0np0",
    ifindex=4,
    operstate="up",
    carrier=1,
    carrier_changes=6,
    mtu_bytes=4200,
    speed_bytes_per_second=50_000_000_000,
    driver="mlx5_core",
    stats=LinkStats64(
        rx_packets=1000,
        tx_packets=2000,
        rx_bytes=300_000,
        tx_bytes=400_000,
        rx_errors=7,
        tx_errors=1,
        rx_dropped=3,
        tx_dropped=0,
        multicast=12,
        collisions=0,
        rx_length_errors=1,
        rx_over_errors=0,
        rx_crc_errors=5,
        rx_frame_errors=0,
        rx_fifo_errors=0,
        rx_missed_errors=1,
        tx_aborted_errors=0,
        tx_carrier_errors=1,
        tx_fifo_errors=0,
        tx_heartbeat_errors=0,
        tx_window_errors=0,
        rx_compressed=0,
        tx_compressed=0,
    ),
    ethtool=EthtoolStats(
        priorities=(
            PriorityStats(
                priority=3,
                rx_pause_frames=11,
                tx_pause_frames=12,
                rx_pause_duration_seconds=2.5,
                tx_pause_duration_seconds=0.25,
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
        counters=(EthtoolStat("rx_corrected_bits_phy", 1234),),
        gauges=(EthtoolStat("peer_ifindex", 9),),
    ),
    rdma=(RdmaPort("mlx5_0", 1),),
)

# an interface whose link attributes netlink did not report, without ethtool statistics
BARE = NetdevSample(name="ib0", ifindex=5)


def test_render_exact_series() -> None:
    n = "ens1f0np0"
    operstates: Series = {
        ("fabricscope_netdev_operstate", (n, s)): float(s == "up")
        for s in ("unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up")
    }
    errors_by_reason: Series = {
        ("fabricscope_netdev_errors_by_reason_total", (n, d, r)): v
        for d, r, v in (
            ("rx", "length", 1), ("rx", "over", 0), ("rx", "crc", 5), ("rx", "frame", 0),
            ("rx", "fifo", 0), ("rx", "missed", 1), ("tx", "aborted", 0), ("tx", "carrier", 1),
            ("tx", "fifo", 0), ("tx", "heartbeat", 0), ("tx", "window", 0),
        )
    }  # fmt: skip
    expected: Series = {
        ("fabricscope_netdev_info", (n, "mlx5_core", "4200", "50000000000")): 1,
        ("fabricscope_netdev_info", ("ib0", "", "", "")): 1,
        **operstates,
        ("fabricscope_netdev_carrier", (n,)): 1,
        ("fabricscope_netdev_carrier_changes_total", (n,)): 6,
        ("fabricscope_netdev_mtu_bytes", (n,)): 4200,
        ("fabricscope_netdev_speed_bytes_per_second", (n,)): 50_000_000_000,
        ("fabricscope_netdev_bytes_total", (n, "rx")): 300_000,
        ("fabricscope_netdev_bytes_total", (n, "tx")): 400_000,
        ("fabricscope_netdev_packets_total", (n, "rx")): 1000,
        ("fabricscope_netdev_packets_total", (n, "tx")): 2000,
        ("fabricscope_netdev_errors_total", (n, "rx")): 7,
        ("fabricscope_netdev_errors_total", (n, "tx")): 1,
        ("fabricscope_netdev_dropped_packets_total", (n, "rx")): 3,
        ("fabricscope_netdev_dropped_packets_total", (n, "tx")): 0,
        ("fabricscope_netdev_multicast_packets_total", (n,)): 12,
        **errors_by_reason,
        ("fabricscope_netdev_pfc_pause_frames_total", (n, "rx", "3")): 11,
        ("fabricscope_netdev_pfc_pause_frames_total", (n, "tx", "3")): 12,
        ("fabricscope_netdev_pfc_pause_duration_seconds_total", (n, "rx", "3")): 2.5,
        ("fabricscope_netdev_pfc_pause_duration_seconds_total", (n, "tx", "3")): 0.25,
        ("fabricscope_netdev_priority_discarded_packets_total", (n, "3", "no_buffer")): 13,
        ("fabricscope_netdev_priority_discarded_packets_total", (n, "3", "host_buffer")): 14,
        ("fabricscope_netdev_priority_discarded_packets_total", (n, "3", "host_congestion")): 15,
        ("fabricscope_netdev_ecn_marked_packets_total", (n, "3")): 16,
        ("fabricscope_netdev_pause_frames_total", (n, "rx")): 21,
        ("fabricscope_netdev_pause_frames_total", (n, "tx")): 22,
        ("fabricscope_netdev_pause_storm_warning_events_total", (n,)): 23,
        ("fabricscope_netdev_pause_storm_error_events_total", (n,)): 24,
        ("fabricscope_netdev_phy_discarded_packets_total", (n, "rx")): 25,
        ("fabricscope_netdev_phy_discarded_packets_total", (n, "tx")): 26,
        ("fabricscope_netdev_out_of_buffer_drops_total", (n,)): 27,
        ("fabricscope_netdev_pcie_stalled_reads_ratio", (n,)): 0.4,
        ("fabricscope_netdev_pcie_stalled_writes_ratio", (n,)): 0.05,
        ("fabricscope_netdev_ethtool_statistic_total", (n, "rx_corrected_bits_phy")): 1234,
        ("fabricscope_netdev_ethtool_statistic", (n, "peer_ifindex")): 9,
    }
    assert rendered(NetdevSnapshot(netdevs=(ROCE, BARE))) == expected


def rendered_at(snap: NetdevSnapshot, detail: Detail) -> Series:
    out = Families(detail)
    netdev.render(snap, out)
    return {
        (spec.name, labels): value for spec, samples in out.items() for labels, value in samples
    }


def test_below_full_every_nonzero_error_counter_stays_and_zeros_and_constants_fold() -> None:
    """At the default detail: zero error counters no rule reads are left out, every non-zero
    one is exported; MTU and speed are the info series' labels, not series of their own."""
    n = "ens1f0np0"
    zero_stats = replace(ROCE.stats, rx_errors=0, tx_errors=4) if ROCE.stats else None
    assert ROCE.ethtool is not None
    ethtool = replace(
        ROCE.ethtool,
        pause_storm_warning_events=0,
        counters=(
            EthtoolStat("rx_corrected_bits_phy", 1234),
            EthtoolStat("rx_symbol_err_phy", 0),
            EthtoolStat("link_down_events_phy", 0),
            EthtoolStat("rx_crc_errors_phy", 2),
            EthtoolStat("rx_vport_rdma_unicast_bytes", 0),
        ),
        priorities=tuple(replace(p, rx_discarded_host_buffer=0) for p in ROCE.ethtool.priorities),
    )
    sample = replace(ROCE, stats=zero_stats, ethtool=ethtool)
    got = rendered_at(NetdevSnapshot(netdevs=(sample,)), "default")
    stat = "fabricscope_netdev_ethtool_statistic_total"
    assert got[(stat, (n, "rx_corrected_bits_phy"))] == 1234
    assert got[(stat, (n, "rx_crc_errors_phy"))] == 2
    assert not {k for k in got if k[0] == stat} - {
        (stat, (n, "rx_corrected_bits_phy")),
        (stat, (n, "rx_crc_errors_phy")),
    }
    assert ("fabricscope_netdev_errors_total", (n, "rx")) not in got
    assert got[("fabricscope_netdev_errors_total", (n, "tx"))] == 4
    assert ("fabricscope_netdev_pause_storm_warning_events_total", (n,)) not in got
    assert got[("fabricscope_netdev_pause_storm_error_events_total", (n,))] == 24
    discards = "fabricscope_netdev_priority_discarded_packets_total"
    assert (discards, (n, "3", "host_buffer")) not in got
    assert got[(discards, (n, "3", "no_buffer"))] == 13
    # what rules read stays even at zero
    assert got[("fabricscope_netdev_dropped_packets_total", (n, "tx"))] == 0
    assert got[("fabricscope_netdev_info", (n, "mlx5_core", "4200", "50000000000"))] == 1
    assert not [
        k for k in got if k[0].startswith(("fabricscope_netdev_mtu", "fabricscope_netdev_speed"))
    ]
    full = rendered_at(NetdevSnapshot(netdevs=(sample,)), "full")
    assert full[(stat, (n, "rx_symbol_err_phy"))] == 0
    assert full[("fabricscope_netdev_errors_total", (n, "rx"))] == 0
    assert full[("fabricscope_netdev_mtu_bytes", (n,))] == 4200


def test_render_empty_snapshot_has_no_series() -> None:
    assert rendered(NetdevSnapshot()) == {}


def test_text_exposition_of_a_netdev() -> None:
    text = render_text(_families(NetdevSnapshot(netdevs=(ROCE,)))).decode()
    assert "# TYPE fabricscope_netdev_pfc_pause_frames_total counter\n" in text
    assert (
        'fabricscope_netdev_pfc_pause_frames_total{direction="tx",netdev="ens1f0np0",queue="3"}'
        " 12.0\n" in text
    )
    assert 'fabricscope_netdev_speed_bytes_per_second{netdev="ens1f0np0"} 5e+10\n' in text
    assert 'fabricscope_netdev_operstate{netdev="ens1f0np0",operstate="down"} 0.0\n' in text


def test_every_netdev_spec_is_in_the_catalog_once() -> None:
    names = [s.name for s in all_specs()]
    for spec in netdev.SPECS:
        assert names.count(spec.name) == 1
        assert spec.name.startswith("fabricscope_netdev_")


def _families(snap: NetdevSnapshot) -> Families:
    out = Families()
    netdev.render(snap, out)
    return out
