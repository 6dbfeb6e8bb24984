"""Metric specs and rendering for the infiniband sampler.

Well-known counters get a dedicated, well-named metric in base units; every other counter
file (an unknown hw_counter, a driver-specific one, or the 32-bit twin of a 64-bit
``counters_ext`` counter) is still exported through ``fabricscope_infiniband_port_generic_total``
with ``source`` and ``counter`` labels, so nothing is dropped because a list lacked its name.
(promtool's lint rejects metric names containing "counter", hence "generic" and
"pma_saturated".)
"""

from __future__ import annotations

from agent.infiniband.capacity import rate_checks
from agent.infiniband.parse import lane_speed_bytes_per_second
from agent.infiniband.records import InfinibandSnapshot, PortCounter
from exporter.metrics.spec import Detail, Families, MetricSpec

_DP = ("device", "port")
_P = "fabricscope_infiniband_port_"

DEVICE_INFO = MetricSpec(
    "fabricscope_infiniband_device_info",
    "gauge",
    "RDMA device identity from /sys/class/infiniband/<device>; always 1. Empty label values "
    "are attributes the device does not expose.",
    (
        "device",
        "fw_ver",
        "board_id",
        "hca_type",
        "node_guid",
        "node_type",
        "pci_bus_id",
        "numa_node",
    ),
)
PORT_INFO = MetricSpec(
    _P + "info",
    "gauge",
    "RDMA port identity; always 1. lid is decimal (empty when absent); netdev is the port's "
    "network interface (empty when it has none).",
    ("device", "port", "link_layer", "lid", "netdev"),
)
#: below full, what an up port's state and physical state are: fabricscope_infiniband_port_up
#: 1 says both (ACTIVE, LinkUp)
_UP_FOLD = (
    "Below full, only on ports that are not up: fabricscope_infiniband_port_up 1 means state "
    "ACTIVE and physical state LinkUp."
)
PORT_STATE = MetricSpec(
    _P + "state",
    "gauge",
    "Logical port state as the kernel numbers it: 0 NOP, 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, "
    "5 ACTIVE_DEFER.",
    _DP,
    fold=_UP_FOLD,
)
PORT_PHYSICAL_STATE = MetricSpec(
    _P + "physical_state",
    "gauge",
    "Physical port state as the kernel numbers it: 1 Sleep, 2 Polling, 3 Disabled, "
    "4 PortConfigurationTraining, 5 LinkUp, 6 LinkErrorRecovery, 7 Phy Test.",
    _DP,
    fold=_UP_FOLD,
)
PORT_UP = MetricSpec(
    _P + "up",
    "gauge",
    "1 when the port is ACTIVE and its physical state is LinkUp, else 0.",
    _DP,
)
PORT_RATE = MetricSpec(
    _P + "rate_bytes_per_second",
    "gauge",
    "Negotiated port signalling rate (sysfs rate, Gb/s converted to bytes per second).",
    _DP,
    "bytes_per_second",
)
PORT_LINK_WIDTH = MetricSpec(
    _P + "link_width",
    "gauge",
    "Active link width in lanes (the 4 of the rate's 4X NDR); the rate divided by it is the "
    "lane speed. Absent when the rate names no width.",
    _DP,
)
PORT_LANE_SPEED = MetricSpec(
    _P + "lane_speed_bytes_per_second",
    "gauge",
    "Signalling rate of one lane, from the speed the rate names (SDR 2.5, DDR 5, QDR and "
    "FDR10 10, FDR 14, EDR 25, HDR 50, NDR 100, XDR 200 Gb/s, as the kernel counts them; "
    "RoCE ports report their Ethernet speed in these terms: 100GbE reads 4X EDR). Absent "
    "when the rate names no speed.",
    _DP,
    "bytes_per_second",
    fold="Below full, left out: it is the rate divided by the link width (dashboards and "
    "explain compute it so).",
)
PORT_RATE_DEGRADED = MetricSpec(
    _P + "rate_degraded",
    "gauge",
    "1 when an ACTIVE port runs below the reference of one comparison, else 0; comparison "
    "is history (its own fastest rate since the agent started), peers (the rate a majority "
    "of the node's ports of the same HCA model and link layer run at, with at least 3 such "
    "ports) or expected (--infiniband.expected-rate). Absent for ports not ACTIVE and for a "
    "comparison that cannot be made (no peers, no majority, no expectation configured).",
    ("device", "port", "comparison"),
    fold="Below full, only comparisons a port runs below (value 1).",
)
PORT_SM_LID = MetricSpec(
    _P + "sm_lid",
    "gauge",
    "LID of the subnet manager the port reports; a change means the SM moved.",
    _DP,
    detail="default",
    fold="Below full, left out on Ethernet (RoCE) ports, which have no subnet manager.",
)
HW_COUNTERS_LIFESPAN = MetricSpec(
    _P + "hw_counters_lifespan_seconds",
    "gauge",
    "How long the driver caches hw_counters values between hardware reads "
    "(hw_counters/lifespan, milliseconds converted to seconds); a setting, not a counter.",
    _DP,
    "seconds",
    detail="full",
)
COUNTER_SATURATED = MetricSpec(
    _P + "pma_saturated",
    "gauge",
    "1 when a PMA counter narrower than 64 bits sat at its maximum when read, where the "
    "hardware stops it instead of wrapping: what it missed since the previous read is lost, "
    "and a rate read from it is not evidence (0 while it stays there). Widths from the "
    "kernel's PORT_PMA_ATTR table; a counter read 64-bit from PortCountersExtended never "
    "appears here, and one the agent clears near its maximum "
    "(--infiniband.reset-saturated) only when it filled its width within one pass.",
    ("device", "port", "counter"),
    fold="Below full, only the saturated counters (value 1), not a 0 for each other counter: "
    "fabricscope_infiniband_port_pma_saturated_counters counts them per port.",
)
SATURATED_SINCE = MetricSpec(
    _P + "pma_saturated_since_timestamp_seconds",
    "gauge",
    "For each PMA counter fabricscope_infiniband_port_pma_saturated reports at its maximum: "
    "the Unix time since when every pass of this agent has found it there (at the latest, "
    "the agent's first pass after a restart). Its increases since then are unknown.",
    ("device", "port", "counter"),
    "seconds",
)
SATURATED_COUNTERS = MetricSpec(
    _P + "pma_saturated_counters",
    "gauge",
    "PMA counters of known width narrower than 64 bits sitting at their maximum on this "
    "port (0 when none): the per-port fold of fabricscope_infiniband_port_pma_saturated.",
    _DP,
    fold="Below full, only ports with a saturated counter (a 0 is left out).",
)
PMA_SOURCE = MetricSpec(
    _P + "pma_source_info",
    "gauge",
    "Where an InfiniBand port's error counters and PortXmitWait came from; always 1. source "
    "is sysfs (the kernel's counters/ files: 4 to 16 bits, PortXmitWait 32), "
    "perfquery_extended (PortCountersExtended read with perfquery at the port's LID: 64 "
    "bits) or sysfs_reset (the kernel's files, cleared near their maximum by the agent with "
    "perfquery and counted on, --infiniband.reset-saturated). reason says why they are not "
    "64-bit, empty when they are: off (--infiniband.perfquery=off), no_lid (not ACTIVE, or "
    "no LID yet), no_tool (no perfquery), no_umad (no /dev/infiniband/umad device open to "
    "the agent), not_advertised (the PMA's ClassPortInfo does not offer them), failed or "
    "timeout (perfquery did not answer: see fabricscope_sampler_read_errors and the log).",
    ("device", "port", "source", "reason"),
    detail="default",
)
PMA_RESETS = MetricSpec(
    _P + "pma_resets_total",
    "counter",
    "Times the agent cleared PMA counters of this port near their maximum "
    "(--infiniband.reset-saturated; every other reader of them saw them drop to 0); absent "
    "when it clears none.",
    _DP,
    detail="default",
)
GENERIC_COUNTER = MetricSpec(
    _P + "generic_total",
    "counter",
    "A port counter file with no dedicated fabricscope_infiniband_port_* metric (unknown to "
    "fabricscope, driver-specific, or the 32-bit twin of a 64-bit counters_ext counter), as "
    "the kernel counts it, except data counters which are converted to bytes.",
    ("device", "port", "source", "counter"),
    detail="default",
)

