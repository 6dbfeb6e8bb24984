"""The fabric's own topology on the boards: the Fleet board's by-switch row (:data:`BY_SWITCH`)
and the Node board's cable panels (:data:`CABLES`), each a self-contained tuple of panels
the board appends.

The join: ``fabricscope_infiniband_peer_info`` names, for every node port, the switch
(``peer_guid``, ``peer_description``) and switch port its cable lands on; the leaf uplinks'
ends are ``fabricscope_infiniband_switch_port_*`` series labelled by switch and port, named by
``fabricscope_infiniband_switch_link_info``. Below full detail the far ends' error counters
are exported once non-zero, so sums here are unions of whatever counts (``_any_sum``), never
``a + b`` (which drops a port whose one counter is absent).
"""

from __future__ import annotations

from boards.model import RI, N, Panel

C = 'cluster=~"$cluster"'
#: a node port's faults in the last hour: errors at either end of its cable, discards at the
#: switch end
PORT_ERRORS = (
    "fabricscope_infiniband_port_symbol_errors_total",
    "fabricscope_infiniband_port_receive_errors_total",
    "fabricscope_infiniband_peer_port_symbol_errors_total",
    "fabricscope_infiniband_peer_port_receive_errors_total",
    "fabricscope_infiniband_peer_port_transmit_discards_total",
)
SWITCH_ERRORS = (
    "fabricscope_infiniband_switch_port_symbol_errors_total",
    "fabricscope_infiniband_switch_port_receive_errors_total",
    "fabricscope_infiniband_switch_port_transmit_discards_total",
)
#: a node port's cable, with the switch it lands on (one series per port)
CABLE = (
    "max by (instance, device, port, peer_guid, peer_port, peer_description) "
    f'(fabricscope_infiniband_peer_info{{{N},node_type="switch"}})'
)
NODE_LINK = "/d/fabricscope-node/?var-node=${__field.labels.instance}&${__url_time_range}"


def _any_sum(metrics: tuple[str, ...], by: str, sel: str, fn: str, rng: str) -> str:
    """``sum by (by)`` of ``fn(metric[rng])`` over ``metrics``, each a distinct series
    (tagged with a ``counter`` label) so that none hides another and an absent one counts 0."""
    parts = [
        f'label_replace({fn}({m}{{{sel}}}[{rng}]), "counter", "{i}", "", "")'
        for i, m in enumerate(metrics)
    ]
    return f"sum by ({by}) ({' or '.join(parts)})"


#: per node port: 1 when in the last hour its cable erred at either end, the switch discarded
#: packets for it, or it waited to send more than 5 % of the time
_FAULTY_PORT = (
    "(max by (instance, device, port) ("
    + " or ".join(f"increase({m}{{{N}}}[1h]) > 0" for m in PORT_ERRORS)
    + f" or rate(fabricscope_infiniband_port_transmit_wait_total{{{N}}}[1h])"
    f" / (rate(fabricscope_infiniband_port_transmit_wait_total{{{N}}}[1h])"
    f" + rate(fabricscope_infiniband_port_transmitted_bytes_total{{{N}}}[1h]) / 4) > 0.05"
    ") * 0 + 1)"
)
#: every switch's name, leaves and the far ends of their uplinks alike
_SWITCH_NAMES = (
    "max by (switch_guid, switch_description) ("
    f"fabricscope_infiniband_switch_link_info{{{C}}} or label_replace(label_replace("
    f"fabricscope_infiniband_switch_link_info{{{C}}}, "
    '"switch_guid", "$1", "peer_guid", "(.+)"), "switch_description", "$1", '
    '"peer_description", "(.+)"))'
)

BY_SWITCH: tuple[Panel, ...] = (
    Panel(
        "Faulty ports per switch (1 h)",
        "bargauge",
        (
            (
                "sort_desc(topk(10, count by (peer_guid, peer_description) ("
                f"{_FAULTY_PORT} * on (instance, device, port) group_left (peer_guid, "
                f"peer_description) {CABLE})))",
                "{{peer_description}} ({{peer_guid}})",
            ),
        ),
        "none",
        "The 10 leaf switches with the most node ports cabled to them that had a fault in the "
        "last hour: errors at either end of the cable, packets the switch discarded for the port, "
        "or more than 5 % of the time waiting to send. Several nodes' ports under one switch "
        "point at the switch (fabricscope explain tests it for a job); the ports are listed "
        "beside.",
        w=8,
        h=9,
        new_row=True,
    ),
    Panel(
        "Errors per cable, by switch port (1 h)",
        "bargauge",
        (
            (
                "sort_desc(topk(20, "
                + _any_sum(PORT_ERRORS, "instance, device, port", N, "increase", "1h")
                + " * on (instance, device, port) group_left (peer_guid, peer_port, "
                f"peer_description) {CABLE} > 0))",
                "{{peer_description}} port {{peer_port}}: {{instance}} {{device}}",
            ),
        ),
        "none",
        "The 20 cables with the most errors in the last hour, counted at the node end and at "
        "the switch end, and packets the switch discarded for them, named by the switch port "
        "the cable lands on. Click a bar for the node.",
        w=9,
        h=9,
        link=NODE_LINK,
    ),
    Panel(
        "Uplink errors, either end (1 h)",
        "bargauge",
        (
            (
                "sort_desc(topk(10, "
                + _any_sum(SWITCH_ERRORS, "switch_guid, switch_port", C, "increase", "1h")
                + f" * on (switch_guid) group_left (switch_description) {_SWITCH_NAMES} > 0))",
                "{{switch_description}} port {{switch_port}}",
            ),
        ),
        "none",
        "The 10 leaf-uplink ends (a leaf's or a spine's port) with the most errors and "
        "discards in the last hour (each uplink is read by one of the hosts under its leaf).",
        w=7,
        h=9,
    ),
)

CABLES: tuple[Panel, ...] = (
    Panel(
        "Cables: the switch port at the far end, its errors (1 h)",
        "bargauge",
        (
            (
                f"{CABLE} * 0 + on (instance, device, port) group_left () "
                + _any_sum(PORT_ERRORS[2:], "instance, device, port", N, "increase", "1h")
                + f" or {CABLE} * 0",
                "{{device}}/{{port}} -> {{peer_description}} port {{peer_port}} ({{peer_guid}})",
            ),
        ),
        "none",
        "Where each InfiniBand port's cable lands (the ibpeer sampler: the switch, its GUID "
        "and port) and the errors and discards that switch port counted in the last hour: "
        "what this node's transmitter or the cable damaged, and what the switch dropped.",
        w=12,
    ),
    Panel(
        "Errors at both ends of each cable",
        "timeseries",
        (
            (
                "sum by (device) (rate(fabricscope_infiniband_port_symbol_errors_total"
                f"{{{N}}}[{RI}]) + rate(fabricscope_infiniband_port_receive_errors_total"
                f"{{{N}}}[{RI}]))",
                "{{device}} this end",
            ),
            (
                _any_sum(PORT_ERRORS[2:4], "device", N, "rate", RI),
                "{{device}} switch end",
            ),
        ),
        "cps",
        "Symbol and receive errors per second as this node counts them beside those the "
        "switch port at the other end counts: errors only at the switch end point at this "
        "node's transmitter or the cable, only here at the switch's transmitter or the cable.",
        w=12,
    ),
)
