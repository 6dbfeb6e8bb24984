"""Table tests for the pure parts of the infiniband sampler: parsers, widths, units."""

from __future__ import annotations

import pytest

from agent.infiniband.parse import (
    NoPmaError,
    build_counters,
    data_unit_bytes,
    has_extended_pma,
    parse_counter,
    parse_hex_int,
    parse_int,
    parse_lid,
    parse_lifespan_seconds,
    parse_node_type,
    parse_rate,
    parse_state,
    parse_text,
    pci_location_from_path,
    pma_width,
)
from agent.infiniband.records import PortCounter, PortState


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("400 Gb/sec (4X NDR)\n", 50_000_000_000),
        ("200 Gb/sec (2X NDR)\n", 25_000_000_000),
        ("800 Gb/sec (4X XDR)\n", 100_000_000_000),
        ("200 Gb/sec (4X HDR)\n", 25_000_000_000),
        ("100 Gb/sec (4X EDR)\n", 12_500_000_000),
        ("25 Gb/sec (1X EDR)\n", 3_125_000_000),
        ("56 Gb/sec (4X FDR)\n", 7_000_000_000),
        ("40 Gb/sec (4X QDR)\n", 5_000_000_000),
        ("10 Gb/sec (4X QDR)\n", 1_250_000_000),
        ("10 Gb/sec (4X)\n", 1_250_000_000),  # i40iw, no speed name
        ("2.5 Gb/sec (1X SDR)\n", 312_500_000),
        ("5 Gb/sec (1X DDR)", 625_000_000),
        ("0 Gb/sec (1X)", 0),
    ],
)
def test_parse_rate(text: str, expected: int) -> None:
    assert parse_rate(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "\n", "fast", "400 Mb/sec (4X NDR)", "-1 Gb/sec (1X)", "N/A", "Gb/sec", "4O0 Gb/sec"],
)
def test_parse_rate_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_rate(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4: ACTIVE\n", PortState(4, "ACTIVE")),
        ("1: DOWN\n", PortState(1, "DOWN")),
        ("5: ACTIVE_DEFER\n", PortState(5, "ACTIVE_DEFER")),
        ("5: LinkUp\n", PortState(5, "LinkUp")),
        ("3: Disabled\n", PortState(3, "Disabled")),
        ("7: Phy Test\n", PortState(7, "Phy Test")),
        ("9: <unknown>\n", PortState(9, "<unknown>")),
    ],
)
def test_parse_state(text: str, expected: PortState) -> None:
    assert parse_state(text) == expected


@pytest.mark.parametrize("text", ["", "ACTIVE", "4", "4:", ": ACTIVE", "x: y", "-1: DOWN"])
def test_parse_state_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_state(text)


def test_parse_node_type() -> None:
    assert parse_node_type("1: CA\n") == "CA"
    assert parse_node_type("4: RNIC\n") == "RNIC"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0\n", 0),
        ("15\n", 15),
        ("4294967295\n", 4294967295),
        ("205143497464492\n", 205143497464492),
        ("18446744073709551615\n", 2**64 - 1),
        ("  42  ", 42),
    ],
)
def test_parse_counter(text: str, expected: int) -> None:
    assert parse_counter(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "-1\n",
        "18446744073709551616\n",  # 2**64: no kernel counter holds that
        "99999999999999999999999999\n",
        "12abc\n",
        "0x10\n",
        "1.5\n",
        "\x00\x00\xff\n",
        "1 2\n",
    ],
)
def test_parse_counter_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_counter(text)
    assert not isinstance(info.value, NoPmaError)


def test_parse_counter_no_pma_is_its_own_error() -> None:
    with pytest.raises(NoPmaError):
        parse_counter("N/A (no PMA)\n")


@pytest.mark.parametrize(("text", "expected"), [("0x1a\n", 26), ("0x0\n", 0), ("0xFFFF", 65535)])
def test_parse_lid(text: str, expected: int) -> None:
    assert parse_lid(text) == expected


@pytest.mark.parametrize("text", ["26", "", "0x", "0xzz", "lid"])
def test_parse_lid_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_lid(text)


def test_parse_small_values() -> None:
    assert parse_int("-1\n") == -1
    assert parse_int("1\n") == 1
    assert parse_hex_int("0x1\n") == 1
    assert parse_text("  MT4129 \n") == "MT4129"
    with pytest.raises(ValueError):
        parse_int("one")
    with pytest.raises(ValueError):
        parse_hex_int("0xg")