#: hw_counters that count RoCE (Ethernet link layer) events only: always 0 on an InfiniBand
#: port, so levels below full leave them out there
ROCE_ONLY = frozenset(
    {
        "np_cnp_sent",
        "rp_cnp_handled",
        "rp_cnp_ignored",
        "np_ecn_marked_roce_packets",
        "roce_adp_retrans",
        "roce_adp_retrans_to",
        "roce_slow_restart",
        "roce_slow_restart_cnps",
        "roce_slow_restart_trans",
        "rx_icrc_encapsulated",
    }
)
_ROCE_FOLD = "Below full, left out on InfiniBand ports (it counts RoCE events only)."


def _counter(
    what: str, help_: str, unit: str = "", detail: Detail = "minimal", fold: str = ""
) -> MetricSpec:
    return MetricSpec(_P + what + "_total", "counter", help_, _DP, unit, detail, fold)


#: where a PMA counter comes from and how wide it is, for the help of each
_SOURCE_NOTE = "64-bit where fabricscope_infiniband_port_pma_source_info says perfquery_extended"


def _pma(field: str, file: str, width: int) -> str:
    """`` (FIELD: counters/FILE, WIDTH-bit; 64-bit where ...)``: a PMA counter's origin."""
    return f"{field}: counters/{file}, {width}-bit in sysfs; {_SOURCE_NOTE}"


