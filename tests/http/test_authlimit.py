"""exporter.http.authlimit: which bcrypt checks run, which are refused at once."""

from __future__ import annotations

import pytest

from agent.core.errors import ConfigError
from exporter.http.authlimit import BUSY, THROTTLED, AuthGate, AuthLimits


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fail(gate: AuthGate, address: str) -> None:
    assert gate.admit(address) is None
    gate.done(address, ok=False)


def test_an_address_gets_its_burst_of_failures_then_one_per_interval() -> None:
    clock = Clock()
    gate = AuthGate(AuthLimits(failures_burst=3, failure_interval=2.0), clock)
    for _ in range(3):
        fail(gate, "10.0.0.9")
    assert gate.admit("10.0.0.9") == (THROTTLED, 2)
    clock.now += 1.0
    assert gate.admit("10.0.0.9") == (THROTTLED, 1)
    clock.now += 1.0  # one failure earned back
    fail(gate, "10.0.0.9")
    assert gate.admit("10.0.0.9") == (THROTTLED, 2)
    # another address is not affected
    assert gate.admit("10.0.0.10") is None


def test_successes_cost_nothing_and_a_full_budget_is_forgotten() -> None:
    clock = Clock()
    gate = AuthGate(AuthLimits(failures_burst=2, failure_interval=1.0), clock)
    for _ in range(10):
        assert gate.admit("10.0.0.9") is None
        gate.done("10.0.0.9", ok=True)
    fail(gate, "10.0.0.9")
    clock.now += 5.0
    assert gate.admit("10.0.0.9") is None  # earned back in full: forgotten
    assert gate._budgets == {}


def test_one_check_at_a_time_per_address() -> None:
    gate = AuthGate(AuthLimits(), Clock())
    assert gate.admit("2001:db8:1:2::/64") is None
    assert gate.admit("2001:db8:1:2::/64") == (THROTTLED, 1)
    gate.done("2001:db8:1:2::/64", ok=True)
    assert gate.admit("2001:db8:1:2::/64") is None


def test_checks_in_all_are_capped() -> None:
    gate = AuthGate(AuthLimits(max_checks=2), Clock())
    assert gate.admit("a") is None
    assert gate.admit("b") is None
    assert gate.admit("c") == (BUSY, 1)
    assert gate.checking == 2
    gate.done("a", ok=False)
    assert gate.admit("c") is None


def test_remembered_addresses_are_bounded() -> None:
    gate = AuthGate(AuthLimits(failures_burst=1, max_addresses=3), Clock())
    for i in range(10):
        fail(gate, f"10.0.0.{i}")
    assert len(gate._budgets) == 3
    assert gate.admit("10.0.0.9") == (THROTTLED, 2)  # the most recent are kept
    assert gate.admit("10.0.0.0") is None  # the oldest forgotten


@pytest.mark.parametrize(
    ("field", "value"),
    [("failures_burst", 0), ("max_checks", 0), ("max_addresses", 0), ("failure_interval", 0.0)],
)
def test_limits_must_be_positive(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        AuthLimits(**{field: value})  # type: ignore[arg-type]
