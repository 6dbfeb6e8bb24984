"""The netdev sampler reads each interface's ethtool statistics on its turn of
``ethtool_rotation``: interface ``i`` (sorted by name) at passes where ``(pass - i) % N == 0``,
its last answer standing between; an interface without an answer from its current ifindex
(first seen, made again, last read failed) is read every pass until one answers. Netlink and
ethtool are answered in process (as the scenario lab answers them), counting each ethtool
read; a real veth through the sampler is in test_netdev_kernel_readers.py.
"""

from __future__ import annotations

import errno
import re
from pathlib import Path

import pytest

from agent.config import ETHTOOL_ROTATION, NetdevSettings
from agent.core.sysfs import SysfsReader
from agent.netdev.sampler import NetdevSampler
from agent.netdev.stats import NetdevSnapshot
from exporter.cli.main import build_parser

ANY = re.compile(r".*")


class Kernel:
    """Interfaces by name: ifindex and one counter; ethtool reads counted per interface."""

    def __init__(self, names: list[str]) -> None:
        self.ifindex = {n: i + 2 for i, n in enumerate(names)}
        self.value = dict.fromkeys(names, 0)
        self.reads: list[str] = []
        self.opened = 0
        self.fail: dict[str, int] = {}  # name -> errno of its next read

    def open_rtnl(self, netns: str | None) -> Kernel:
        return self

    def open_ethtool(self, netns: str | None) -> Kernel:
        self.opened += 1
        return self

    def get_links(self) -> list[dict[str, object]]:
        return [
            {"index": idx, "IFLA_IFNAME": name, "IFLA_OPERSTATE": "UP"}
            for name, idx in self.ifindex.items()
        ]

    def link(self, command: str, *, ifname: str) -> list[dict[str, object]]:
        raise AssertionError("with include set the sampler dumps every link")

    def statistics(self, ifname: str, include: re.Pattern[str]) -> list[tuple[str, int]]:
        self.reads.append(ifname)
        code = self.fail.pop(ifname, None)
        if code is not None:
            raise OSError(code, errno.errorcode[code])
        return [("rx_out_of_buffer", self.value[ifname])]

    def close(self) -> None:
        return None

    def tick(self, by: int = 1) -> None:
        for name in self.value:
            self.value[name] += by


def sampler(kernel: Kernel, tmp_path: Path, rotation: int = ETHTOOL_ROTATION) -> NetdevSampler:
    return NetdevSampler(
        SysfsReader(tmp_path),
        include=ANY,
        ethtool_include=ANY,
        open_rtnl=kernel.open_rtnl,  # type: ignore[arg-type]
        open_ethtool=kernel.open_ethtool,
        ethtool_rotation=rotation,
    )


def shown(snap: NetdevSnapshot) -> dict[str, int | None]:
    return {
        nd.name: nd.ethtool.rx_out_of_buffer if nd.ethtool is not None else None
        for nd in snap.netdevs
    }


def pass_reads(kernel: Kernel, s: NetdevSampler) -> tuple[list[str], dict[str, int | None]]:
    kernel.reads.clear()
    snap = s.sample()
    return sorted(kernel.reads), shown(snap)


def test_each_interface_is_read_on_its_turn_and_its_last_answer_stands(tmp_path: Path) -> None:
    kernel = Kernel(["eth0", "eth1", "eth2"])
    s = sampler(kernel, tmp_path)
    assert s.ethtool_rotation == 2
    # pass 0: nothing to stand yet, every interface is read
    assert pass_reads(kernel, s) == (["eth0", "eth1", "eth2"], {"eth0": 0, "eth1": 0, "eth2": 0})
    kernel.tick()
    # pass 1: eth1's turn; eth0 and eth2 show their pass-0 answers
    assert pass_reads(kernel, s) == (["eth1"], {"eth0": 0, "eth1": 1, "eth2": 0})
    kernel.tick()
    assert pass_reads(kernel, s) == (["eth0", "eth2"], {"eth0": 2, "eth1": 1, "eth2": 2})
    kernel.tick()
    assert pass_reads(kernel, s) == (["eth1"], {"eth0": 2, "eth1": 3, "eth2": 2})


