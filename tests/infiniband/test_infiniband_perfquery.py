"""perfquery's output, parsed (agent/infiniband/perfquery.py): the header's ClassPortInfo
decides which fields are counters, on real outputs from public pages and the simulator's;
the reset mask and OpenSM's clearing threshold as tables."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.infiniband.perfquery import (
    CAP2_ADDITIONAL_EXTENDED,
    PmaCapabilities,
    near_saturation,
    parse_header,
    parse_perfquery,
    reset_mask,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "ibpeer"
ERRORS = ("symbol_error", "link_downed", "port_rcv_errors", "VL15_dropped", "port_xmit_wait")


def text(name: str) -> str:
    return (FIX / name).read_text()


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "# Port extended counters: Lid 2 port 1 (CapMask: 0x1200 CapMask2: 0x0000000)",
            (True, 1, PmaCapabilities(0x1200, 0)),
        ),
        (
            "# Port extended counters: Lid 10 port 1 (CapMask: 0x5300 CapMask2: 0x0000002)",
            (True, 1, PmaCapabilities(0x5300, 2)),
        ),
        (
            "# Port counters: Lid 1 port 7 (CapMask: 0x1300)",
            (False, 7, PmaCapabilities(0x1300, None)),
        ),
        # a 2010 perfquery printed no capability at all
        ("# Port extended counters: Lid 61 port 35", (True, 35, None)),
        # a mail client wrapped the line after "CapMask2:" (netdata issue 2620)
        (
            "# Port extended counters: Lid 21 port 1 (CapMask: 0x1600 CapMask2:",
            (True, 1, PmaCapabilities(0x1600, None)),
        ),
        ("# Port counters: Lid 2 port 1 (CapMask: 0xZZ)", (False, 1, None)),
        ("PortSelect:......................1", None),
    ],
)
def test_header_table(line: str, expected: tuple[bool, int, PmaCapabilities | None] | None) -> None:
    assert parse_header(line + "\n") == expected


def test_capability_bits() -> None:
    ib_switch = PmaCapabilities(0x5300, CAP2_ADDITIONAL_EXTENDED)
    assert ib_switch.extended and ib_switch.extended_ietf and ib_switch.xmit_wait
    assert ib_switch.additional_extended
    # what the upstream mlx5 driver answers for a ConnectX port: extended width only
    mlx5 = PmaCapabilities(0x0200, None)
    assert mlx5.extended and not mlx5.xmit_wait and not mlx5.additional_extended
    noietf = PmaCapabilities(0x0400, 0)
    assert noietf.extended and not noietf.extended_ietf


def test_extended_error_fields_only_where_capability_mask2_vouches_for_them() -> None:
    """A ConnectX HCA's real perfquery -x (netdata issue 2620) prints the additional error
    fields under CapMask2 0: reserved bytes, not counters, so they are dropped; the rhel75
    answer, CapMask2 0x2, carries them as 64-bit counters."""
    hca = parse_perfquery(text("perfquery-x-netdata2620.txt"), extended=True).by_name()
    assert not set(ERRORS) & set(hca)
    assert hca["port_xmit_data"] == (13672645927, 64)
    assert hca["unicast_xmit_packets"] == (1352112493, 64)  # CapMask bit 9: IETF layout
    advertised = parse_perfquery(text("perfquery-x-ext-errors-rhel75.txt"), extended=True)
    assert advertised.caps is not None and advertised.caps.additional_extended
    got = advertised.by_name()
    assert all(got[n] == (0, 64) for n in ERRORS)


def test_simulator_answers_and_a_port_counters_xmit_wait_perfquery_blanked() -> None:
    ext = parse_perfquery(text("sim/perfquery-x-peer.txt"), extended=True).by_name()
    assert "symbol_error" not in ext and ext["port_xmit_data"][1] == 64
    basic = parse_perfquery(text("sim/perfquery-peer.txt"), extended=False).by_name()
    assert basic["port_xmit_wait"][1] == 32 and basic["symbol_error"] == (65535, 16)
    # the same answer from a PMA whose ClassPortInfo lacks bit 12 (as the mlx5 driver's):
    # perfquery prints 0 for PortXmitWait there, which is no reading
    blanked = text("sim/perfquery-peer.txt").replace("(CapMask: 0x1300)", "(CapMask: 0x0200)")
    assert "port_xmit_wait" not in parse_perfquery(blanked, extended=False).by_name()


def test_an_answer_without_capabilities_keeps_only_its_data_counters() -> None:
    old = "\n".join(
        line
        for line in text("perfquery-x-ext-errors-rhel75.txt").splitlines()
        if not line.startswith("# Port")
    )
    got = parse_perfquery(old, extended=True).by_name()
    assert set(got) == {"port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets"}


@pytest.mark.parametrize(
    ("names", "mask"),
    [
        ({"symbol_error"}, 0x1),
        ({"port_xmit_wait"}, 0x10000),
        ({"symbol_error", "port_xmit_wait"}, 0x10001),
        ({"local_link_integrity_errors", "excessive_buffer_overrun_errors"}, 0x600),
        ({"port_xmit_data", "port_rcv_packets"}, 0x9000),
    ],
)
def test_reset_mask_is_perfquerys_counter_select(names: set[str], mask: int) -> None:
    assert reset_mask(names) == mask


def test_reset_mask_refuses_a_counter_port_counters_cannot_clear() -> None:
    with pytest.raises(ValueError, match="unicast_xmit_packets"):
        reset_mask({"unicast_xmit_packets"})


@pytest.mark.parametrize(
    ("raw", "width", "due"),
    [
        (9, 4, False),
        (10, 4, True),  # OpenSM: 4-bit counters at 10
        (15, 4, True),
        (191, 8, False),
        (192, 8, True),  # 255 - 255 // 4
        (49151, 16, False),
        (49152, 16, True),
        (3221225471, 32, False),
        (3221225472, 32, True),
        (4294967295, 32, True),
    ],
)
def test_clearing_threshold_is_opensm_perfmgrs(raw: int, width: int, due: bool) -> None:
    assert near_saturation(raw, width) is due
