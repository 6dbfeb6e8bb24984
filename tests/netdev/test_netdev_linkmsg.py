"""agent.netdev.linkmsg: RTM_GETLINK questions and answers read with ``struct``, against the
kernel (real answers in this namespace and a veth's in a fresh one, read by pyroute2's own
``ifinfmsg`` beside) and against what no kernel writes: truncated and overlong lengths, an
attribute of length 0 (a reader that trusts it never advances), flag bits in a type,
unknown operstates, short and long counter structs, names without a NUL or not UTF-8,
random bytes, a dump of 20,000 links. Errors are ValueError, one line, never a hang."""

from __future__ import annotations

import contextlib
import errno
import random
import socket
import struct
import time
from collections.abc import Iterator

import pytest
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

from agent.core.sysfs import Issues
from agent.netdev import linkmsg
from agent.netdev.linkmsg import (
    IFINFOMSG,
    NLAHDR,
    NLMSGHDR,
    RTM_NEWLINK,
    STATS64_NAMES,
    answers,
    question,
)
from agent.netdev.netlink import NetlinkError, route_socket
from agent.netdev.rtnl import LinkSocket
from agent.netdev.sampler import read_links
from agent.netdev.stats import to_link


def attr(kind: int, payload: bytes) -> bytes:
    return NLAHDR.pack(4 + len(payload), kind) + payload + b"\0" * (-len(payload) % 4)


def message(kind: int, body: bytes, seq: int = 1, length: int | None = None) -> bytes:
    size = NLMSGHDR.size + len(body) if length is None else length
    return NLMSGHDR.pack(size, kind, 0, seq, 0) + body + b"\0" * (-len(body) % 4)


def link_body(index: int, *attrs: bytes) -> bytes:
    return IFINFOMSG.pack(0, 1, index, 0x1043, 0) + b"".join(attrs)


def one(data: bytes) -> linkmsg.Answer:
    (got,) = list(answers(data))
    return got


# -- the kernel's answers ------------------------------------------------------------------


def ask(sock: socket.socket, seq: int, ifname: str | None) -> list[bytes]:
    """The raw datagrams answering one question, up to NLMSG_DONE (a dump) or the first."""
    sock.send(question(seq, ifname))
    out = []
    while True:
        data = sock.recv(65536)
        out.append(data)
        if ifname is not None or any(a.kind == "done" for a in answers(data)):
            return out


def test_the_kernels_answers_read_as_pyroute2_reads_them() -> None:
    sock = route_socket()
    try:
        datagrams = ask(sock, 7, None)
        (lo_datagram,) = ask(sock, 8, "lo")
    finally:
        sock.close()
    mine = [a.link for d in datagrams for a in answers(d) if a.kind == "link"]
    assert any(m is not None and m["IFLA_IFNAME"] == "lo" for m in mine)
    # pyroute2 on the same bytes, message by message
    theirs = []
    for d in datagrams:
        offset = 0
        while offset <= len(d) - 16:
            length, kind = struct.unpack_from("=IH", d, offset)
            if kind == RTM_NEWLINK:
                msg = ifinfmsg(d, offset=offset)
                msg.decode()
                theirs.append(msg)
            offset += (length + 3) & ~3
    assert len(theirs) == len(mine) > 0
    for m, t in zip(mine, theirs, strict=True):
        assert m is not None
        assert to_link(m) == to_link(t)
    (lo,) = [a for a in answers(lo_datagram)]
    assert lo.seq == 8 and lo.kind == "link" and lo.link is not None
    assert lo.link["IFLA_IFNAME"] == "lo" and lo.link["IFLA_OPERSTATE"] == "UNKNOWN"


def test_a_missing_name_and_a_name_too_long_are_the_kernels_errors() -> None:
    sock = LinkSocket()
    try:
        with pytest.raises(NetlinkError) as missing:
            sock.link("get", ifname="fs-none0")
        assert missing.value.code == errno.ENODEV
        with pytest.raises(NetlinkError):
            sock.link("get", ifname="y" * 40)
    finally:
        sock.close()


