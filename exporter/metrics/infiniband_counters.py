"""The infiniband sampler's port counters: the dedicated metric of each well-known counter
file (the PMA's ``counters/`` and ``counters_ext/``, mlx5's ``hw_counters/``), in base units,
with the level of ``--collector.detail`` that exports it, and which counter of a port renders
under which metric (:func:`split_counters`). Rendering is :mod:`exporter.metrics.infiniband`'s.
"""

from __future__ import annotations

from agent.infiniband.records import PortCounter
from exporter.metrics.spec import Detail, MetricSpec

_DP = ("device", "port")
_P = "fabricscope_infiniband_port_"

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
ERROR_DEFAULT: dict[str, Detail] = {}


def _error(
    what: str, help_: str, detail: Detail = "default", fold: str = _NONZERO_FOLD
) -> MetricSpec:
    """An error, discard, retry or timeout counter: at ``default`` exported when non-zero."""
    spec = _counter(what, help_, detail=detail, fold=fold)
    ERROR_DEFAULT[spec.name] = detail
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
HW_SOURCE = "hw_counters"

_known(TRANSMITTED_BYTES, (_C, "port_xmit_data"), (_X, "port_xmit_data_64"))
_known(RECEIVED_BYTES, (_C, "port_rcv_data"), (_X, "port_rcv_data_64"))
PMA_SPECS = (
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
    return _known(spec, (HW_SOURCE, name))


HW_SPECS = tuple(_hw_spec(name, what, help_) for name, what, help_ in _HW)


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
