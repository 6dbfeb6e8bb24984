"""The infiniband sampler's PMA step against a real simulated fabric: ibsim serving a node's
two HCAs cabled to a leaf switch, OpenSM, and the real perfquery through libumad2sim at each
HCA port's own LID. Counters are planted through ibsim's console (``PerformanceSet``).

The kernel's part is played by :class:`KernelSysfs`: on a host, reading a ``counters/`` file
makes the kernel send the port's PMA a PortCounters Get; here a read of a file named
"live" is answered from the simulator's PMA through the real perfquery (one Get per pass
over the directory, and a new one whenever a file is read again, so the agent's reads before
and after a clear see the simulator as it is then).
Other files are the test's own, written as a kernel with the 32-bit counters/ table shows
them: ``port_xmit_data`` stuck at 2^32-1.

One lab for the module; each test puts back what it plants.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.core.sysfs import SysfsReader
from agent.ibpeer.parse import parse_portinfo
from agent.infiniband.findings import findings
from agent.infiniband.perfquery import parse_perfquery
from agent.infiniband.pma import PmaReader
from agent.infiniband.records import IbPort, InfinibandSnapshot
from agent.infiniband.sampler import InfinibandSampler
from exporter.metrics import infiniband as ib_metrics
from exporter.metrics.spec import Families
from tests.agentrun import fabricscope
from tests.ib_port_tree import write_ib_port
from tests.ibsim_lab import IbsimLab, missing_tools

OPTS = "w=8 s=4 e=7"
NET = f"""Switch	8 "leaf1"
[1]	"node1-mlx5_0"[1]	{OPTS}
[2]	"node1-mlx5_1"[1]	{OPTS}

Hca	1 "node1-mlx5_0"
[1]	"leaf1"[1]	{OPTS}