_DATA_NOTE = (
    "64-bit in sysfs where the kernel reads PortCountersExtended (the counters/unicast_* "
    "files are there), else 32-bit and replaced by perfquery's 64-bit one where it can run"
)
#: Below full, an error, discard, retry or timeout counter that is 0 is left out: folding
#: drops zeros, never an error
_NONZERO_FOLD = "Below full, exported only when non-zero (a 0 is left out, never an error)."
_ERROR_DEFAULT: dict[str, Detail] = {}


def _error(
    what: str, help_: str, detail: Detail = "default", fold: str = _NONZERO_FOLD
) -> MetricSpec:
    """An error, discard, retry or timeout counter: at ``default`` exported when non-zero."""
    spec = _counter(what, help_, detail=detail, fold=fold)
    _ERROR_DEFAULT[spec.name] = detail
    return spec


TRANSMITTED_BYTES = _counter(
    "transmitted_bytes",
    f"Data octets transmitted on all VLs (PortXmitData: counters/port_xmit_data, {_DATA_NOTE}; "
    "the kernel's 4-byte words, or hfi1 8-byte flits, converted to bytes).",
    "bytes",
)
RECEIVED_BYTES = _counter(
    "received_bytes",
    f"Data octets received on all VLs (PortRcvData: counters/port_rcv_data, {_DATA_NOTE}; the "
    "kernel's 4-byte words, or hfi1 8-byte flits, converted to bytes).",
    "bytes",
)

#: (source, counter file) -> dedicated metric. Where two files feed one metric, the later
#: source in PREFERENCE wins (counters_ext holds the 64-bit values of mlx4 on old kernels).
_KNOWN: dict[tuple[str, str], MetricSpec] = {}
PREFERENCE = ("hw_counters", "counters", "counters_ext")


def _known(spec: MetricSpec, *keys: tuple[str, str]) -> MetricSpec:
    for key in keys:
        _KNOWN[key] = spec
    return spec


_C = "counters"
_X = "counters_ext"
_H = "hw_counters"

