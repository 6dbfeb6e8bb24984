"""The netdev sampler against real network namespaces and veth pairs (needs root and ``ip``).

Each test builds two fresh namespaces: ``ns_a`` holds veth ``a`` (peer ``b`` in ``ns_b``,
both up, MTU 1400 on ``a``) and a second pair ``c``/``d`` left down. Traffic is UDP sent from
processes started inside the namespaces, never on the host. Teardown deletes the namespaces
(and with them the veths) whether or not the test passed.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.core.errors import NoData
from agent.core.sysfs import Issues, ReadIssue, SysfsReader
from agent.netdev.sampler import NetdevSampler, read_links
from agent.netdev.stats import (
    OPERSTATES,
    EthtoolStat,
    EthtoolStats,
    NetdevSample,
    NetdevSnapshot,
    RdmaPort,
)

SEND_UDP = """
import socket, sys
dst, port, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(count):
    s.sendto(b"x" * size, (dst, port))
"""
#: Ethernet (14) + IPv4 (20) + UDP (8) header bytes on top of each datagram's payload
HEADERS = 42


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


def ifindex(ns: str, name: str) -> int:
    info = json.loads(ip("-j", "-n", ns, "link", "show", "dev", name))
    return int(info[0]["ifindex"])


@dataclass(frozen=True)
class Topology:
    ns_a: str
    ns_b: str
    a: str
    b: str
    c: str
    d: str
    addr_a: str = "10.231.0.1"
    addr_b: str = "10.231.0.2"

    def send_udp(self, from_ns: str, dst: str, count: int, size: int) -> None:
        cmd = ["ip", "netns", "exec", from_ns, sys.executable, "-c", SEND_UDP]
        subprocess.run([*cmd, dst, "9", str(count), str(size)], check=True, timeout=30)


@pytest.fixture
def topo() -> Iterator[Topology]:
    tag = secrets.token_hex(3)
    t = Topology(
        ns_a=f"fsnd-a-{tag}",
        ns_b=f"fsnd-b-{tag}",
        a=f"fsa{tag}",
        b=f"fsb{tag}",
        c=f"fsc{tag}",
        d=f"fsd{tag}",
    )
    created: list[str] = []
    try:
        for ns in (t.ns_a, t.ns_b):
            ip("netns", "add", ns)
            created.append(ns)
        ip("-n", t.ns_a, "link", "add", t.a, "type", "veth", "peer", "name", t.b, "netns", t.ns_b)
        ip("-n", t.ns_a, "link", "add", t.c, "type", "veth", "peer", "name", t.d)
        ip("-n", t.ns_a, "addr", "add", f"{t.addr_a}/24", "dev", t.a)
        ip("-n", t.ns_b, "addr", "add", f"{t.addr_b}/24", "dev", t.b)
        ip("-n", t.ns_a, "link", "set", t.a, "mtu", "1400", "up")
        ip("-n", t.ns_b, "link", "set", t.b, "up")
        ip("-n", t.ns_a, "link", "set", "lo", "up")
        ip("-n", t.ns_b, "link", "set", "lo", "up")
        yield t
    finally:
        failures = []
        for ns in reversed(created):
            done = subprocess.run(
                ["ip", "netns", "del", ns], check=False, capture_output=True, text=True
            )
            if done.returncode != 0:
                failures.append(f"{ns}: {done.stderr.strip()}")
        assert not failures, f"could not delete test namespaces: {failures}"


def only(snap: NetdevSnapshot, name: str) -> NetdevSample:
    found = [nd for nd in snap.netdevs if nd.name == name]
    assert len(found) == 1, [nd.name for nd in snap.netdevs]
    return found[0]


def exactly(name: str) -> re.Pattern[str]:
    return re.compile(re.escape(name))


def thread_netns() -> str:
    return os.readlink("/proc/thread-self/ns/net")


def poll(sample: Callable[[], NetdevSample], done: Callable[[NetdevSample], bool]) -> NetdevSample:
    """Sample until ``done`` holds or 10 s pass (queued packets leave once ARP resolves)."""
    deadline = time.monotonic() + 10
    got = sample()
    while not done(got) and time.monotonic() < deadline:
        time.sleep(0.05)
        got = sample()
    return got


def test_counters_move_with_traffic_sent_inside_the_namespace(
    topo: Topology, tmp_path: Path
) -> None:
    sampler = NetdevSampler(SysfsReader(tmp_path), include=exactly(topo.a), netns=topo.ns_a)
    before_ns = thread_netns()
    before = only(sampler.sample(), topo.a)
    assert before.stats is not None

    tx_count, tx_size, rx_count, rx_size = 40, 300, 25, 700
    topo.send_udp(topo.ns_a, topo.addr_b, tx_count, tx_size)
    topo.send_udp(topo.ns_b, topo.addr_a, rx_count, rx_size)

    def moved(nd: NetdevSample) -> bool:
        s, s0 = nd.stats, before.stats
        assert s is not None and s0 is not None
        assert s.tx_packets is not None and s0.tx_packets is not None
        assert s.rx_packets is not None and s0.rx_packets is not None
        return s.tx_packets - s0.tx_packets >= tx_count and s.rx_packets - s0.rx_packets >= rx_count

    after = poll(lambda: only(sampler.sample(), topo.a), moved)
    s, s0 = after.stats, before.stats
    assert s is not None and s0 is not None
    assert s.tx_packets is not None and s0.tx_packets is not None
    assert s.rx_packets is not None and s0.rx_packets is not None
    assert s.tx_bytes is not None and s0.tx_bytes is not None
    assert s.rx_bytes is not None and s0.rx_bytes is not None
    assert s.tx_packets - s0.tx_packets >= tx_count
    assert s.rx_packets - s0.rx_packets >= rx_count
    assert s.tx_bytes - s0.tx_bytes >= tx_count * (tx_size + HEADERS)
    assert s.rx_bytes - s0.rx_bytes >= rx_count * (rx_size + HEADERS)
    assert s.rx_errors == 0 and s.tx_errors == 0

    assert after.ifindex == ifindex(topo.ns_a, topo.a)
    assert after.operstate == "up"
    assert after.carrier == 1
    assert after.carrier_changes is not None and after.carrier_changes >= 1
    assert after.mtu_bytes == 1400
    assert after.speed_bytes_per_second is None  # this sysfs tree does not show the netns
    assert after.rdma == ()
    assert thread_netns() == before_ns  # ethtool's setns moved another thread, not this one


def test_down_interface_reports_its_state(topo: Topology, tmp_path: Path) -> None:
    snap = NetdevSampler(SysfsReader(tmp_path), include=exactly(topo.c), netns=topo.ns_a).sample()
    c = only(snap, topo.c)
    assert c.operstate == "down"
    assert c.carrier == 0
    assert c.mtu_bytes == 1500
    assert [nd.name for nd in snap.netdevs] == [topo.c]


def test_veth_ethtool_statistics_through_the_namespace(topo: Topology, tmp_path: Path) -> None:
    reader = SysfsReader(tmp_path)
    include = re.compile(r"peer_ifindex|rx_queue_0_xdp_packets")
    snap = NetdevSampler(reader, exactly(topo.a), include, netns=topo.ns_a).sample()
    a = only(snap, topo.a)
    assert a.ethtool is not None
    # veth's peer_ifindex is the peer's index in its own namespace: proof that the ioctl
    # reached the veth inside ns_a, which does not exist in this thread's namespace
    assert a.ethtool.gauges == (EthtoolStat("peer_ifindex", ifindex(topo.ns_b, topo.b)),)
    assert a.ethtool.counters == (EthtoolStat("rx_queue_0_xdp_packets", 0),)
    assert snap.issues == ()

    default = only(NetdevSampler(reader, exactly(topo.a), netns=topo.ns_a).sample(), topo.a)
    assert default.ethtool == EthtoolStats()  # read, and every veth statistic filtered out

    off = NetdevSampler(reader, exactly(topo.a), None, netns=topo.ns_a).sample()
    assert only(off, topo.a).ethtool is None
    assert off.issues == ()


def test_driver_without_ethtool_statistics_costs_only_those_series(
    topo: Topology, tmp_path: Path
) -> None:
    include = re.compile(rf"lo|{re.escape(topo.a)}")
    snap = NetdevSampler(SysfsReader(tmp_path), include, netns=topo.ns_a).sample()
    lo = only(snap, "lo")
    assert lo.ethtool is None
    assert lo.stats is not None
    assert lo.mtu_bytes == 65536
    assert only(snap, topo.a).ethtool == EthtoolStats()
    assert [(i.path, i.reason) for i in snap.issues] == [("netlink/ethtool/lo", "unsupported")]


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_rdma_associated_netdevs_are_selected_from_sysfs(topo: Topology, tmp_path: Path) -> None:
    # sysfs as a RoCE host shows it: mlx5_0 port 1's GID table names veth a; mlx5_1's PCI
    # function owns a netdev this namespace does not have; class/net/a matches a's ifindex
    write(tmp_path, "class/infiniband/mlx5_0/ports/1/link_layer", "Ethernet\n")
    write(tmp_path, "class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/0", f"{topo.a}\n")
    write(tmp_path, "class/infiniband/mlx5_1/ports/1/link_layer", "Ethernet\n")
    (tmp_path / "class/infiniband/mlx5_1/device/net/ens9f0np0").mkdir(parents=True)
    write(tmp_path, f"class/net/{topo.a}/ifindex", f"{ifindex(topo.ns_a, topo.a)}\n")
    write(tmp_path, f"class/net/{topo.a}/speed", "100000\n")
    (tmp_path / "bus/pci/drivers/mlx5_core").mkdir(parents=True)
    (tmp_path / f"class/net/{topo.a}/device").mkdir()
    os.symlink(
        "../../../../bus/pci/drivers/mlx5_core", tmp_path / f"class/net/{topo.a}/device/driver"
    )
    reader = SysfsReader(tmp_path)

    snap = NetdevSampler(reader, netns=topo.ns_a).sample()
    assert [nd.name for nd in snap.netdevs] == [topo.a]  # c, d and lo are not RDMA netdevs
    a = snap.netdevs[0]
    assert a.rdma == (RdmaPort("mlx5_0", 1),)
    assert a.speed_bytes_per_second == 12_500_000_000
    assert a.driver == "mlx5_core"
    assert snap.missing == ("ens9f0np0",)
    assert snap.issues == ()

    # with an include as well, the namespace is dumped once and both sets are sampled
    both = NetdevSampler(reader, include=re.compile("lo"), netns=topo.ns_a).sample()
    assert [nd.name for nd in both.netdevs] == [topo.a, "lo"]
    assert both.missing == ("ens9f0np0",)

    # a class/net entry for another device of the same name is not believed
    write(tmp_path, f"class/net/{topo.a}/ifindex", "4242\n")
    stranger = only(NetdevSampler(reader, netns=topo.ns_a).sample(), topo.a)
    assert stranger.speed_bytes_per_second is None
    assert stranger.driver is None


class DeletingReader(SysfsReader):
    """Deletes a veth the moment the sampler looks it up in sysfs: after netlink listed it,
    before ethtool reads it."""

    def __init__(self, root: Path, ns: str, victim: str) -> None:
        super().__init__(root)
        self.ns = ns
        self.victim = victim

    def read_text(self, rel: str) -> str:
        if rel == f"class/net/{self.victim}/ifindex":
            ip("-n", self.ns, "link", "del", self.victim)
        return super().read_text(rel)


def test_interface_deleted_mid_pass_costs_only_its_series(topo: Topology, tmp_path: Path) -> None:
    include = re.compile(rf"{re.escape(topo.a)}|{re.escape(topo.c)}")
    reader = DeletingReader(tmp_path, topo.ns_a, topo.c)
    snap = NetdevSampler(reader, include, netns=topo.ns_a).sample()
    assert [nd.name for nd in snap.netdevs] == [topo.a]
    assert only(snap, topo.a).stats is not None
    assert [(i.path, i.reason) for i in snap.issues] == [(f"netlink/ethtool/{topo.c}", "vanished")]


def test_netlink_error_on_one_name_keeps_the_others(topo: Topology) -> None:
    issues = Issues(SysfsReader("/nonexistent"))
    too_long = "x" * 16  # the kernel refuses it: ERANGE
    links, missing = read_links(topo.ns_a, [topo.a, too_long, "nosuch0"], issues)
    assert [link.name for link in links] == [topo.a]
    assert missing == ["nosuch0"]
    assert [(i.path, i.reason) for i in issues.freeze()] == [(f"netlink/link/{too_long}", "io")]


def test_include_matching_no_interface_is_no_data(topo: Topology, tmp_path: Path) -> None:
    sampler = NetdevSampler(SysfsReader(tmp_path), re.compile("nosuch0"), netns=topo.ns_a)
    with pytest.raises(NoData):
        sampler.sample()


def test_missing_namespace_fails_the_pass_and_is_not_created(tmp_path: Path) -> None:
    name = f"fsnd-absent-{secrets.token_hex(3)}"
    sampler = NetdevSampler(SysfsReader(tmp_path), re.compile("lo"), netns=name)
    with pytest.raises(FileNotFoundError):
        sampler.sample()
    assert not os.path.exists(f"/var/run/netns/{name}")


def test_own_namespace_is_read_without_netns(tmp_path: Path) -> None:
    # read-only look at the host's loopback: no traffic is sent outside test namespaces
    snap = NetdevSampler(SysfsReader(tmp_path), re.compile("lo")).sample()
    lo = only(snap, "lo")
    assert lo.ifindex == 1
    assert lo.mtu_bytes == 65536
    assert lo.operstate in OPERSTATES
    assert lo.stats is not None
    assert (
        ReadIssue("netlink/ethtool/lo", "unsupported", "the driver reports no ethtool statistics")
        in snap.issues
    )
