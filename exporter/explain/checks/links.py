"""The fabric's checks: a port's and its cable's errors (read at both ends), its rate
against its own, its share of its rail peers' data, congestion and drops."""

from __future__ import annotations

from exporter.explain.checks.check import Check
from exporter.explain.checks.promql import PORT, ib_increase, ib_rate, peer_rate

#: the share of a port's samples below its rate by the agent's own judgement (0 for a port never
#: below): also asked by :mod:`exporter.explain.shared`, which derives it from shared reads
PORT_RATE_DEGRADED = (
    "max by (instance, device, port) "
    "(sum_over_time(fabricscope_infiniband_port_rate_degraded{{{sel}}}[{d}])) "
    "/ on (instance, device, port) max by (instance, device, port) "
    "(count_over_time(fabricscope_infiniband_port_up{{{sel}}}[{d}])) "
    "or 0 * max by (instance, device, port) "
    "(last_over_time(fabricscope_infiniband_port_up{{{sel}}}[{d}]))"
)

LINK_CHECKS: tuple[Check, ...] = (
    # --- links ------------------------------------------------------------------------
    Check(
        "symbol_errors",
        "ib_link",
        "symbol errors",
        ib_rate("symbol_errors"),
        "rate",
        1 / 60,
        "port",
        PORT,
        unit="/min",
        scale=60.0,
    ),
    Check(
        "receive_errors",
        "ib_link",
        "port receive errors",
        ib_rate("receive_errors"),
        "rate",
        1 / 60,
        "port",
        PORT,
        unit="/min",
        scale=60.0,
    ),
    Check(
        "remote_physical_errors",
        "ib_link",
        "remote physical errors",
        ib_rate("receive_remote_physical_errors"),
        "rate",
        1 / 60,
        "port",
        PORT,
        unit="/min",
        scale=60.0,
    ),
    Check(
        "link_error_recovery",
        "ib_link",
        "link error recoveries",
        ib_increase("link_error_recovery"),
        "events",
        1.0,
        "port",
        PORT,
        unit=" events",
    ),
    Check(
        "link_downed",
        "ib_link",
        "link down events",
        ib_increase("link_downed"),
        "events",
        1.0,
        "port",
        PORT,
        unit=" events",
    ),
    Check(
        "local_link_integrity",
        "ib_link",
        "local link integrity errors",
        ib_increase("local_link_integrity_errors"),
        "events",
        1.0,
        "port",
        PORT,
        unit=" events",
    ),
    Check(
        "port_up",
        "ib_link",
        "port up (share of time)",
        "avg_over_time(fabricscope_infiniband_port_up{{{sel}}}[{d}])",
        "drop",
        0.05,
        "port",
        PORT,
        axis="share of time up",
    ),
    # --- the switch end of each cable (the ibpeer sampler): errors in what this port sends
    Check(
        "peer_symbol_errors",
        "ib_link",
        "symbol errors at the switch end of the cable",
        peer_rate("symbol_errors"),
        "rate",
        1 / 60,
        "port",
        PORT,
        unit="/min",
        scale=60.0,
    ),
    Check(
        "peer_receive_errors",
        "ib_link",
        "receive errors at the switch end of the cable",
        peer_rate("receive_errors"),
        "rate",
        1 / 60,
        "port",
        PORT,
        unit="/min",
        scale=60.0,
    ),
    Check(
        "peer_transmit_discards",
        "drops",
        "packets the switch discarded instead of sending down the cable",
        peer_rate("transmit_discards"),
        "rate",
        1 / 60,
        "port",
        PORT,
        unit="/min",
        scale=60.0,
    ),
    # --- capacity: up, but slower ------------------------------------------------------
    Check(
        "port_rate",
        "port_rate",
        "port rate",
        "avg_over_time(fabricscope_infiniband_port_rate_bytes_per_second{{{sel}}}[{d}])",
        "drop",
        0.125,
        "port",
        PORT,
        unit=" Gb/s",
        scale=8e-9,
    ),
    Check(
        "port_width",
        "port_rate",
        "link width (lanes)",
        "avg_over_time(fabricscope_infiniband_port_link_width{{{sel}}}[{d}])",
        "drop",
        0.125,
        "port",
        PORT,
        axis="lanes",
    ),
    Check(
        "port_lane_speed",
        "port_rate",
        "lane speed",
        # the rate over the width: the lane speed at every --collector.detail (the exported
        # lane speed series is folded below full)
        "avg_over_time(fabricscope_infiniband_port_rate_bytes_per_second{{{sel}}}[{d}]) / "
        "avg_over_time(fabricscope_infiniband_port_link_width{{{sel}}}[{d}])",
        "drop",
        0.125,
        "port",
        PORT,
        unit=" Gb/s",
        scale=8e-9,
    ),
    Check(
        "port_rate_degraded",
        "port_rate",
        "below its rate by the agent's own judgement (history, peers or expected; share of time)",
        # below full detail a comparison is exported only while the port runs below it: the
        # samples it was below, over the port's samples (0 for a port never below)
        PORT_RATE_DEGRADED,
        "rise",
        0.25,
        "port",
        PORT,
        axis="share of time",
    ),
    Check(
        "rail_share",
        "rail_share",
        "data moved, as a share of the node's median port carrying data (tx + rx)",
        # the median over the node's ports ({peers}: the node, also when one port's figure
        # is printed) that moved data: a port standing DOWN moves none and does not count
        "(rate(fabricscope_infiniband_port_transmitted_bytes_total{{{sel}}}[{d}]) + "
        "rate(fabricscope_infiniband_port_received_bytes_total{{{sel}}}[{d}])) "
        "/ on (instance) group_left quantile by (instance) (0.5, "
        "(rate(fabricscope_infiniband_port_transmitted_bytes_total{{{peers}}}[{d}]) + "
        "rate(fabricscope_infiniband_port_received_bytes_total{{{peers}}}[{d}])) > 0)",
        "drop",
        0.25,
        "port",
        PORT,
        counts=False,
        axis="share of the node's median port",
    ),
    # --- congestion -------------------------------------------------------------------
    Check(
        "xmit_wait_share",
        "ib_congestion",
        "xmit_wait share (wait ticks / (wait ticks + 4-byte words sent))",
        "rate(fabricscope_infiniband_port_transmit_wait_total{{{sel}}}[{d}]) / "
        "(rate(fabricscope_infiniband_port_transmit_wait_total{{{sel}}}[{d}]) + "
        "rate(fabricscope_infiniband_port_transmitted_bytes_total{{{sel}}}[{d}]) / 4)",
        "rise",
        0.05,
        "port",
        PORT,
        axis="share of ticks waiting",
    ),
    Check(
        "pfc_rx_share",
        "roce_congestion",
        "time paused by received PFC (all priorities)",
        "sum by (instance, netdev) (rate(fabricscope_netdev_pfc_pause_duration_seconds_total"
        '{{{sel},direction="rx"}}[{d}]))',
        "rise",
        0.01,
        "netdev",
        ("netdev",),
        axis="share of time paused",
    ),
    Check(
        "pfc_tx_share",
        "roce_congestion",
        "time pausing peers by sent PFC (all priorities)",
        "sum by (instance, netdev) (rate(fabricscope_netdev_pfc_pause_duration_seconds_total"
        '{{{sel},direction="tx"}}[{d}]))',
        "rise",
        0.01,
        "netdev",
        ("netdev",),
        axis="share of time paused",
    ),
    Check(
        "cnp_sent",
        "roce_congestion",
        "CNPs sent (this port saw ECN marks)",
        ib_rate("cnp_sent"),
        "rate",
        100.0,
        "port",
        PORT,
        unit="/s",
    ),
    Check(
        "cnp_handled",
        "roce_congestion",
        "CNPs handled (this port was told to slow down)",
        ib_rate("cnp_handled"),
        "rate",
        100.0,
        "port",
        PORT,
        unit="/s",
    ),
    Check(
        "ecn_marked",
        "roce_congestion",
        "ECN-marked RoCE packets received",
        ib_rate("ecn_marked_roce_packets"),
        "rate",
        100.0,
        "port",
        PORT,
        unit="/s",
    ),
    # --- drops ------------------------------------------------------------------------
    Check(
        "transmit_discards",
        "drops",
        "transmit discards",
        ib_rate("transmit_discards"),
        "rate",
        1.0,
        "port",
        PORT,
        unit="/s",
    ),
    Check(
        "out_of_sequence",
        "drops",
        "out-of-sequence packets",
        ib_rate("out_of_sequence"),
        "rate",
        10.0,
        "port",
        PORT,
        unit="/s",
    ),
    Check(
        "local_ack_timeout",
        "drops",
        "local ACK timeouts (retransmissions)",
        ib_rate("local_ack_timeout_errors"),
        "rate",
        1.0,
        "port",
        PORT,
        unit="/s",
    ),
    Check(
        "phy_discards",
        "drops",
        "physical port discards (rx + tx)",
        "sum by (instance, netdev) (rate(fabricscope_netdev_phy_discarded_packets_total"
        "{{{sel}}}[{d}]))",
        "rate",
        1.0,
        "netdev",
        ("netdev",),
        unit="/s",
    ),
    Check(
        "netdev_dropped",
        "drops",
        "interface drops (rx + tx)",
        "sum by (instance, netdev) (rate(fabricscope_netdev_dropped_packets_total{{{sel}}}[{d}]))",
        "rate",
        10.0,
        "netdev",
        ("netdev",),
        unit="/s",
    ),
)
