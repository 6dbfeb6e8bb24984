"""agent.netdev.ethtool and agent.netdev.rtnl against the kernel's answers: a real veth with
64 queues (577 statistics) in a fresh namespace compared with pyroute2's own readers (its
ethtool ioctl, and ``IPRoute`` for netlink), and a stand-in kernel (the ioctl answered in the
caller's buffers as the kernel's ``ethtool_get_strings`` and ``ethtool_get_stats`` write
them) for what no veth does: a count that grows between two calls, names that change under
the same count, 10,000 statistics, names that fill all 32 bytes or are not UTF-8.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import re
import secrets
import struct
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyroute2.ethtool.ioctl import (
    ETH_GSTRING_LEN,
    ETHTOOL_GSSET_INFO,
    ETHTOOL_GSTATS,
    ETHTOOL_GSTRINGS,
    SIOCETHTOOL,
    IfReq,
    IfReqSsetInfo,
    IoctlEthtool,
)
from pyroute2.iproute.linux import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from agent.core.errors import NoData
from agent.core.sysfs import SysfsReader
from agent.netdev import ethtool, linkmsg
from agent.netdev.ethtool import HEADROOM, CountChangedError, EthtoolStatistics, KnownNames
from agent.netdev.netlink import NoSuchDevice, NotSupportedError, pyroute2_netns
from agent.netdev.rtnl import LinkSocket
from agent.netdev.sampler import NetdevSampler, open_ethtool
from agent.netdev.stats import DEFAULT_ETHTOOL_INCLUDE, to_link

EVERYTHING = re.compile(r".*")


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def wide_veth() -> Iterator[tuple[str, str]]:
    """(namespace, interface): a veth with 64 queues each way, up, in a fresh namespace."""
    tag = secrets.token_hex(3)
    ns, name = f"fseth-{tag}", f"fsq{tag}"
    ip("netns", "add", ns)
    try:
        queues = ["numtxqueues", "64", "numrxqueues", "64"]
        ip("-n", ns, "link", "add", name, *queues, "type", "veth", "peer", "name", f"{name}p")
        ip("-n", ns, "link", "set", name, "up")
        ip("-n", ns, "link", "set", f"{name}p", "up")
        yield ns, name
    finally:
        ip("netns", "del", ns)


def in_namespace(ns: str, fn: Callable[[], object]) -> object:
    """``fn()`` in a thread that entered ``ns`` (the test's own thread never moves)."""
    out: list[object] = []

    def run() -> None:
        pyroute2_netns.setns(ns, flags=0)
        out.append(fn())

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    return out[0]


def test_a_real_veth_reads_as_pyroute2_reads_it(wide_veth: tuple[str, str]) -> None:
    ns, name = wide_veth

    def both() -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        theirs = IoctlEthtool(name)
        try:
            want = [(str(n), int(v)) for n, v in theirs.get_statistics()]
        finally:
            theirs.close()
        ours = EthtoolStatistics()
        try:
            return ours.statistics(name, EVERYTHING), want
        finally:
            ours.close()

    got, want = in_namespace(ns, both)  # type: ignore[misc]
    assert len(want) > 500  # veth: peer_ifindex and a set per queue
    assert got == want
    assert got[0][0] == "peer_ifindex"


def test_a_real_veth_through_the_sampler_keeps_its_names_across_passes(
    wide_veth: tuple[str, str], tmp_path: Path
) -> None:
    ns, name = wide_veth
    include = re.compile(r"peer_ifindex|rx_queue_63_xdp_packets")
    sampler = NetdevSampler(
        SysfsReader(tmp_path),
        include=re.compile(re.escape(name)),
        ethtool_include=include,
        netns=ns,
    )
    for _ in range(3):
        snap = sampler.sample()
        (nd,) = snap.netdevs
        assert nd.ethtool is not None
        assert [s.name for s in nd.ethtool.gauges] == ["peer_ifindex"]
        assert [s.name for s in nd.ethtool.counters] == ["rx_queue_63_xdp_packets"]
        assert list(sampler._ethtool_names) == [name]  # matched once, kept for the next pass
    kept = sampler._ethtool_names[name]
    assert [n for _, n in kept.kept] == ["peer_ifindex", "rx_queue_63_xdp_packets"]
    ip("-n", ns, "link", "del", name)  # the pair goes: its names go with it
    with pytest.raises(NoData, match="none of the selected netdevs"):
        sampler.sample()
    assert sampler._ethtool_names == {}


def test_errors_are_the_readers_named_errors(wide_veth: tuple[str, str]) -> None:
    ns, _ = wide_veth

    def ask(ifname: str) -> str:
        tool = EthtoolStatistics()
        try:
            tool.statistics(ifname, EVERYTHING)
        except (NoSuchDevice, NotSupportedError, OSError) as exc:
            return type(exc).__name__
        finally:
            tool.close()
        return "answered"

    assert in_namespace(ns, lambda: ask("lo")) == "NotSupportedError"
    for name in ("nosuch0", "", "x" * 16, "bad\0name"):
        assert in_namespace(ns, lambda n=name: ask(n)) == "NoSuchDevice", name  # type: ignore[misc]


# -- a stand-in kernel ---------------------------------------------------------------------


class Kernel:
    """Answers SIOCETHTOOL as the kernel does: GSSET_INFO the count, GSTRINGS and GSTATS
    writing *its current* count of entries into the caller's buffer, whatever its size."""

    def __init__(self, names: list[bytes], values: list[int]) -> None:
        self.names = names
        self.values = values
        self.calls: list[int] = []
        self.after_count: Callable[[], None] | None = None

    def ioctl(self, sock: object, request: int, arg: ctypes.Structure) -> int:
        assert request == SIOCETHTOOL
        if isinstance(arg, IfReqSsetInfo):
            info = arg.info.contents
            assert info.cmd == ETHTOOL_GSSET_INFO
            self.calls.append(ETHTOOL_GSSET_INFO)
            info.data = len(self.names)
            if self.after_count is not None:
                self.after_count()
            return 0
        assert isinstance(arg, IfReq)
        addr = arg.gstrings  # the union's pointer, whichever member was set
        (cmd,) = struct.unpack("I", ctypes.string_at(addr, 4))
        self.calls.append(cmd)
        n = len(self.names)
        if cmd == ETHTOOL_GSTRINGS:
            ctypes.memmove(addr + 8, struct.pack("I", n), 4)
            raw = b"".join(s[:ETH_GSTRING_LEN].ljust(ETH_GSTRING_LEN, b"\0") for s in self.names)
            ctypes.memmove(addr + 12, raw, len(raw))
        else:
            assert cmd == ETHTOOL_GSTATS
            ctypes.memmove(addr + 4, struct.pack("I", n), 4)
            raw = struct.pack(f"{n}Q", *self.values)
            ctypes.memmove(addr + 8, raw, len(raw))
        return 0


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> Kernel:
    k = Kernel([b"rx_prio3_pause", b"tx_bytes"], [7, 9])
    monkeypatch.setattr(ethtool.fcntl, "ioctl", k.ioctl)
    return k


def test_names_are_matched_once_and_again_only_when_they_change(kernel: Kernel) -> None:
    names: KnownNames = {}
    tool = EthtoolStatistics(names)
    assert tool.statistics("eth0", DEFAULT_ETHTOOL_INCLUDE) == [("rx_prio3_pause", 7)]
    first = names["eth0"]
    kernel.values = [8, 10]
    assert tool.statistics("eth0", DEFAULT_ETHTOOL_INCLUDE) == [("rx_prio3_pause", 8)]
    assert names["eth0"] is first  # the same names: not decoded or matched again
    kernel.names = [b"tx_bytes", b"rx_prio3_pause"]  # same count, other order
    kernel.values = [11, 12]
    assert tool.statistics("eth0", DEFAULT_ETHTOOL_INCLUDE) == [("rx_prio3_pause", 12)]
    assert names["eth0"] is not first
    assert kernel.calls == [ETHTOOL_GSSET_INFO, ETHTOOL_GSTRINGS, ETHTOOL_GSTATS] * 3


def test_a_count_that_grows_between_two_calls_is_refused_within_the_buffer(
    kernel: Kernel,
) -> None:
    tool = EthtoolStatistics()

    def grow() -> None:  # the driver gains statistics (ethtool -L) right after the count
        kernel.names = kernel.names + [f"rx{i}_packets".encode() for i in range(HEADROOM)]
        kernel.values = kernel.values + [0] * HEADROOM

    kernel.after_count = grow
    with pytest.raises(CountChangedError, match="2 statistics, then 258 names"):
        tool.statistics("eth0", EVERYTHING)
    kernel.after_count = None  # the next pass asks again and is answered
    assert len(tool.statistics("eth0", EVERYTHING)) == 2 + HEADROOM


def test_ten_thousand_statistics_and_hostile_names(kernel: Kernel) -> None:
    full = b"rx_prio0_pause_duration_abcdefgh"  # 32 bytes: no NUL at all
    assert len(full) == ETH_GSTRING_LEN
    kernel.names = [f"rx{i}_packets".encode() for i in range(10_000)]
    kernel.names += [full, b"rx_prio1_pause\xff\xfe", b"", b"tx_prio2_pause"]
    kernel.values = [*range(len(kernel.names) - 1), 2**64 - 1]
    got = EthtoolStatistics().statistics("eth0", DEFAULT_ETHTOOL_INCLUDE)
    assert got == [("tx_prio2_pause", 2**64 - 1)]  # the others match no name (or no UTF-8)
    got_all = EthtoolStatistics().statistics("eth0", EVERYTHING)
    assert len(got_all) == 10_004
    assert got_all[10_000] == (full.decode(), 10_000)
    assert got_all[10_001][0] == "rx_prio1_pause\ufffd\ufffd"


def test_the_sampler_opens_its_own_reader_with_its_names(tmp_path: Path) -> None:
    sampler = NetdevSampler(SysfsReader(tmp_path))
    tool = sampler._own_ethtool(None)
    try:
        assert isinstance(tool, EthtoolStatistics)
        assert tool._names is sampler._ethtool_names
    finally:
        tool.close()
    assert isinstance(open_ethtool(None), EthtoolStatistics)


def test_a_driver_refusing_the_count_is_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(sock: object, request: int, arg: object) -> int:
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(ethtool.fcntl, "ioctl", refuse)
    with pytest.raises(NotSupportedError):
        EthtoolStatistics().statistics("eth0", EVERYTHING)


# -- netlink: RTM_GETLINK over pyroute2's synchronous socket ---------------------------------


def test_link_socket_answers_as_iproute_does(wide_veth: tuple[str, str]) -> None:
    ns, name = wide_veth
    sock = LinkSocket(ns)
    try:
        (ours,) = sock.link("get", ifname=name)
        with IPRoute(netns=ns, flags=0) as ipr:
            (theirs,) = ipr.link("get", ifname=name)
        mine, pyroute2s = to_link(ours), to_link(theirs)
        assert mine.stats is not None and pyroute2s.stats is not None  # IFLA_STATS64 decoded
        # the same but the counters, which the kernel's own traffic (IPv6 neighbour
        # discovery on a veth just up) may move between the two questions
        assert dataclasses.replace(mine, stats=None) == dataclasses.replace(pyroute2s, stats=None)
        assert {m.get("IFLA_IFNAME") for m in sock.get_links()} == {"lo", name, f"{name}p"}
        with pytest.raises(NetlinkError) as missing:
            sock.link("get", ifname="nosuch0")
        assert missing.value.code == errno.ENODEV
        with pytest.raises(NetlinkError):
            sock.link("get", ifname="x" * 40)  # longer than IFNAMSIZ: the kernel refuses it
        # an answer to an earlier question left unread (its reader failed) is passed over
        sock._sock.send(linkmsg.question(sock._seq, "lo"))
        (again,) = sock.link("get", ifname=name)
        assert again.get("IFLA_IFNAME") == name
        with pytest.raises(ValueError, match="only gets links"):
            sock.link("del", ifname=name)
    finally:
        sock.close()
