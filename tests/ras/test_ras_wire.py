"""One RAS conversation (agent/ras/wire.py) against real TCP servers on 127.0.0.1: the
stand-in speaking NCCL's protocol, and every way a broken or hostile one misbehaves. Each
must end within its deadline, with its reason, and never read past the size cap."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from agent.ras.wire import HANDSHAKE_SECONDS, Hold, QueryError, ReadBudget, query
from tests.ras_standin import RasStandIn, job

ANSWER = job(4, 100)


def test_the_protocol_and_the_answer() -> None:
    with RasStandIn([ANSWER]) as ras:
        got = query("127.0.0.1", ras.port, deadline_seconds=10, max_bytes=1 << 20, ras_timeout=5)
    assert got.data == ANSWER and got.attempts == 1
    assert ras.commands == ["CLIENT PROTOCOL 2", "TIMEOUT 5", "SET FORMAT json", "STATUS"]
    assert ras.statuses == 1


@pytest.mark.parametrize(
    ("behaviour", "reason", "deadline"),
    [
        ("wrong_protocol", "protocol", 10.0),
        ("not_ras", "protocol", 10.0),
        ("no_json", "unsupported", 10.0),
        ("reset", "reset", 10.0),
        ("endless", "too_large", 30.0),
        ("huge", "too_large", 30.0),
        ("slow", "timeout", 3.0),
    ],
)
def test_a_misbehaving_server_costs_at_most_the_deadline(
    behaviour: str, reason: str, deadline: float
) -> None:
    with RasStandIn([ANSWER], behaviour=behaviour, delay=0.05) as ras:
        t0 = time.monotonic()
        with pytest.raises(QueryError) as info:
            query("127.0.0.1", ras.port, deadline_seconds=deadline, max_bytes=1 << 20)
        took = time.monotonic() - t0
    assert info.value.reason == reason, str(info.value)
    assert took < deadline + 1.0
    assert "\n" not in str(info.value)


def test_a_clean_close_mid_answer_is_a_truncated_answer() -> None:
    with RasStandIn([ANSWER], behaviour="close_early") as ras:
        got = query("127.0.0.1", ras.port, deadline_seconds=10, max_bytes=1 << 20)
    assert got.data == ANSWER[: len(ANSWER) // 2]  # the parser refuses it (malformed)


def test_nothing_listening_is_refused() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(QueryError) as info:
        query("127.0.0.1", port, deadline_seconds=5, max_bytes=1 << 20)
    assert info.value.reason == "refused"


def test_a_silent_socket_is_retried_once_then_times_out_within_the_deadline() -> None:
    with RasStandIn([ANSWER], behaviour="silent") as ras:
        t0 = time.monotonic()
        with pytest.raises(QueryError) as info:
            query("127.0.0.1", ras.port, deadline_seconds=10, max_bytes=1 << 20)
        took = time.monotonic() - t0
    assert info.value.reason == "timeout"
    assert ras.connections == 2  # a stopped process's socket: once more, on a new connection
    assert 2 * HANDSHAKE_SECONDS - 0.5 < took < 10.5


def test_a_silent_socket_with_no_time_for_a_retry_is_not_retried() -> None:
    with RasStandIn([ANSWER], behaviour="silent") as ras, pytest.raises(QueryError):
        query("127.0.0.1", ras.port, deadline_seconds=3, max_bytes=1 << 20)
    assert ras.connections == 1


def test_the_size_cap_is_exact() -> None:
    with RasStandIn([ANSWER]) as ras:
        assert query("127.0.0.1", ras.port, deadline_seconds=5, max_bytes=len(ANSWER)).data
        with pytest.raises(QueryError) as info:
            query("127.0.0.1", ras.port, deadline_seconds=5, max_bytes=len(ANSWER) - 1)
    assert info.value.reason == "too_large"


def test_answers_read_at_once_share_one_byte_budget() -> None:
    """A budget of two 200 kB answers (400 kB: 200 kB shared, 200 kB that one read at a time
    may use): the first 300 kB answer is read whole (the shared part, then the reserve) and
    held until its reader lets go (decoded); a second one waits for the budget and times out
    within its own deadline, counted as ``timeout``; once the first is let go, the second is
    read whole. The budget is whole again at the end."""
    big = b"x" * 300_000
    budget = ReadBudget(200_000)
    with RasStandIn([big]) as one, RasStandIn([big]) as two:
        first = Hold(budget)
        got = query("127.0.0.1", one.port, deadline_seconds=10, max_bytes=1 << 20, hold=first)
        assert got.data == big and first.bytes == len(big) and budget.free == 100_000
        t0 = time.monotonic()
        with pytest.raises(QueryError) as info:
            query("127.0.0.1", two.port, deadline_seconds=1.0, max_bytes=1 << 20, hold=Hold(budget))
        assert info.value.reason == "timeout" and "read budget" in str(info.value)
        assert time.monotonic() - t0 < 2.0
        assert budget.free == 100_000  # the failed read gave back what it had taken
        second = Hold(budget)
        answers: list[bytes] = []

        def read() -> None:
            answers.append(
                query(
                    "127.0.0.1", two.port, deadline_seconds=10, max_bytes=1 << 20, hold=second
                ).data
            )

        reader = threading.Thread(target=read)
        reader.start()
        time.sleep(0.3)  # it waits for the budget
        assert not answers
        first.release()
        reader.join(10)
        assert answers == [big]
        second.release()
    assert budget.free == budget.total


def test_many_reads_at_once_never_stall_each_other() -> None:
    """Eight jobs answering 90 kB at once against a budget of two 100 kB answers, each
    answer let go as soon as it is read (decoded): every one is read, within the deadline.
    (Reads that each hold part of a budget with no reserve wait for each other until their
    deadlines: 15 of 16 jobs timed out that way on a loaded machine.)"""
    answer = b"y" * 90_000
    budget = ReadBudget(100_000)
    servers = [RasStandIn([answer]) for _ in range(8)]
    got: list[bytes] = []
    try:

        def read(port: int) -> None:
            hold = Hold(budget)
            try:
                got.append(
                    query("127.0.0.1", port, deadline_seconds=20, max_bytes=1 << 20, hold=hold).data
                )
            finally:
                hold.release()

        readers = [threading.Thread(target=read, args=(s.port,)) for s in servers]
        for r in readers:
            r.start()
        for r in readers:
            r.join(30)
    finally:
        for s in servers:
            s.close()
    assert got == [answer] * 8
    assert budget.free == budget.total
