"""Parsers of infiniband-diags output (agent/ibpeer/parse.py): real hardware outputs from
public pages and the simulator's, table tests of the field grammar, and hostile input."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.ibpeer.parse import (
    DESCRIPTION_MAX,
    clean_description,
    merge_counters,
    parse_nodedesc,
    parse_nodeinfo,
    parse_portinfo,
    parse_speeds,
    parse_width,
    parse_widths,
)
from agent.infiniband.perfquery import parse_fields, parse_perfquery

FIX = Path(__file__).parents[1] / "fixtures" / "ibpeer"
GBPS = 125_000_000


def text(name: str) -> str:
    return (FIX / name).read_text()


@pytest.mark.parametrize(
    ("raw", "lanes"),
    [
        ("1X or 4X or 8X or 12X or 2X", {1, 2, 4, 8, 12}),
        ("1X or 4X", {1, 4}),
        ("4X (IBA extension)", {4}),
        ("12X", {12}),
    ],
)
def test_widths(raw: str, lanes: set[int]) -> None:
    assert parse_widths(raw) == lanes


@pytest.mark.parametrize("raw", ["", "undefined (0)", "3X", "4x", "X", "14X"])
def test_widths_reject(raw: str) -> None:
    with pytest.raises(ValueError):
        parse_widths(raw)


def test_active_width_is_one_width() -> None:
    assert parse_width("4X") == 4
    with pytest.raises(ValueError):
        parse_width("1X or 4X")


@pytest.mark.parametrize(
    ("raw", "speeds"),
    [
        ("2.5 Gbps or 5.0 Gbps or 10.0 Gbps", {312_500_000, 625_000_000, 1_250_000_000}),
        ("10.0 Gbps (IBA extension)", {1_250_000_000}),
        ("14.0625 Gbps or 25.78125 Gbps", {1_757_812_500, 3_222_656_250}),
        ("53.125 Gbps", {6_640_625_000}),
        ("106.25 Gbps", {13_281_250_000}),
        ("0", set()),
        ("No Extended Speed", set()),
        ("No Extended Speed 2", set()),
        ("Extended speed", set()),
    ],
)
def test_speeds(raw: str, speeds: set[int]) -> None:
    assert parse_speeds(raw) == speeds


@pytest.mark.parametrize("raw", ["fast", "10 Gb/s", "-1 Gbps", "1e9 Gbps"])
def test_speeds_reject(raw: str) -> None:
    with pytest.raises(ValueError):
        parse_speeds(raw)


def test_fdr_port_on_real_connectx3() -> None:
    """The extended speed wins over LinkSpeedActive; the Mellanox block's hex
    LinkSpeedSupported (a second block) does not leak in."""
    pi = parse_portinfo(text("ibportstate-cx3-fdr-query.txt"))
    assert pi.lid == 12
    assert (pi.link_state, pi.phys_state) == ("Active", "LinkUp")
    assert (pi.width_active, pi.width_supported, pi.width_enabled) == (4, {1, 4}, {4})
    assert pi.speed_active == int(14.0625 * GBPS)
    assert pi.speed_supported == {312_500_000, 625_000_000, 1_250_000_000, 1_757_812_500}


def test_real_port_set_to_1x_and_no_extended_speed() -> None:
    before, after = text("ibportstate-cx3-width1-set.txt").split("After PortInfo set:")
    b, a = parse_portinfo(before), parse_portinfo(after)
    assert (b.width_enabled, a.width_enabled) == ({1, 4}, {1})
    assert a.width_active == 4  # not retrained yet
    # "No Extended Speed": the base speed is the active one
    assert a.speed_active == 1_250_000_000
    assert max(a.speed_supported) == int(25.78125 * GBPS)


def test_real_switch_and_peer_blocks() -> None:
    local, peer = text("ibportstate-exadata-qdr-peer.txt").split("Peer PortInfo:")
    lp, pp = parse_portinfo(local), parse_portinfo(peer)
    assert lp.lid is None  # ibportstate's summary prints no Lid: absent, never 0
    assert (lp.width_supported, pp.width_supported) == ({1, 4}, {4})
    assert lp.speed_active == pp.speed_active == 1_250_000_000
    assert pp.width_active == 4


def test_real_perfquery_extended_with_error_counters() -> None:
    pc = parse_perfquery(text("perfquery-x-ext-errors-rhel75.txt"), extended=True)
    values = {n: (raw, w) for n, raw, w in pc.values}
    assert pc.port_select == 1 and pc.extended
    assert values["symbol_error"] == (0, 64)  # PortCountersExtended: 64-bit
    assert values["qp1_dropped"] == (0, 64)
    assert "counter_select2" not in values


def test_real_perfquery_wrapped_and_truncated_paste() -> None:
    """A mail client wrapped the header and the paste ends mid-word: every complete
    counter line is read, the broken ones are skipped."""
    pc = parse_perfquery(text("perfquery-x-netdata2620.txt"), extended=True)
    values = {n: raw for n, raw, _ in pc.values}
    assert values["port_rcv_data"] == 2341975277576
    assert values["port_xmit_data"] == 13672645927
    assert "VL15_dropped" not in values
    counters = {c.name: c for c in merge_counters(None, pc)}
    assert counters["port_rcv_data"].value == 2341975277576 * 4  # words -> bytes


def test_simulator_answers() -> None:
    local = parse_portinfo(text("sim/smpquery-portinfo-local.txt"))
    assert (local.lid, local.width_active, local.speed_active) == (2, 12, 6_640_625_000)
    node = parse_nodeinfo(text("sim/smpquery-nodeinfo-peer.txt"))
    assert (node.guid, node.node_type, node.num_ports, node.local_port) == (
        "0x0000000000200000",
        "switch",
        8,
        1,
    )
    assert parse_nodedesc(text("sim/smpquery-nodedesc-peer.txt")) == "leaf1"
    assert parse_portinfo(text("sim/smpquery-portinfo-peer-port0.txt")).lid == 1
    basic = parse_perfquery(text("sim/perfquery-peer.txt"), extended=False)
    ext = parse_perfquery(text("sim/perfquery-x-peer.txt"), extended=True)
    merged = {c.name: c for c in merge_counters(basic, ext)}
    # the planted 16-bit maximum saturates, as the local sysfs counter would
    assert merged["symbol_error"].raw == 65535 and merged["symbol_error"].saturated
    assert merged["port_rcv_errors"].raw == 7 and not merged["port_rcv_errors"].saturated
    # data and packets from the extended answer: 64-bit, in bytes
    assert merged["port_xmit_data"].width == 64
    assert merged["port_xmit_data"].value == merged["port_xmit_data"].raw * 4
    assert merged["qp1_dropped"].width is None


def test_basic_perfquery_widths_follow_the_kernel() -> None:
    basic = parse_perfquery(text("sim/perfquery-peer.txt"), extended=False)
    widths = {n: w for n, _, w in basic.values}
    assert widths["symbol_error"] == 16
    assert widths["link_downed"] == 8
    assert widths["port_xmit_data"] == 32
    assert widths["port_xmit_wait"] == 32


def test_node_description_is_cleaned_and_bounded() -> None:
    assert clean_description("  gpu-leaf-07\tspine\x00\x1b[31m ") == "gpu-leaf-07 spine??[31m"
    assert len(clean_description("x" * 10_000)) == DESCRIPTION_MAX
    assert clean_description("Ünïcode") == "?n?code"


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "\x00\xff" * 1000,
        "ibwarn: [123] mad_rpc_open_port: can't open UMAD port (mlx5_0:1)\n",
        "LinkWidthActive:.................banana\n",
        "LinkWidthActive:" + "." * 100_000 + "4X 8X\n",
        "# Port info\n" + "Lid:" * 50_000,
        "A" * 1_000_000,
    ],
)
def test_hostile_portinfo_is_a_value_error(garbage: str) -> None:
    with pytest.raises(ValueError):
        parse_portinfo(garbage)


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "PortSelect:....1\n",  # no counter at all
        "PortSelect:....1\nSymbolErrorCounter:....-3\n",
        "PortSelect:....1\nSymbolErrorCounter:....99999999999999999999999\n",
        "PortSelect:....x\nSymbolErrorCounter:....1\n",
    ],
)
def test_hostile_perfquery_is_a_value_error(garbage: str) -> None:
    with pytest.raises(ValueError):
        parse_perfquery(garbage, extended=False)


def test_truncated_nodeinfo_is_a_value_error() -> None:
    cut = text("sim/smpquery-nodeinfo-peer.txt")
    cut = cut[: cut.index("LocalPort")]
    with pytest.raises(ValueError, match="LocalPort"):
        parse_nodeinfo(cut)


def test_fields_keep_the_first_block_and_first_occurrence() -> None:
    fields = parse_fields("# a\nX:..1\nX:..2\n# b\nX:..3\nY:..4\n")
    assert fields == {"X": "1"}