_known(TRANSMITTED_BYTES, (_C, "port_xmit_data"), (_X, "port_xmit_data_64"))
_known(RECEIVED_BYTES, (_C, "port_rcv_data"), (_X, "port_rcv_data_64"))
_PMA_SPECS = (
    TRANSMITTED_BYTES,
    RECEIVED_BYTES,
    _known(
        _counter(
            "transmitted_packets",
            f"Packets transmitted on all VLs (PortXmitPkts: counters/port_xmit_packets, "
            f"{_DATA_NOTE}).",
            detail="default",
        ),
        (_C, "port_xmit_packets"),
        (_X, "port_xmit_packets_64"),
    ),
    _known(
        _counter(
            "received_packets",
            f"Packets received on all VLs, errors included (PortRcvPkts: "
            f"counters/port_rcv_packets, {_DATA_NOTE}).",
            detail="default",
        ),
        (_C, "port_rcv_packets"),
        (_X, "port_rcv_packets_64"),
    ),
    _known(
        _counter(
            "transmitted_unicast_packets",
            "Unicast packets transmitted (PortUnicastXmitPkts: counters/unicast_xmit_packets, "
            "64-bit, PortCountersExtended only).",
            detail="full",
        ),
        (_C, "unicast_xmit_packets"),
        (_X, "port_unicast_xmit_packets"),
    ),
    _known(
        _counter(
            "received_unicast_packets",
            "Unicast packets received (PortUnicastRcvPkts: counters/unicast_rcv_packets, "
            "64-bit, PortCountersExtended only).",
            detail="full",
        ),
        (_C, "unicast_rcv_packets"),
        (_X, "port_unicast_rcv_packets"),
    ),
    _known(
        _counter(
            "transmitted_multicast_packets",
            "Multicast packets transmitted (PortMulticastXmitPkts: "
            "counters/multicast_xmit_packets, 64-bit, PortCountersExtended only).",
            detail="full",
        ),
        (_C, "multicast_xmit_packets"),
        (_X, "port_multicast_xmit_packets"),
    ),
    _known(
        _counter(
            "received_multicast_packets",
            "Multicast packets received (PortMulticastRcvPkts: counters/multicast_rcv_packets, "
            "64-bit, PortCountersExtended only).",
            detail="full",
        ),
        (_C, "multicast_rcv_packets"),
        (_X, "port_multicast_rcv_packets"),
    ),
    _known(
        _counter(
            "symbol_errors",
            "Minor link errors detected on one or more lanes ("
            + _pma("SymbolErrorCounter", "symbol_error", 16)
            + ").",
        ),
        (_C, "symbol_error"),
    ),
    _known(
        _counter(
            "link_error_recovery",
            "Times the link completed error recovery successfully ("
            + _pma("LinkErrorRecoveryCounter", "link_error_recovery", 8)
            + ").",
        ),
        (_C, "link_error_recovery"),
    ),
    _known(
        _counter(
            "link_downed",
            "Times the link failed error recovery and went down ("
            + _pma("LinkDownedCounter", "link_downed", 8)
            + ").",
        ),
        (_C, "link_downed"),
    ),
    _known(
        _counter(
            "receive_errors",
            "Received packets containing an error ("
            + _pma("PortRcvErrors", "port_rcv_errors", 16)
            + ").",
        ),
        (_C, "port_rcv_errors"),
    ),
    _known(
        _counter(
            "receive_remote_physical_errors",
            "Received packets marked with the EBP delimiter ("
            + _pma("PortRcvRemotePhysicalErrors", "port_rcv_remote_physical_errors", 16)
            + ").",
        ),
        (_C, "port_rcv_remote_physical_errors"),
    ),
    _known(
        _error(
            "receive_switch_relay_errors",
            "Received packets discarded because they could not be forwarded, a switch's "
            "counter, 0 on a host adapter ("
            + _pma("PortRcvSwitchRelayErrors", "port_rcv_switch_relay_errors", 16)
            + ").",
        ),
        (_C, "port_rcv_switch_relay_errors"),
    ),
    _known(
        _error(
            "receive_constraint_errors",
            "Received packets discarded by constraints (partition key, IP version: "
            + _pma("PortRcvConstraintErrors", "port_rcv_constraint_errors", 8)
            + ").",
        ),
        (_C, "port_rcv_constraint_errors"),
    ),
    _known(
        _error(
            "receive_discards",
            "Inbound packets discarded because the port was down or congested (a "
            "counters/port_rcv_discards file some drivers add).",
        ),
        (_C, "port_rcv_discards"),
    ),
    _known(
        _counter(
            "transmit_discards",
            "Outbound packets discarded because the port was down or congested ("
            + _pma("PortXmitDiscards", "port_xmit_discards", 16)
            + ").",
        ),
        (_C, "port_xmit_discards"),
    ),
    _known(
        _error(
            "transmit_constraint_errors",
            "Packets not transmitted because of constraints (partition key, IP version: "
            + _pma("PortXmitConstraintErrors", "port_xmit_constraint_errors", 8)
            + ").",
        ),
        (_C, "port_xmit_constraint_errors"),
    ),
    _known(
        _counter(
            "transmit_wait",
            "Ticks during which the port had data to send but sent none, a tick count, not "
            "seconds ("
            + _pma("PortXmitWait", "port_xmit_wait", 32)
            + ": a congested NDR port fills 32 bits within seconds).",
        ),
        (_C, "port_xmit_wait"),
    ),
    _known(
        _counter(
            "local_link_integrity_errors",
            "Times local physical errors exceeded the threshold ("
            + _pma("LocalLinkIntegrityErrors", "local_link_integrity_errors", 4)
            + ": saturates at 15).",
        ),
        (_C, "local_link_integrity_errors"),
    ),
    _known(
        _error(
            "excessive_buffer_overrun_errors",
            "Times consecutive receive buffer overruns exceeded the threshold ("
            + _pma("ExcessiveBufferOverrunErrors", "excessive_buffer_overrun_errors", 4)
            + ": saturates at 15).",
        ),
        (_C, "excessive_buffer_overrun_errors"),
    ),
    _known(
        _error(
            "vl15_dropped",
            "Incoming VL15 (subnet management) packets dropped ("
            + _pma("VL15Dropped", "VL15_dropped", 16)
            + ").",
        ),
        (_C, "VL15_dropped"),
    ),
)

