"""Metric specs and rendering for the infiniband sampler: devices, ports, their state, rate
and PMA bookkeeping here, the port counters in :mod:`exporter.metrics.infiniband_counters`.

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
from agent.infiniband.records import InfinibandSnapshot
from exporter.metrics.infiniband_counters import (
    ERROR_DEFAULT,
    HW_SOURCE,
    HW_SPECS,
    PMA_SPECS,
    ROCE_ONLY,
    split_counters,
)
from exporter.metrics.spec import Families, MetricSpec

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
    *PMA_SPECS,
    *HW_SPECS,
)


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
                if folds and infiniband and c.source == HW_SOURCE and c.name in ROCE_ONLY:
                    continue
                if folds and c.value == 0 and spec.name in ERROR_DEFAULT:
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
