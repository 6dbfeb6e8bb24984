"""A netdev pass leaves no reference cycles behind (issue 46: nothing allocated per pass that
outlives it). pyroute2's parsed messages each kept themselves in their own ``chain`` list, and
a failed question raised its error from a frame that held it: every link dump of a pass
(hundreds of objects) waited for the cycle collector. The answers are now read into plain
dicts (agent/netdev/linkmsg.py); these tests hold any pass to leaving nothing at all to the
collector. Real netlink in this namespace (``lo``; a name no namespace has)."""

from __future__ import annotations

import collections
from collections.abc import Iterator

import pytest

from agent.core.sysfs import Issues
from agent.netdev.netlink import NetlinkError
from agent.netdev.rtnl import LinkSocket
from agent.netdev.sampler import read_links
from tests.cycles import cyclic_garbage


@pytest.fixture(autouse=True)
def _warm() -> Iterator[None]:
    # pyroute2 builds its message classes' tables on first use: not a pass's garbage
    read_links(None, None, Issues(None))
    yield


def test_a_link_dump_and_a_missing_link_leave_no_messages_or_errors_to_the_collector() -> None:
    def passes() -> None:
        for _ in range(5):
            links, _ = read_links(None, None, Issues(None))
            assert any(link.name == "lo" for link in links)
            links, missing = read_links(None, ["lo", "fs-none0"], Issues(None))
            assert [link.name for link in links] == ["lo"] and missing == ["fs-none0"]

    left = cyclic_garbage(passes)
    kinds = collections.Counter(type(o).__qualname__ for o in left)
    assert left == [], kinds.most_common(10)


def test_a_failed_question_leaves_nothing_to_the_collector() -> None:
    sock = LinkSocket()

    codes: list[int] = []

    def ask() -> None:
        for _ in range(5):
            try:  # not pytest.raises: its ExceptionInfo and this frame make a cycle of their own
                sock.link("get", ifname="fs-none0")
            except NetlinkError as exc:
                codes.append(exc.code)

    try:
        assert cyclic_garbage(ask) == []
    finally:
        sock.close()
    assert codes == [19] * 5  # ENODEV, as the sampler reads it