Hca	1 "node1-mlx5_1"
[1]	"leaf1"[2]	{OPTS}
"""
#: the --infiniband.command-prefix: points `perfquery -C mlx5_N` at node1-mlx5_N and runs it
#: under ibsim-run from the lab's directory (libumad2sim writes a stand-in sysfs there)
WRAPPER = """#!/bin/bash
cd "$(dirname "$0")"
args=(); host=""
while [ $# -gt 0 ]; do
  if [ "$1" = "-C" ]; then host="$2"; args+=(-C ibsim0); shift 2; continue; fi
  args+=("$1"); shift
done
SIM_HOST="node1-$host" exec ibsim-run "${args[@]}"
"""
P = "fabricscope_infiniband_port_"
U32 = 2**32 - 1
OTHERS = ("attribution", "netdev", "nvml", "pci", "throughput", "workload")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IbsimLab]:
    missing = missing_tools()
    assert not missing, (
        f"install ibsim-utils infiniband-diags opensm (scripts/test.sh does): {missing}"
    )
    lab = IbsimLab(tmp_path_factory.mktemp("ibsim-pma"), NET)
    try:
        yield lab
    finally:
        lab.close()


@pytest.fixture(scope="module")
def lids(lab: IbsimLab) -> dict[str, int]:
    """Each HCA port's LID, as OpenSM assigned it (smpquery at the port itself)."""
    out = {}
    for dev in ("mlx5_0", "mlx5_1"):
        text = lab.tool(
            f"node1-{dev}", "smpquery", "-C", "ibsim0", "-P", "1", "-D", "portinfo", "0", "1"
        )
        lid = parse_portinfo(text).lid
        assert lid
        out[dev] = lid
    return out


@pytest.fixture
def sim_env(lab: IbsimLab) -> Iterator[None]:
    old = os.environ.get("IBSIM_SOCKNAME")
    os.environ["IBSIM_SOCKNAME"] = lab.sockname
    yield
    if old is None:
        del os.environ["IBSIM_SOCKNAME"]
    else:
        os.environ["IBSIM_SOCKNAME"] = old


def wrapper(lab: IbsimLab) -> Path:
    wrap = lab.workdir / "perfquery-wrap"
    if not wrap.exists():
        wrap.write_text(WRAPPER)
        wrap.chmod(0o755)
    return wrap


def node_tree(root: Path, lids: dict[str, int], counters: dict[str, dict[str, int]]) -> Path:
    for dev, lid in lids.items():
        write_ib_port(root, dev, counters.get(dev, {}), lid=lid, rate="300 Gb/sec (12X QDR)")
    return root


def pma_get(lab: IbsimLab, dev: str, lid: int) -> dict[str, int]:
    """The HCA port's PortCounters now, through the real perfquery (a Get, as the kernel's)."""
    text = lab.tool(f"node1-{dev}", "perfquery", "-C", "ibsim0", "-P", "1", str(lid), "1")
    return {n: raw for n, (raw, _) in parse_perfquery(text, extended=False).by_name().items()}


class KernelSysfs(SysfsReader):
    """A sysfs tree whose "live" counters/ files answer from the simulator's PMA."""

    _PATH = re.compile(r"^class/infiniband/(mlx5_\d)/ports/1/counters/(\w+)$")

    def __init__(self, root: Path, lab: IbsimLab, lids: dict[str, int], live: set[str]) -> None:
        super().__init__(root)
        self.lab, self.lids, self.live = lab, lids, live
        self._snap: dict[str, dict[str, int]] = {}
        self._served: dict[str, set[str]] = {}

    def listdir_files(self, rel: str) -> list[str]:
        """A pass starts reading a port's counters/: the next read takes a new Get."""
        m = re.match(r"^class/infiniband/(mlx5_\d)/ports/1/counters$", rel)
        if m is not None:
            self._snap.pop(m.group(1), None)
        return super().listdir_files(rel)

    def read_bytes(self, rel: str) -> bytes:
        m = self._PATH.match(rel)
        if m is None or m.group(2) not in self.live:
            return super().read_bytes(rel)
        dev, name = m.group(1), m.group(2)
        if dev not in self._snap or name in self._served[dev]:
            self._snap[dev] = pma_get(self.lab, dev, self.lids[dev])
            self._served[dev] = set()
        self._served[dev].add(name)
        return f"{self._snap[dev][name]}\n".encode()


def plant(lab: IbsimLab, dev: str, attribute: str, value: int) -> None:
    lab.command(f'PerformanceSet "node1-{dev}"[1] {attribute}={value}', "has been set")


def port(snap: InfinibandSnapshot, dev: str) -> IbPort:
    return next(p for d in snap.devices if d.name == dev for p in d.ports)


def values(snap: InfinibandSnapshot, dev: str) -> dict[str, tuple[int, int | None]]:
    return {c.name: (c.value, c.width) for c in port(snap, dev).counters if c.source == "counters"}


def rendered(snap: InfinibandSnapshot) -> dict[tuple[str, tuple[str, ...]], float]:
    out = Families("default")
    ib_metrics.render(snap, out)
    return {(s.name, labels): v for s, samples in out.items() for labels, v in samples}


def test_64bit_counter_keeps_moving_while_its_sysfs_twin_sits_at_2_32(
    lab: IbsimLab, lids: dict[str, int], sim_env: None, tmp_path: Path
) -> None:
    """mlx5_0's kernel shows the 32-bit counters/ table (no unicast files) with
    port_xmit_data stuck at 2^32-1; the simulator's PortCountersExtended (CapMask 0x1200:
    extended width, no additional counters) moves past 2^32. mlx5_1's kernel already reads
    64-bit data counters: one perfquery to learn that its PMA offers nothing more."""
    sysfs = {
        "mlx5_0": {
            "port_xmit_data": U32,
            "port_rcv_data": 100,
            "port_xmit_packets": 9,
            "port_rcv_packets": 9,
            "symbol_error": 0,
            "port_xmit_wait": U32,
        },
        "mlx5_1": {
            "port_xmit_data": 100,
            "port_rcv_data": 100,
            "port_xmit_packets": 9,
            "port_rcv_packets": 9,
            "unicast_xmit_packets": 9,
            "symbol_error": 0,
        },
    }
    root = node_tree(tmp_path / "sys", lids, sysfs)
    pma = PmaReader(SysfsReader(root), mode="on", prefix=(str(wrapper(lab)),), tool_timeout=20)
    sampler = InfinibandSampler(SysfsReader(root), pma=pma)
    seen = []
    try:
        for planted in (5_000_000_000, 9_000_000_000, 2**40):
            plant(lab, "mlx5_0", "PortCountersExtended.PortXmitData", planted)
            snap = sampler.sample()
            raw, width = values(snap, "mlx5_0")["port_xmit_data"]
            assert width == 64
            # the simulator adds a few words for the MADs themselves
            assert planted * 4 <= raw < (planted + 100_000) * 4, (planted, raw)
            seen.append((raw, snap.tool_calls))
    finally:
        plant(lab, "mlx5_0", "PortCountersExtended.PortXmitData", 0)
    assert (
        root / "class/infiniband/mlx5_0/ports/1/counters/port_xmit_data"
    ).read_text() == f"{U32}\n"
    assert [calls for _, calls in seen] == [2, 1, 1]  # mlx5_1: only the first pass asks
    series = rendered(snap)
    dp = ("mlx5_0", "1")
    assert series[(P + "transmitted_bytes_total", dp)] == seen[-1][0]
    # the data counter is no longer stuck; PortXmitWait has no 64-bit copy here: it is
    assert (P + "pma_saturated", (*dp, "port_xmit_data")) not in series
    assert series[(P + "pma_saturated", (*dp, "port_xmit_wait"))] == 1
    assert series[(P + "pma_source_info", (*dp, "sysfs", "not_advertised"))] == 1
    assert series[(P + "pma_source_info", ("mlx5_1", "1", "sysfs", "not_advertised"))] == 1
    assert [f.subject for f in findings(snap) if f.kind == "counter_saturated"] == [
        "mlx5_0/1/port_xmit_wait"
    ]
    assert snap.issues == ()


def test_ten_saturations_cleared_and_counted_on_with_no_increase_lost_or_doubled(
    lab: IbsimLab, lids: dict[str, int], sim_env: None, tmp_path: Path
) -> None:
    """--infiniband.reset-saturated against the simulator's PMA: PortXmitWait (32-bit)
    saturated ten times, SymbolErrorCounter (16-bit) past OpenSM's threshold and a 4-bit
    LocalLinkIntegrityErrors below and at it, between passes; an operator's perfquery -R in
    the middle. After every pass the exported counter equals every increase planted."""
    live = {"port_xmit_wait", "symbol_error", "local_link_integrity_errors"}
    root = node_tree(
        tmp_path / "sys", {"mlx5_1": lids["mlx5_1"]}, {"mlx5_1": dict.fromkeys(live, 0)}
    )
    kernel = KernelSysfs(root, lab, {"mlx5_1": lids["mlx5_1"]}, live)
    pma = PmaReader(kernel, mode="on", reset=True, prefix=(str(wrapper(lab)),), tool_timeout=20)
    sampler = InfinibandSampler(kernel, pma=pma)
    fields = {
        "port_xmit_wait": "PortCounters.PortXmitWait",
        "symbol_error": "PortCounters.SymbolErrorCounter",
        "local_link_integrity_errors": "PortCounters.LocalLinkIntegrityErrors",
    }
    total = dict.fromkeys(live, 0)
    exported: dict[str, list[int]] = {n: [] for n in live}
    saturated_passes = 0

    def step(**new: int) -> InfinibandSnapshot:
        """Set counters to new hardware values (what the PMA holds now is read first, so
        the increase planted is exact), then one pass."""
        nonlocal saturated_passes
        now = pma_get(lab, "mlx5_1", lids["mlx5_1"])
        for name, value in new.items():
            assert value >= now[name]
            total[name] += value - now[name]
            plant(lab, "mlx5_1", fields[name], value)
        snap = sampler.sample()
        assert snap.issues == ()
        got = values(snap, "mlx5_1")
        for name in live:
            exported[name].append(got[name][0])
            assert got[name][0] == total[name], (name, got[name], total[name])
        saturated_passes += any(c.saturated for c in port(snap, "mlx5_1").counters)
        return snap

    try:
        for i in range(10):
            step(port_xmit_wait=U32, symbol_error=50_000 + i, local_link_integrity_errors=3)
            after = pma_get(lab, "mlx5_1", lids["mlx5_1"])
            assert after["port_xmit_wait"] == 0 and after["symbol_error"] == 0  # cleared
            assert after["local_link_integrity_errors"] == 3  # below 10: left alone
            step(port_xmit_wait=1_000 + i, local_link_integrity_errors=12)  # 12 >= 10: cleared
            assert pma_get(lab, "mlx5_1", lids["mlx5_1"])["local_link_integrity_errors"] == 0
            if i == 4:  # an operator clears the port's counters out of band
                step(port_xmit_wait=2_000, symbol_error=7)
                lab.tool(
                    "node1-mlx5_1",
                    "perfquery",
                    "-C",
                    "ibsim0",
                    "-P",
                    "1",
                    "-R",
                    str(lids["mlx5_1"]),
                    "1",
                )
                # what came between the agent's read and the operator's clear would be lost:
                # here nothing did, so nothing is
                snap = step(port_xmit_wait=5, symbol_error=1)
        snap = step()
    finally:
        for field in fields.values():
            plant(lab, "mlx5_1", field, 0)
    assert total["port_xmit_wait"] > 10 * U32  # ten saturations' worth, none of it lost
    for name, seq in exported.items():
        assert seq == sorted(seq), f"{name} went down: {seq}"
    src = port(snap, "mlx5_1").counter_source
    assert src is not None and (src.source, src.reason) == ("sysfs_reset", "not_advertised")
    assert src.resets_total == 20  # one perfquery -r per pass with counters due
    # every saturation was caught at 2^32-1: what it missed in that pass is unknown, and the
    # pass said so (saturated), the next one not
    assert saturated_passes == 10
    series = rendered(snap)
    assert series[(P + "pma_resets_total", ("mlx5_1", "1"))] == 20
    assert series[(P + "transmit_wait_total", ("mlx5_1", "1"))] == total["port_xmit_wait"]
    assert not any(k[0] == P + "pma_saturated" for k in series)  # counting again


def test_the_agent_runs_it_from_its_flags(
    lab: IbsimLab, lids: dict[str, int], sim_env: None, tmp_path: Path
) -> None:
    root = node_tree(
        tmp_path / "sys", lids, {d: {"port_xmit_data": U32, "symbol_error": 4} for d in lids}
    )
    plant(lab, "mlx5_0", "PortCountersExtended.PortXmitData", 7_000_000_000)
    try:
        args = ["agent", "--once", f"--path.sysfs={root}", *[f"--no-sampler.{n}" for n in OTHERS]]
        args += ["--infiniband.perfquery=on", f"--infiniband.command-prefix={wrapper(lab)}"]
        args += ["--infiniband.reset-saturated", "--log.level=error"]
        done = fabricscope(args)  # IBSIM_SOCKNAME from sim_env
    finally:
        plant(lab, "mlx5_0", "PortCountersExtended.PortXmitData", 0)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    m = re.search(
        r'fabricscope_infiniband_port_transmitted_bytes_total\{device="mlx5_0",port="1"\} (\S+)',
        text,
    )
    assert m is not None and float(m.group(1)) >= 7_000_000_000 * 4
    for dev in lids:
        labels = f'device="{dev}",port="1",reason="not_advertised",source="sysfs_reset"'
        assert f"pma_source_info{{{labels}}} 1" in text
        assert f'pma_resets_total{{device="{dev}",port="1"}} 0' in text
    assert 'fabricscope_sampler_success{sampler="infiniband"} 1' in text


def test_perfquery_needs_its_tool_when_asked_for(tmp_path: Path) -> None:
    done = fabricscope(
        [
            "agent",
            "--once",
            f"--path.sysfs={tmp_path}",
            "--infiniband.perfquery=on",
            f"--infiniband.command-prefix={tmp_path / 'no-such-wrapper'}",
        ]
    )
    assert done.returncode != 0
    assert "--infiniband.perfquery=on needs" in done.stderr and "Traceback" not in done.stderr