def test_the_question_is_what_iproute2_sends() -> None:
    # `ip link show dev eth0` sends RTM_GETLINK, NLM_F_REQUEST, an ifinfomsg of zeros and
    # IFLA_IFNAME "eth0\0" padded to 4: 16 + 16 + 12 bytes
    q = question(5, "eth0")
    assert len(q) == 44
    assert NLMSGHDR.unpack_from(q) == (44, 18, 1, 5, 0)
    assert q[16:32] == b"\0" * 16
    assert q[32:] == struct.pack("=HH", 9, 3) + b"eth0\0" + b"\0" * 3
    dump = question(6, None)
    assert NLMSGHDR.unpack_from(dump) == (32, 18, 0x301, 6, 0)


# -- what no kernel writes -------------------------------------------------------------------


def test_every_attribute_read_and_the_rest_passed_over() -> None:
    stats = struct.pack("=25Q", *range(1, 26))  # a 5.19+ kernel: two fields more than read
    body = link_body(
        9,
        attr(1, b"\x02" * 6),  # IFLA_ADDRESS: not read
        attr(3 | 0x8000, b"ib0\0"),  # flag bits on the type are not the type
        attr(4, struct.pack("=I", 4092)),
        attr(16, b"\x06"),
        attr(23, stats),
        attr(26 | 0x8000, attr(2, b"\0" * 300)),  # IFLA_AF_SPEC, nested: not read
        attr(33, b"\x01"),
        attr(35, struct.pack("=I", 7)),
    )
    got = one(message(RTM_NEWLINK, body, seq=3))
    assert got.seq == 3 and got.kind == "link" and got.link is not None
    assert got.link == {
        "index": 9,
        "IFLA_IFNAME": "ib0",
        "IFLA_MTU": 4092,
        "IFLA_OPERSTATE": "UP",
        "IFLA_STATS64": dict(zip(STATS64_NAMES, range(1, 24), strict=True)),
        "IFLA_CARRIER": 1,
        "IFLA_CARRIER_CHANGES": 7,
    }
    link = to_link(got.link)
    assert (link.name, link.mtu_bytes, link.operstate, link.carrier) == ("ib0", 4092, "up", 1)
    assert link.stats is not None and link.stats.tx_compressed == 23


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (NLMSGHDR.pack(8, RTM_NEWLINK, 0, 1, 0), "netlink message of 8 bytes"),
        (NLMSGHDR.pack(4096, RTM_NEWLINK, 0, 1, 0) + b"\0" * 16, "of 4096 bytes, 32 left"),
        (message(RTM_NEWLINK, b"\0" * 8), "link message body of 8 bytes"),
        (message(RTM_NEWLINK, link_body(2) + NLAHDR.pack(0, 3)), "attribute 3 of 0 bytes"),
        (message(RTM_NEWLINK, link_body(2) + NLAHDR.pack(2, 3)), "attribute 3 of 2 bytes"),
        (message(RTM_NEWLINK, link_body(2) + NLAHDR.pack(900, 23) + b"\0" * 8), "of 900 bytes"),
        (message(2, b"\0\0"), "netlink error message of 18 bytes"),
        (message(3, b"") + b"\x01\x02\x03", "3 bytes after the last netlink message"),
    ],
)
def test_lengths_that_do_not_fit_are_refused_in_one_line(data: bytes, match: str) -> None:
    with pytest.raises(ValueError, match=match) as refused:
        list(answers(data))
    assert "\n" not in str(refused.value)


