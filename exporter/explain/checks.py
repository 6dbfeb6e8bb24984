"""The candidate causes and the checks that gather their evidence, as one table.

A ``Check`` is a PromQL template evaluated twice, over the baseline and over the slow
period, for every device of the job; its ``mode`` says how the two numbers compare and its
``significant`` level is the change that scores 1.0. Scores are ``log2(1 + change /
significant)``: 1.0 means "the change reached the significance level", and a change eight
times that level scores about 3.2, so one huge counter cannot dwarf the table's scale.

Templates take ``{sel}`` (the label matchers scoping the query to the job's instances or
pods, or to one device), ``{d}`` (a range: the period's length for scoring, a tile of it
for the noise, a few steps for display) and, where a device is compared with its node's
other devices, ``{peers}`` (the matchers of those: the job's instances when the whole job
is asked, the device's node when one device's figure is printed, so the printed query
never compares a device with itself alone).

Every check gets the same statistics from the framework, whatever its template: its figures
are taken over the part of each period its series covers, its change is held to the spread
of its own baseline (and, for event counters, to counting noise: :mod:`exporter.explain.
noise`), and a PMA counter it reads that saturated makes it "evidence unavailable"
(:mod:`exporter.explain.blind`). What the framework prints for a figure (:meth:`Check.shown`)
is the PromQL that returns it, in the check's unit.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Mode = Literal["rate", "events", "drop", "rise", "level"]
Scope = Literal["instance", "pod"]
Key = Literal["port", "netdev", "pci", "gpu", "probe", "pod"]

#: a candidate at or above this score "stands out"; below it, it is listed as checked only
THRESHOLD = 1.0

#: the Node dashboard's panels (dashboards/boards/node.py) for a port's rate/width/speed and
#: for its data rate beside its rail peers'
PANEL_PORT_RATE = 4
PANEL_PORT_DATA = 1
#: the Fleet dashboard's switches ranked by faulty ports under them (dashboards/boards/
#: switches.py, the first panel of the by-switch row)
PANEL_BY_SWITCH = 11


@dataclass(frozen=True, slots=True)
class Cause:
    """A candidate cause and the dashboard panel that shows it (dashboards/*.json, generated
    by dashboards/generate.py: uid and panel id; 0: the dashboard has no panel for it)."""

    name: str
    title: str
    dashboard: str
    panel: int


CAUSES: dict[str, Cause] = {
    c.name: c
    for c in (
        Cause("ib_link", "InfiniBand/RoCE link errors", "fabricscope-node", 3),
        Cause("ib_congestion", "port congestion (xmit_wait)", "fabricscope-job", 4),
        Cause("roce_congestion", "RoCE congestion (PFC pause, CNP/ECN)", "fabricscope-node", 9),
        Cause("drops", "packet drops and retransmissions", "fabricscope-node", 10),
        Cause(
            "port_rate",
            "InfiniBand/RoCE port up but below its rate (fewer lanes or a lower speed)",
            "fabricscope-node",
            PANEL_PORT_RATE,
        ),
        Cause(
            "rail_share",
            "port carrying less data than its rail peers",
            "fabricscope-node",
            PANEL_PORT_DATA,
        ),
        Cause("pcie", "PCIe link degraded", "fabricscope-node", 14),
        Cause("nvlink", "NVLink down or erroring", "fabricscope-node", 13),
        Cause("gpu", "GPU errors (XID, lost GPU)", "fabricscope-node", 17),
        Cause("gpu_throttle", "GPU clocks throttled", "fabricscope-node", 0),
        Cause("probe", "probe bus bandwidth below the pair's baseline", "fabricscope-probe", 3),
        Cause("misplacement", "pods placed off their GPUs' NUMA node", "fabricscope-job", 8),
        Cause("nccl_config", "NCCL settings differ or are wrong", "fabricscope-job", 8),
        Cause(
            "nccl_transport",
            "NCCL chose another transport, GPUDirect RDMA mode or HCA set",
            "fabricscope-job",
            2,
        ),
        Cause("nccl_network", "NCCL network warnings", "fabricscope-job", 12),
        Cause(
            "nccl_rank",
            "an NCCL rank stopped answering or lags the others (NCCL's RAS)",
            "fabricscope-job",
            0,
        ),
        Cause(
            "nccl_nvlink",
            "NCCL traffic between NVLinked GPUs of a node going through host memory or the "
            "network instead of NVLink",
            "fabricscope-job",
            0,
        ),
        Cause(
            "switch",
            "a switch: ports of several of the job's nodes under it, or its uplinks, show "
            "the same fault",
            "fabricscope-fleet",
            PANEL_BY_SWITCH,
        ),
    )
}


@dataclass(frozen=True, slots=True)
class Check:
    """One piece of evidence for a cause.

    ``mode``: ``rate`` compares per-second rates (slow minus baseline); ``events`` compares
    counts, the baseline's scaled to the slow period's length; ``drop`` is a gauge's
    relative fall ((baseline - slow) / baseline); ``rise`` a gauge's absolute rise;
    ``level`` is the slow period's value itself (a standing defect of the job's own
    placement or settings, reported even when it did not change). Every mode but ``level``
    compares with the baseline: a device with no baseline value scores 0 and is reported as
    "no baseline", never as a change from nothing. ``scale`` and ``unit``
    only format numbers (x60 for "per minute"), and the printed PromQL carries the scale, so
    it returns the printed figure. ``identity`` names the labels that make a device, besides
    ``instance``. ``counts``: the template is a rate or an increase of events, whose
    counting noise is Poisson (default: the ``rate`` and ``events`` modes). ``axis``: what
    a plot's y axis says (default: the unit). ``whole_job``: the series come from another
    node than the device's (NCCL's RAS answers from the node of rank 0, and the template
    moves each rank to its own node): asked for the whole job at once, never in groups of
    nodes, and printed over the whole job, the device being one row of the answer.
    """

    name: str
    cause: str
    what: str
    template: str
    mode: Mode
    significant: float
    key: Key
    identity: tuple[str, ...]
    scope: Scope = "instance"
    unit: str = ""
    scale: float = 1.0
    counts: bool | None = None
    axis: str = ""
    whole_job: bool = False
    #: ``{peers}`` selects the far end of the device's cable: the identity's labels as the
    #: far end's series name them (an uplink: ``peer_guid``, ``peer_port``)
    far_labels: tuple[str, ...] = ()

    @property
    def job_named(self) -> bool:
        """A pod-scoped check whose series all come from the job's own logs and carry its
        ``job_name`` label (NCCL's): on bare metal, with no pods, it selects the job's
        nodes and that label instead."""
        names = set(_METRIC.findall(self.template))
        return (
            self.scope == "pod"
            and bool(names)
            and all(n.startswith("fabricscope_nccl_") for n in names)
        )

    @property
    def counting(self) -> bool:
        """Event counts, with Poisson counting noise."""
        return self.mode in ("rate", "events") if self.counts is None else self.counts

    @property
    def metrics(self) -> tuple[str, ...]:
        """The metric names the template reads, in order of appearance."""
        return tuple(dict.fromkeys(_METRIC.findall(self.template)))

    @property
    def axis_label(self) -> str:
        return self.axis or self.unit.strip() or "ratio"

    def expr(self, sel: str, d: str, peers: str | None = None) -> str:
        """The template for selector ``sel`` over range ``d``, in the series' own units."""
        return self.template.format(sel=sel, d=d, peers=sel if peers is None else peers)

    def shown(self, sel: str, d: str, peers: str | None = None) -> str:
        """:meth:`expr` as printed: in the unit of the figures (events as whole numbers)."""
        raw = self.expr(sel, d, peers)
        if self.mode == "events":
            return f"round({raw})"
        if self.scale != 1.0:
            return f"{self.scale:g} * ({raw})"
        return raw

    def display(self, value: float) -> float:
        """A figure in the series' units as printed (events: whole numbers)."""
        if self.mode == "events":
            return float(math.floor(value + 0.5))
        return value * self.scale

    def device_selector(self, labels: Mapping[str, str]) -> str:
        """The matchers of one device: its instance and identity (a pod: namespace, pod
        and GPU when it has one)."""
        names: tuple[str, ...] = ("instance", *self.identity)
        if self.scope == "pod":
            names = ("namespace", "pod", "gpu") if labels.get("pod") else ("instance", "job_name")
        return ",".join(f'{n}="{_escape(labels.get(n, ""))}"' for n in names if n in labels)

    def peer_selector(self, labels: Mapping[str, str]) -> str:
        """The matchers of the device's peers for ``{peers}``: its node (its pod's namespace
        for a pod-scoped check; the far end of the cable for ``far_labels``)."""
        if self.far_labels:
            return ",".join(
                f'{far}="{_escape(labels.get(own, ""))}"'
                for far, own in zip(self.far_labels, self.identity, strict=True)
            )
        if self.scope == "pod" and labels.get("pod"):
            return f'namespace="{_escape(labels.get("namespace", ""))}"'
        return f'instance="{_escape(labels.get("instance", ""))}"'


_METRIC = re.compile(r"\bfabricscope_[a-z0-9_]+")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _ib(counter: str) -> str:
    return f"rate(fabricscope_infiniband_port_{counter}_total{{{{{{sel}}}}}}[{{d}}])"


def _peer(counter: str) -> str:
    """The switch end of a port's cable (the ibpeer sampler), per local port: a cable moved
    within the period has two far ends; the worse counts. Below full detail a healthy
    cable's counter is not exported until it counts: 0 then, for every port whose far end
    is known."""
    return (
        "max by (instance, device, port) "
        f"(rate(fabricscope_infiniband_peer_port_{counter}_total{{{{{{sel}}}}}}[{{d}}])) "
        "or 0 * max by (instance, device, port) "
        "(last_over_time(fabricscope_infiniband_peer_info{{{sel}}}[{d}]))"
    )


def _per_gpu(fn: str, metric: str, per_link: str) -> str:
    """``fn`` of a per-GPU series summed per GPU, or of the per-link series older agents
    exported in its place."""
    return " or ".join(
        f"sum by (instance, gpu) ({fn}({m}{{{{{{sel}}}}}}[{{d}}]))" for m in (metric, per_link)
    )


def _ib_inc(counter: str) -> str:
    return f"increase(fabricscope_infiniband_port_{counter}_total{{{{{{sel}}}}}}[{{d}}])"


PORT = ("device", "port")

#: NCCL's network transports (agent/throughput/nccl.py NET_TRANSPORTS)
_NCCL_NET = 'transport=~"NET/.+"'
#: a pod-scoped row: its pod, or on bare metal (no pod) the job on its node
_BY_POD = "instance, namespace, pod, job_name"
_ANY_HCA = 'device=~".+"'


def _nccl(metric: str, matchers: str, agg: str = "sum") -> str:
    """The latest value of an NCCL series in the range, per pod (``agg``: sum or count)."""
    inner = f"last_over_time(fabricscope_nccl_{metric}{{{{{{sel}},{matchers}}}}}[{{d}}])"
    if agg == "count":
        inner += " > 0"
    return f"{agg} by ({_BY_POD}) ({inner})"


def _or_zero(expr: str) -> str:
    """``expr``, or 0 for a pod that set up network channels but has none of these (its
    series is absent, not 0: a run that stopped using a transport renders no series for it)."""
    return f"({expr} or 0 * {_nccl('channels', _NCCL_NET)})"


#: a pod's channel connections between NVLinked GPUs of its node: not over P2P, and all
_NVLINK_BYPASS = _nccl("nvlink_peer_channels", 'transport!~"P2P/.*"')
_NVLINK_ALL = _nccl("nvlink_peer_channels", 'transport=~".+"')


def _nccl_share(matchers: str) -> str:
    """The share of a pod's network channel connections that match ``matchers``."""
    return f"{_or_zero(_nccl('channels', matchers))} / {_nccl('channels', _NCCL_NET)}"


def _nccl_share_check(name: str, what: str, template: str, mode: Mode, significant: float) -> Check:
    """A per-pod share of NCCL's channel connections (cause ``nccl_transport``), in percent."""
    return Check(
        name,
        "nccl_transport",
        what,
        template,
        mode,
        significant,
        "pod",
        ("pod",),
        scope="pod",
        unit="%",
        scale=100.0,
        axis="% of network channel connections",
    )


#: a rank NCCL's RAS service names (exported by the node that asks the job), moved to the node
#: that owns the rank's host address (its own fabricscope_nccl_ras_node_address_info), per GPU:
#: 1 when named unresponsive, dead or lagging in the range
_RAS_RANK = (
    "max by (instance, gpu) ("
    "max by (host, gpu) (max_over_time(fabricscope_nccl_ras_rank_info{{{sel},"
    'state=~"unresponsive|dead|lagging"}}[{d}]))'
    " * on (host) group_left (instance) "
    "topk by (host) (1, max by (instance, host) ("
    "max_over_time(fabricscope_nccl_ras_node_address_info{{{sel}}}[{d}]))))"
)

CHECKS: tuple[Check, ...] = (
    # --- links ------------------------------------------------------------------------
    Check(
        "symbol_errors",
        "ib_link",
        "symbol errors",
        _ib("symbol_errors"),
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
        _ib("receive_errors"),
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
        _ib("receive_remote_physical_errors"),
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
        _ib_inc("link_error_recovery"),
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
        _ib_inc("link_downed"),
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
        _ib_inc("local_link_integrity_errors"),
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
        _peer("symbol_errors"),
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
        _peer("receive_errors"),
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
        _peer("transmit_discards"),
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
        "max by (instance, device, port) "
        "(sum_over_time(fabricscope_infiniband_port_rate_degraded{{{sel}}}[{d}])) "
        "/ on (instance, device, port) max by (instance, device, port) "
        "(count_over_time(fabricscope_infiniband_port_up{{{sel}}}[{d}])) "
        "or 0 * max by (instance, device, port) "
        "(last_over_time(fabricscope_infiniband_port_up{{{sel}}}[{d}]))",
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
        _ib("cnp_sent"),
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
        _ib("cnp_handled"),
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
        _ib("ecn_marked_roce_packets"),
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
        _ib("transmit_discards"),
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
        _ib("out_of_sequence"),
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
        _ib("local_ack_timeout_errors"),
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
    # --- PCIe -------------------------------------------------------------------------
    Check(
        "pci_width",
        "pcie",
        "PCIe link width (lanes)",
        "avg_over_time(fabricscope_pci_link_width{{{sel}}}[{d}])",
        "drop",
        0.125,
        "pci",
        ("pci_bus_id",),
        axis="lanes",
    ),
    Check(
        "pci_width_degraded",
        "pcie",
        "PCIe link trained narrower than both ends (0/1)",
        "max_over_time(fabricscope_pci_link_width_degraded{{{sel}}}[{d}])",
        "rise",
        0.5,
        "pci",
        ("pci_bus_id",),
        axis="0/1",
    ),
    Check(
        "nic_pci_speed",
        "pcie",
        "NIC PCIe link speed",
        "avg_over_time(fabricscope_pci_link_speed_transfers_per_second{{{sel}}}[{d}]) "
        'and on (instance, pci_bus_id) fabricscope_pci_device_info{{{sel},role="nic"}}',
        "drop",
        0.125,
        "pci",
        ("pci_bus_id",),
        unit=" GT/s",
        scale=1e-9,
    ),
    Check(
        "nic_pci_speed_degraded",
        "pcie",
        "NIC PCIe link slower than both ends support (0/1)",
        "max_over_time(fabricscope_pci_link_speed_degraded{{{sel}}}[{d}])",
        "rise",
        0.5,
        "pci",
        ("pci_bus_id",),
        axis="0/1",
    ),
    Check(
        "gpu_pcie_generation_busy",
        "pcie",
        "GPU PCIe below its generation while running processes (share of time)",
        "avg_over_time(fabricscope_gpu_pcie_link_generation_degraded{{{sel}}}[{d}])",
        "rise",
        0.25,
        "gpu",
        ("gpu",),
        axis="share of time",
    ),
    Check(
        "gpu_pcie_width",
        "pcie",
        "GPU PCIe link width (lanes)",
        "avg_over_time(fabricscope_gpu_pcie_current_link_width{{{sel}}}[{d}])",
        "drop",
        0.125,
        "gpu",
        ("gpu",),
        axis="lanes",
    ),
    Check(
        "gpu_pcie_replays",
        "pcie",
        "GPU PCIe replays",
        "rate(fabricscope_gpu_pcie_replays_total{{{sel}}}[{d}])",
        "rate",
        1 / 60,
        "gpu",
        ("gpu",),
        unit="/min",
        scale=60.0,
    ),
    # --- NVLink and GPUs --------------------------------------------------------------
    Check(
        "nvlink_up",
        "nvlink",
        "NVLinks up (of the GPU's links, time-averaged)",
        # the per-GPU count; agents before it exported every link's up
        _per_gpu("avg_over_time", "fabricscope_gpu_nvlinks_up", "fabricscope_nvlink_up"),
        "drop",
        0.02,
        "gpu",
        ("gpu",),
        axis="NVLinks up",
    ),
    Check(
        "nvlink_errors",
        "nvlink",
        "NVLink replay/recovery/CRC errors",
        # the per-GPU sums (below full detail a link's series starts at its first error,
        # which rate() cannot see); agents before them exported every link
        _per_gpu("rate", "fabricscope_gpu_nvlink_errors_total", "fabricscope_nvlink_errors_total"),
        "rate",
        1 / 60,
        "gpu",
        ("gpu",),
        unit="/min",
        scale=60.0,
    ),
    Check(
        "xid",
        "gpu",
        "XID errors",
        "sum by (instance, gpu) (increase(fabricscope_gpu_xid_errors_total{{{sel}}}[{d}]))",
        "events",
        1.0,
        "gpu",
        ("gpu",),
        unit=" events",
    ),
    Check(
        "gpu_lost",
        "gpu",
        "GPU lost (0/1)",
        "max_over_time(fabricscope_gpu_lost{{{sel}}}[{d}])",
        "rise",
        0.5,
        "gpu",
        ("gpu",),
        axis="0/1",
    ),
    Check(
        "throttle",
        "gpu_throttle",
        "share of time clocks held down (slowdown reasons)",
        "max by (instance, gpu) (avg_over_time(fabricscope_gpu_clocks_event_active{{{sel},"
        'reason=~"hw_slowdown|hw_thermal_slowdown|sw_thermal_slowdown|hw_power_brake_slowdown"'
        "}}[{d}]))",
        "rise",
        0.25,
        "gpu",
        ("gpu",),
        axis="share of time",
    ),
    # --- probes -----------------------------------------------------------------------
    Check(
        "probe_busbw",
        "probe",
        "probe bus bandwidth",
        "avg_over_time(fabricscope_probe_busbw_bytes_per_second{{{sel}}}[{d}])",
        "drop",
        0.2,
        "probe",
        ("peer", "gpu", "peer_gpu", "collective", "size_bytes"),
        unit=" GB/s",
        scale=1e-9,
    ),
    # --- the job's own placement and settings -----------------------------------------
    Check(
        "cpu_gpu_numa",
        "misplacement",
        "share of a process's CPUs off its GPU's NUMA node",
        "max_over_time(fabricscope_workload_cpu_gpu_numa_mismatch_ratio{{{sel}}}[{d}])",
        "level",
        0.25,
        "pod",
        ("pod", "gpu"),
        scope="pod",
        axis="share of CPUs",
    ),
    Check(
        "cpu_nic_numa",
        "misplacement",
        "share of a process's CPUs off its NICs' NUMA node",
        "max_over_time(fabricscope_workload_cpu_nic_numa_mismatch_ratio{{{sel}}}[{d}])",
        "level",
        0.25,
        "pod",
        ("pod", "gpu"),
        scope="pod",
        axis="share of CPUs",
    ),
    Check(
        "nccl_findings",
        "nccl_config",
        "processes with an NCCL finding (IB disabled, NCCL_IB_HCA matching no HCA or one on "
        "another NUMA node)",
        "sum by (instance, namespace, pod, gpu) (max_over_time("
        "fabricscope_workload_finding_processes{{{sel},"
        'kind=~"nccl_ib_disabled|nccl_ib_hca_no_match|nccl_ib_hca_wrong_numa"}}[{d}]))',
        "level",
        0.5,
        "pod",
        ("pod", "gpu"),
        scope="pod",
        axis="processes",
    ),
    # --- what NCCL itself chose and suffered (its own lines in the pods' logs) --------
    _nccl_share_check(
        "nccl_socket_share",
        "share of NCCL's network channel connections over NET/Socket",
        _nccl_share('transport="NET/Socket"'),
        "rise",
        0.1,
    ),
    Check(
        "nccl_socket_channels",
        "nccl_transport",
        "NCCL channel connections over NET/Socket",
        _or_zero(_nccl("channels", 'transport="NET/Socket"')),
        "rise",
        8.0,
        "pod",
        ("pod",),
        scope="pod",
        axis="connections",
    ),
    _nccl_share_check(
        "nccl_ib_without_gdr_share",
        "share of NCCL's network channel connections over NET/IB without GPUDirect RDMA",
        _nccl_share('transport="NET/IB",gdr="0"'),
        "rise",
        0.1,
    ),
    _nccl_share_check(
        "nccl_gdr_share",
        "share of NCCL's network channel connections over NET/IB with GPUDirect RDMA",
        _nccl_share('transport="NET/IB",gdr="1"'),
        "drop",
        0.2,
    ),
    Check(
        "nccl_hcas",
        "nccl_transport",
        "HCAs NCCL's channels use",
        _or_zero(_nccl("hca_channels", _ANY_HCA, "count")),
        "drop",
        0.25,
        "pod",
        ("pod",),
        scope="pod",
        axis="HCAs",
    ),
    _nccl_share_check(
        "nccl_hca_off_numa_share",
        "share of NCCL's NET/IB channel connections through an HCA on another NUMA node than "
        "their GPU",
        _nccl("hca_channels_off_gpu_numa", _ANY_HCA) + " / " + _nccl("hca_channels", _ANY_HCA),
        "rise",
        0.1,
    ),
    Check(
        "nccl_nvlink_bypass_share",
        "nccl_nvlink",
        "share of NCCL's channel connections between NVLinked GPUs of a node not over P2P "
        "(through SHM or NET instead of the NVLinks)",
        f"({_NVLINK_BYPASS} or 0 * {_NVLINK_ALL}) / {_NVLINK_ALL}",
        "level",
        0.25,
        "pod",
        ("pod",),
        scope="pod",
        unit="%",
        scale=100.0,
    ),
    Check(
        "nccl_network_warnings",
        "nccl_network",
        "NCCL network warnings (IB completion errors, async events, verbs calls, sockets, "
        "timeouts)",
        f"sum by ({_BY_POD}) (increase(fabricscope_nccl_warnings_total{{{{{{sel}},"
        'kind=~"ib_completion|ib_async_event|ibv_call|socket|timeout"}}[{d}]))',
        "events",
        3.0,
        "pod",
        ("pod",),
        scope="pod",
        unit=" warnings",
    ),
    # --- NCCL's own view of its ranks (its RAS service) -------------------------------
    Check(
        "nccl_rank_stuck",
        "nccl_rank",
        "NCCL's RAS named this GPU's rank unresponsive, dead or lagging (0/1)",
        _RAS_RANK,
        "level",
        0.5,
        "gpu",
        ("gpu",),
        axis="0/1",
        whole_job=True,
    ),
)

CHECKS_BY_NAME = {c.name: c for c in CHECKS}