def test_rotation_one_reads_every_interface_every_pass(tmp_path: Path) -> None:
    kernel = Kernel(["eth0", "eth1"])
    s = sampler(kernel, tmp_path, rotation=1)
    for k in range(3):
        assert pass_reads(kernel, s) == (["eth0", "eth1"], {"eth0": k, "eth1": k})
        kernel.tick()


def test_a_failed_read_is_asked_again_the_next_pass(tmp_path: Path) -> None:
    kernel = Kernel(["eth0", "eth1"])
    s = sampler(kernel, tmp_path)
    kernel.fail["eth0"] = errno.EIO
    snap = s.sample()
    assert shown(snap) == {"eth0": None, "eth1": 0}  # only its series go, as before
    assert [i.path for i in snap.issues] == ["netlink/ethtool/eth0"]
    kernel.tick()
    # pass 1 is eth1's turn, and eth0 has nothing to stand: both are read
    assert pass_reads(kernel, s) == (["eth0", "eth1"], {"eth0": 1, "eth1": 1})
    kernel.tick()
    assert pass_reads(kernel, s) == (["eth0"], {"eth0": 2, "eth1": 1})


def test_an_interface_made_again_is_read_at_once(tmp_path: Path) -> None:
    kernel = Kernel(["eth0", "eth1"])
    s = sampler(kernel, tmp_path)
    s.sample()
    kernel.value["eth0"] = 0  # deleted and created again: a new ifindex, counters from zero
    kernel.ifindex["eth0"] = 40
    kernel.tick(5)
    # pass 1 is eth1's turn; eth0's pass-0 answer belongs to the old device
    assert pass_reads(kernel, s) == (["eth0", "eth1"], {"eth0": 5, "eth1": 5})


def test_a_pass_with_nothing_due_opens_no_ethtool_socket(tmp_path: Path) -> None:
    kernel = Kernel(["eth0"])
    s = sampler(kernel, tmp_path, rotation=3)
    for _ in range(6):
        s.sample()
    assert kernel.opened == 2  # passes 0 and 3
    assert kernel.reads == ["eth0", "eth0"]


def test_a_gone_interface_leaves_no_answer_behind(tmp_path: Path) -> None:
    kernel = Kernel(["eth0", "eth1"])
    s = sampler(kernel, tmp_path)
    s.sample()
    del kernel.ifindex["eth1"]
    assert sorted(shown(s.sample())) == ["eth0"]
    assert list(s._ethtool_last) == ["eth0"]
    kernel.ifindex["eth1"] = 3  # back under the same ifindex: still asked, nothing stands
    assert pass_reads(kernel, s)[0] == ["eth0", "eth1"]


def test_the_rotation_is_a_flag_and_must_be_positive(tmp_path: Path) -> None:
    from agent.samplers import build_samplers
    from exporter.cli.agent_flags import config_from_args

    parser = build_parser()
    ns = parser.parse_args(["agent", "--netdev.ethtool-rotation=3", "--no-sampler.nvml"])
    config = config_from_args(ns)
    assert config.netdev.ethtool_rotation == 3
    assert config_from_args(parser.parse_args(["agent"])).netdev.ethtool_rotation == 2
    samplers = build_samplers(config, SysfsReader(tmp_path), watch_xid=False)
    (netdev,) = [x for x in samplers if isinstance(x, NetdevSampler)]
    assert netdev.ethtool_rotation == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["agent", "--netdev.ethtool-rotation=0"])
    with pytest.raises(ValueError, match="rotation must be >= 1"):
        NetdevSettings(ethtool_rotation=0)
    with pytest.raises(ValueError, match="rotation must be >= 1"):
        NetdevSampler(SysfsReader(tmp_path), ethtool_rotation=0)