def test_odd_values_are_read_as_far_as_they_go() -> None:
    body = link_body(
        4,
        attr(3, b"\xffname-without-nul"),
        attr(4, b"\x01"),  # an MTU of one byte: absent
        attr(16, b"\x09"),  # no such IF_OPER_ state
        attr(23, struct.pack("=3Q", 5, 6, 7)),  # a short struct: what it holds
        attr(33, b""),
    )
    link = one(message(RTM_NEWLINK, body)).link
    assert link is not None
    assert link["IFLA_IFNAME"] == "\ufffdname-without-nul"
    assert link["IFLA_MTU"] is None and link["IFLA_CARRIER"] is None
    assert link["IFLA_OPERSTATE"] == "9"
    assert link["IFLA_STATS64"] == {"rx_packets": 5, "tx_packets": 6, "rx_bytes": 7}
    with pytest.raises(ValueError, match="unknown operstate '9'"):
        to_link(link)  # the sampler records it as a parse issue of that interface


def test_errors_acknowledgements_done_and_other_types_in_one_datagram() -> None:
    data = (
        message(2, struct.pack("=i", -errno.ENODEV) + b"\0" * 16, seq=1)
        + message(2, struct.pack("=i", 0) + b"\0" * 16, seq=2)
        + message(24, b"\0" * 12, seq=3)  # RTM_NEWROUTE: not asked for
        + message(3, struct.pack("=i", 0), seq=4)
    )
    got = [(a.seq, a.kind, a.error) for a in answers(data)]
    assert got == [(1, "error", errno.ENODEV), (2, "error", 0), (3, "other", 0), (4, "done", 0)]


def test_random_bytes_are_read_or_refused_never_anything_else() -> None:
    rng = random.Random(46)
    good = message(RTM_NEWLINK, link_body(3, attr(3, b"eth0\0"), attr(16, b"\x06")))
    start = time.process_time()
    for _ in range(3000):
        data = bytearray(good + good)
        for _ in range(rng.randint(1, 6)):  # a few bytes changed, or cut short, or both
            data[rng.randrange(len(data))] = rng.randrange(256)
        if rng.random() < 0.3:
            data = data[: rng.randrange(len(data))]
        try:
            for a in answers(bytes(data)):
                assert a.kind in ("link", "error", "done", "other")
        except ValueError as exc:
            assert "\n" not in str(exc)
    for _ in range(500):
        with contextlib.suppress(ValueError):
            list(answers(rng.randbytes(rng.randrange(200))))
    assert time.process_time() - start < 20  # linear: no length makes it loop


def test_a_dump_of_twenty_thousand_links_reads_in_one_pass() -> None:
    one_link = message(
        RTM_NEWLINK,
        link_body(1, attr(3, b"veth12345678\0"), attr(23, struct.pack("=23Q", *range(23)))),
    )
    data = one_link * 20_000
    got = list(answers(data))
    assert len(got) == 20_000 and all(a.link is not None for a in got)


# -- the sampler's reading of them -----------------------------------------------------------


class Garbled:
    """A route socket answering one name with bytes no kernel writes."""

    def __init__(self, bad: str) -> None:
        self.bad = bad

    def get_links(self) -> Iterator[dict[str, object]]:
        raise ValueError("netlink message of 8 bytes")

    def link(self, command: str, *, ifname: str) -> list[dict[str, object]]:
        if ifname == self.bad:
            return list(answers(message(RTM_NEWLINK, b"\0" * 4)))
        return [{"index": 5, "IFLA_IFNAME": ifname, "IFLA_OPERSTATE": "UP"}]

    def close(self) -> None:
        return None


def test_an_answer_that_does_not_parse_costs_that_interface_only() -> None:
    issues = Issues(None)
    links, missing = read_links(None, ["eth0", "eth1"], issues, lambda ns: Garbled("eth0"))
    assert [link.name for link in links] == ["eth1"] and missing == []
    (issue,) = issues.freeze()
    assert (issue.path, issue.reason) == ("netlink/link/eth0", "parse")
    assert "link message body of 4 bytes" in issue.detail
    issues = Issues(None)
    links, _ = read_links(None, None, issues, lambda ns: Garbled(""))
    assert links == [] and [(i.path, i.reason) for i in issues.freeze()] == [
        ("netlink/link", "parse")
    ]
