"""exporter.http.limits: which connection is closed, or refused, when a limit is reached."""

from __future__ import annotations

import pytest

from agent.core.clientaddr import client_key
from agent.core.errors import ConfigError
from exporter.http.limits import ConnectionLimits, ConnectionTable


def test_an_address_at_its_cap_loses_its_oldest_idle_connection() -> None:
    table: ConnectionTable[str] = ConnectionTable(max_connections=100, max_per_address=3)
    for name in ("a1", "a2", "a3"):
        assert table.admit(name, "A") == []
    table.idle("a2")
    table.idle("a1")  # a2 went idle first: it is the oldest idle one
    assert table.admit("a4", "A") == ["a2"]
    assert table.admit("b1", "B") == []  # another address is not affected
    assert table.count("A") == 3
    assert table.count("B") == 1


def test_an_address_with_only_pending_or_busy_connections_refuses_silent_newcomers() -> None:
    table: ConnectionTable[str] = ConnectionTable(max_connections=100, max_per_address=2)
    table.admit("a1", "A")
    table.admit("a2", "A")
    table.busy("a1")
    assert table.admit("a3", "A") is None
    assert "a3" not in list(table)
    # A newcomer that already sent its request replaces the oldest pending one...
    assert table.admit("a4", "A", has_request=True) == ["a2"]
    # ...but never a busy one.
    table.busy("a4")
    assert table.admit("a5", "A", has_request=True) is None
    assert sorted(table) == ["a1", "a4"]


def test_the_total_cap_takes_from_the_address_holding_the_most() -> None:
    table: ConnectionTable[str] = ConnectionTable(max_connections=4, max_per_address=4)
    table.admit("scraper", "S")
    table.idle("scraper")  # the oldest idle connection of all
    for name in ("x1", "x2", "x3"):
        table.admit(name, "X")
    assert table.admit("y1", "Y") == ["x1"]
    # X holds 2, Y would: equals never take each other's connections; Y has none idle
    assert table.admit("y2", "Y") is None
    table.idle("y1")
    assert table.admit("y2", "Y") == ["y1"]  # its own oldest idle one
    # S, X and Y hold 1, 2 and 1: X is the heaviest, and holds more than Z would
    assert table.admit("z1", "Z") == ["x2"]
    assert "scraper" in list(table)


def test_a_flood_of_equals_at_the_total_cap_does_not_churn() -> None:
    table: ConnectionTable[str] = ConnectionTable(max_connections=8, max_per_address=4)
    for a in "ABCD":
        for i in range(2):
            table.admit(f"{a}{i}", a)
    # every address holds 2: a third from any of them takes nobody's
    assert all(table.admit(f"{a}9", a) is None for a in "ABCD")
    # a newcomer holding none gets in
    assert table.admit("probe", "K") == ["A0"]


def test_nothing_busy_is_closed_to_make_room() -> None:
    table: ConnectionTable[str] = ConnectionTable(max_connections=2, max_per_address=2)
    for name in ("a1", "b1"):
        table.admit(name, name[0])
        table.busy(name)
    assert table.admit("c1", "C") is None
    table.remove("a1")
    table.remove("a1")  # twice is fine
    assert table.admit("c1", "C") == []
    assert len(table) == 2


def test_state_changes_reorder_by_age() -> None:
    table: ConnectionTable[str] = ConnectionTable(max_connections=10, max_per_address=2)
    table.admit("a1", "A")
    table.admit("a2", "A")
    table.idle("a1")
    table.idle("a2")
    table.pending("a1")  # a1 got a new request: a2 is the only idle one left
    table.idle("a1")  # and a1 is idle again, newer than a2
    assert table.admit("a3", "A") == ["a2"]
    assert table.state("a1") == "idle"
    assert table.state("a3") == "pending"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_requests", 0),
        ("max_connections", 0),
        ("max_per_address", -1),
        ("header_timeout", 0.0),
        ("idle_timeout", -1.0),
        ("send_timeout", 0.0),
    ],
)
def test_limits_must_be_positive(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        ConnectionLimits(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("addr", "key"),
    [
        (("10.1.2.3", 5555), "10.1.2.3"),
        (("::ffff:10.1.2.3", 5555, 0, 0), "10.1.2.3"),
        (("2001:db8:1:2:3:4:5:6", 5555, 0, 0), "2001:db8:1:2::/64"),
        (("fe80::1%eth0", 5555, 0, 2), "fe80::/64"),
        ("/run/x.sock", "/run/x.sock"),
    ],
)
def test_client_key_counts_ipv6_by_its_64(addr: object, key: str) -> None:
    assert client_key(addr) == key