#: hw_counters with a dedicated name (mlx5 spelling; other drivers' hw_counters go generic)
_HW = (
    ("np_cnp_sent", "cnp_sent", "RoCE CNPs sent by this port as notification point."),
    ("rp_cnp_handled", "cnp_handled", "RoCE CNPs handled by this port as reaction point."),
    ("rp_cnp_ignored", "cnp_ignored", "RoCE CNPs received and ignored by the reaction point."),
    (
        "np_ecn_marked_roce_packets",
        "ecn_marked_roce_packets",
        "RoCE packets received with an ECN congestion mark.",
    ),
    (
        "out_of_buffer",
        "out_of_buffer",
        "Packets dropped because no receive WQE was posted (receive queue empty).",
    ),
    ("out_of_sequence", "out_of_sequence", "Out-of-sequence packets received."),
    ("packet_seq_err", "packet_sequence_errors", "Received NAKs for packet sequence errors."),
    (
        "local_ack_timeout_err",
        "local_ack_timeout_errors",
        "Times the sender's ACK timer expired (QP retransmission).",
    ),
    ("rnr_nak_retry_err", "rnr_nak_retry_errors", "Times the RNR NAK retry limit was exceeded."),
    (
        "implied_nak_seq_err",
        "implied_nak_sequence_errors",
        "Implied NAK sequence errors (a later response implied a lost one).",
    ),
    (
        "duplicate_request",
        "duplicate_requests",
        "Requests received again that had already been executed: the requester retried (its "
        "own retries are its local_ack_timeout_errors and packet_sequence_errors).",
    ),
    ("req_cqe_error", "requester_cqe_errors", "Requester completions with an error."),
    (
        "req_cqe_flush_error",
        "requester_cqe_flush_errors",
        "Requester completions flushed with an error.",
    ),
    (
        "req_remote_access_errors",
        "requester_remote_access_errors",
        "Requester remote access errors.",
    ),
    (
        "req_remote_invalid_request",
        "requester_remote_invalid_requests",
        "Requester remote invalid request errors.",
    ),
    ("resp_cqe_error", "responder_cqe_errors", "Responder completions with an error."),
    (
        "resp_cqe_flush_error",
        "responder_cqe_flush_errors",
        "Responder completions flushed with an error.",
    ),
    (
        "resp_local_length_error",
        "responder_local_length_errors",
        "Responder local length errors.",
    ),
    (
        "resp_remote_access_errors",
        "responder_remote_access_errors",
        "Responder remote access errors.",
    ),
    ("roce_adp_retrans", "roce_adaptive_retransmissions", "RoCE adaptive retransmissions."),
    (
        "roce_adp_retrans_to",
        "roce_adaptive_retransmission_timeouts",
        "RoCE adaptive retransmission timeouts.",
    ),
    ("roce_slow_restart", "roce_slow_restarts", "RoCE slow restarts."),
    ("roce_slow_restart_cnps", "roce_slow_restart_cnps", "CNPs sent during RoCE slow restart."),
    (
        "roce_slow_restart_trans",
        "roce_slow_restart_transitions",
        "Transitions into RoCE slow restart.",
    ),
    ("rx_read_requests", "received_read_requests", "RDMA read requests received."),
    ("rx_write_requests", "received_write_requests", "RDMA write requests received."),
    ("rx_atomic_requests", "received_atomic_requests", "RDMA atomic requests received."),
    ("rx_dct_connect", "received_dct_connects", "DCT connect requests received."),
    (
        "rx_icrc_encapsulated",
        "received_icrc_encapsulated_packets",
        "RoCE packets received with an ICRC error.",
    ),
)
#: the lowest --collector.detail level exporting each (explain, the dashboards and alerts
#: read the minimal ones; the transport errors that explain retransmissions are default)
_HW_DETAIL: dict[str, Detail] = {
    "np_cnp_sent": "minimal",
    "rp_cnp_handled": "minimal",
    "rp_cnp_ignored": "default",
    "np_ecn_marked_roce_packets": "minimal",
    "out_of_buffer": "default",
    "out_of_sequence": "minimal",
    "packet_seq_err": "default",
    "local_ack_timeout_err": "minimal",
    "rnr_nak_retry_err": "default",
    "implied_nak_seq_err": "default",
    "duplicate_request": "full",
    "req_cqe_error": "default",
    "req_cqe_flush_error": "default",
    "req_remote_access_errors": "default",
    "req_remote_invalid_request": "default",
    "resp_cqe_error": "default",
    "resp_cqe_flush_error": "default",
    "resp_local_length_error": "default",
    "resp_remote_access_errors": "default",
    "roce_adp_retrans": "default",
    "roce_adp_retrans_to": "default",
    "roce_slow_restart": "full",
    "roce_slow_restart_cnps": "full",
    "roce_slow_restart_trans": "full",
    "rx_read_requests": "full",
    "rx_write_requests": "full",
    "rx_atomic_requests": "full",
    "rx_dct_connect": "full",
    "rx_icrc_encapsulated": "default",
}
#: hw_counters that count errors, discards, retries or timeouts: below full they are
#: exported only when non-zero, never left out for their level (those at minimal always)
_HW_ERRORS = frozenset(
    {
        "out_of_buffer",
        "out_of_sequence",
        "packet_seq_err",
        "local_ack_timeout_err",
        "rnr_nak_retry_err",
        "implied_nak_seq_err",
        "req_cqe_error",
        "req_cqe_flush_error",
        "req_remote_access_errors",
        "req_remote_invalid_request",
        "resp_cqe_error",
        "resp_cqe_flush_error",
        "resp_local_length_error",
        "resp_remote_access_errors",
        "roce_adp_retrans",
        "roce_adp_retrans_to",
        "rx_icrc_encapsulated",
    }
)