@pytest.mark.parametrize(("text", "seconds"), [("10\n", 0.01), ("0\n", 0.0), ("1000\n", 1.0)])
def test_lifespan_is_milliseconds(text: str, seconds: float) -> None:
    # node_exporter integer-divides by 1000 and exports 0 for the usual 10 ms; we do not.
    assert parse_lifespan_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("source", "name", "extended", "width"),
    [
        ("counters", "symbol_error", False, 16),
        ("counters", "link_error_recovery", True, 8),
        ("counters", "link_downed", True, 8),
        ("counters", "port_rcv_errors", True, 16),
        ("counters", "port_rcv_remote_physical_errors", True, 16),
        ("counters", "port_rcv_switch_relay_errors", True, 16),
        ("counters", "port_xmit_discards", True, 16),
        ("counters", "port_xmit_constraint_errors", True, 8),
        ("counters", "port_rcv_constraint_errors", True, 8),
        ("counters", "local_link_integrity_errors", True, 4),
        ("counters", "excessive_buffer_overrun_errors", True, 4),
        ("counters", "VL15_dropped", True, 16),
        ("counters", "port_xmit_wait", True, 32),  # PORT_PMA_ATTR even in the ext table
        ("counters", "port_xmit_data", False, 32),
        ("counters", "port_xmit_data", True, 64),
        ("counters", "port_rcv_packets", False, 32),
        ("counters", "unicast_xmit_packets", False, 64),
        ("counters", "port_rcv_discards", True, None),  # not in the kernel's PMA table
        ("counters_ext", "port_xmit_data_64", False, 64),
        ("counters_ext", "port_multicast_rcv_packets", False, 64),
        ("counters_ext", "something_new", False, None),
        ("hw_counters", "np_cnp_sent", True, None),
        ("hw_counters", "port_xmit_wait", True, None),
    ],
)
def test_pma_width(source: str, name: str, extended: bool, width: int | None) -> None:
    assert pma_width(source, name, extended) == width


@pytest.mark.parametrize(
    ("counters", "extended"),
    [
        ({"port_xmit_data": 10, "unicast_xmit_packets": 0}, True),
        ({"port_xmit_data": 10, "multicast_rcv_packets": 0}, True),
        ({"port_xmit_data": 2**32, "port_rcv_data": 1}, True),  # more than 32 bits hold
        ({"port_rcv_packets": 6825908347}, True),
        ({"port_xmit_data": 2**32 - 1, "port_xmit_wait": 2**32 - 1}, False),
        ({"symbol_error": 2**40}, False),  # only data/packet counters prove it
        ({}, False),
    ],
)
def test_has_extended_pma(counters: dict[str, int], extended: bool) -> None:
    assert has_extended_pma(counters) is extended


@pytest.mark.parametrize(
    ("driver", "device", "unit"),
    [
        (None, "mlx5_0", 4),
        ("mlx5_core", "mlx5_0", 4),
        (None, "hfi1_0", 8),
        ("hfi1", "opa_renamed", 8),
        ("mlx4_core", "hfi1_0", 4),  # the bound driver wins over the name
        (None, "irdma0", 4),
    ],
)
def test_data_unit_bytes(driver: str | None, device: str, unit: int) -> None:
    assert data_unit_bytes(driver, device) == unit


def test_build_counters_scales_data_and_assigns_widths() -> None:
    got = build_counters(
        [
            ("hw_counters", "np_cnp_sent", 7),
            ("counters", "port_xmit_wait", 2**32 - 1),
            ("counters", "port_xmit_data", 1000),
            ("counters_ext", "port_rcv_data_64", 5),
            ("counters", "link_downed", 255),
        ],
        data_unit=4,
    )
    assert got == (
        PortCounter("counters", "link_downed", 255, 1, 8),
        PortCounter("counters", "port_xmit_data", 1000, 4, 32),
        PortCounter("counters", "port_xmit_wait", 2**32 - 1, 1, 32),
        PortCounter("counters_ext", "port_rcv_data_64", 5, 4, 64),
        PortCounter("hw_counters", "np_cnp_sent", 7, 1, None),
    )
    assert [c.value for c in got] == [255, 4000, 2**32 - 1, 20, 7]
    assert [c.saturated for c in got] == [True, False, True, False, None]


@pytest.mark.parametrize(
    ("raw", "width", "saturated"),
    [
        (15, 4, True),
        (14, 4, False),
        (16, 4, False),  # not possible from a 4-bit field; not "at the max" either
        (255, 8, True),
        (65535, 16, True),
        (4294967295, 32, True),
        (4294967294, 32, False),
        (2**64 - 1, 64, True),
        (0, 8, False),
        (4294967295, None, None),
    ],
)
def test_saturated(raw: int, width: int | None, saturated: bool | None) -> None:
    assert PortCounter("counters", "x", raw, 1, width).saturated is saturated


@pytest.mark.parametrize(
    ("resolved", "expected"),
    [
        (
            "devices/pci0000:05/0000:05:02.0/0000:07:00.0/0000:08:03.0/0000:09:00.0/infiniband/i40iw0",
            (
                "0000:09:00.0",
                "devices/pci0000:05/0000:05:02.0/0000:07:00.0/0000:08:03.0/0000:09:00.0",
            ),
        ),
        ("class/infiniband/mlx5_0", None),  # a plain directory (procfs fixtures)
        ("devices/scif_dma_0/infiniband/scif0", None),  # a virtual device
        ("devices/virtual/infiniband/rxe0", None),
    ],
)
def test_pci_location_from_path(resolved: str, expected: tuple[str, str] | None) -> None:
    assert pci_location_from_path(resolved) == expected