def _hw_spec(name: str, what: str, help_: str) -> MetricSpec:
    detail = _HW_DETAIL[name]
    help_ = f"{help_.rstrip('.')} (hw_counters/{name}: a driver counter, no PMA width)."
    roce = name in ROCE_ONLY and detail != "full"
    if name in _HW_ERRORS and detail == "default":
        fold = (
            "Below full, left out on InfiniBand ports (it counts RoCE events only) and "
            "elsewhere exported only when non-zero."
            if roce
            else _NONZERO_FOLD
        )
        spec = _error(what, help_, detail, fold)
    else:
        spec = _counter(what, help_, detail=detail, fold=_ROCE_FOLD if roce else "")
    return _known(spec, (_H, name))


_HW_SPECS = tuple(_hw_spec(name, what, help_) for name, what, help_ in _HW)

SPECS: tuple[MetricSpec, ...] = (
    DEVICE_INFO,
    PORT_INFO,
    PORT_STATE,
    PORT_PHYSICAL_STATE,
    PORT_UP,
    PORT_RATE,
    PORT_LINK_WIDTH,
    PORT_LANE_SPEED,
    PORT_RATE_DEGRADED,
    PORT_SM_LID,
    HW_COUNTERS_LIFESPAN,
    COUNTER_SATURATED,
    SATURATED_SINCE,
    SATURATED_COUNTERS,
    PMA_SOURCE,
    PMA_RESETS,
    GENERIC_COUNTER,
    *_PMA_SPECS,
    *_HW_SPECS,
)


def dedicated_spec(source: str, name: str) -> MetricSpec | None:
    """The dedicated metric a counter file feeds, if any."""
    return _KNOWN.get((source, name))


def pma_specs() -> dict[str, MetricSpec]:
    """Counter file of ``counters/`` (the PMA's PortCounters) -> its dedicated metric: what
    the ibpeer sampler's neighbour counters are named after."""
    return {name: spec for (source, name), spec in sorted(_KNOWN.items()) if source == _C}


def split_counters(
    counters: tuple[PortCounter, ...],
) -> tuple[list[tuple[MetricSpec, PortCounter]], list[PortCounter]]:
    """Which counters render under a dedicated metric and which go generic.

    Where two files feed one metric, the one from the later source in ``PREFERENCE`` is
    chosen and the other goes generic, so every file is exported exactly once.
    """
    chosen: dict[str, tuple[MetricSpec, PortCounter]] = {}
    for c in counters:
        spec = dedicated_spec(c.source, c.name)
        if spec is None:
            continue
        held = chosen.get(spec.name)
        if held is None or PREFERENCE.index(c.source) > PREFERENCE.index(held[1].source):
            chosen[spec.name] = (spec, c)
    picked = {id(c) for _, c in chosen.values()}
    dedicated = [chosen[k] for k in sorted(chosen)]
    generic = [c for c in counters if id(c) not in picked]
    return dedicated, generic


def _label(value: object) -> str:
    return "" if value is None else str(value)


def render(snap: InfinibandSnapshot, out: Families) -> None:
    """Every device and port; below full detail (``out.folds``) saturation is folded into
    one count per port that has one, a rate comparison is exported only where the port runs
    below it, RoCE-only counters are left out on InfiniBand ports and the SM's LID on
    Ethernet ports."""
    folds = out.folds
    for check in rate_checks(snap):
        if check.degraded or not folds:
            out.add(
                PORT_RATE_DEGRADED, check.degraded, check.device, str(check.port), check.comparison
            )
    for dev in snap.devices:
        out.add(
            DEVICE_INFO,
            1,
            dev.name,
            _label(dev.fw_ver),
            _label(dev.board_id),
            _label(dev.hca_type),
            _label(dev.node_guid),
            _label(dev.node_type),
            _label(dev.pci_bus_id),
            _label(dev.numa_node),
        )
        for port in dev.ports:
            labels = (dev.name, str(port.port))
            out.add(
                PORT_INFO,
                1,
                *labels,
                _label(port.link_layer),
                _label(port.lid),
                _label(port.netdev),
            )
            ethernet = port.link_layer == "Ethernet"
            infiniband = port.link_layer == "InfiniBand"
            if not (folds and port.up):
                out.add(PORT_STATE, port.state.number if port.state else None, *labels)
                phys = port.phys_state.number if port.phys_state else None
                out.add(PORT_PHYSICAL_STATE, phys, *labels)
            out.add(PORT_UP, port.up, *labels)
            out.add(PORT_RATE, port.rate_bytes_per_second, *labels)
            out.add(PORT_LINK_WIDTH, port.width, *labels)
            if not folds:
                out.add(PORT_LANE_SPEED, lane_speed_bytes_per_second(port.speed), *labels)
            if not (folds and ethernet):
                out.add(PORT_SM_LID, port.sm_lid, *labels)
            out.add(HW_COUNTERS_LIFESPAN, port.hw_counters_lifespan_seconds, *labels)
            dedicated, generic = split_counters(port.counters)
            for spec, c in dedicated:
                if folds and infiniband and c.source == _H and c.name in ROCE_ONLY:
                    continue
                if folds and c.value == 0 and spec.name in _ERROR_DEFAULT:
                    continue  # below full an error counter is exported when non-zero
                out.add(spec, c.value, *labels)
            for c in generic:
                out.add(GENERIC_COUNTER, c.value, *labels, c.source, c.name)
            narrow = [c for c in port.counters if c.width is not None and c.width < 64]
            for c in narrow:
                if c.saturated or not folds:
                    out.add(COUNTER_SATURATED, c.saturated, *labels, c.name)
                if c.saturated:
                    out.add(SATURATED_SINCE, c.saturated_since, *labels, c.name)
            saturated = sum(1 for c in narrow if c.saturated)
            if narrow and (saturated or not folds):
                out.add(SATURATED_COUNTERS, saturated, *labels)
            src = port.counter_source
            if src is not None:
                out.add(PMA_SOURCE, 1, *labels, src.source, src.reason)
                out.add(PMA_RESETS, src.resets_total, *labels)
