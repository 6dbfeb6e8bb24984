"""Links that stay up but run slower: the rate string's width and speed, and an ACTIVE port
below its own history, its rails (peers) or a configured expectation; a NIC's PCIe link
below its speed; a busy GPU below its PCIe generation.

Parsers get the real rate texts of tests/fixtures/ib-rate-strings (PROVENANCE.md says where
each was seen); the judgements run on copies of the DGX fixture tree (real lspci, ibstat and
counters) with one file rewritten as the kernel would on a link that retrains."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.config import ExpectedRate, parse_expected_rate
from agent.core.sysfs import SysfsReader
from agent.infiniband import capacity
from agent.infiniband.parse import lane_speed_bytes_per_second, parse_link_rate
from agent.infiniband.records import InfinibandSnapshot, LinkRate
from agent.infiniband.sampler import InfinibandSampler
from agent.nvml.findings import findings as nvml_findings
from agent.nvml.findings import generation_degraded_under_load
from agent.nvml.snapshot import ComputeProcess, NvmlGpu, NvmlSnapshot, PcieLink
from agent.pci import topology
from agent.pci.sampler import PciSampler
from exporter.metrics.infiniband import render
from exporter.metrics.spec import Families
from tests.agentrun import fabricscope

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RATES = FIXTURES / "ib-rate-strings" / "rates.tsv"
NIC = "0000:3c:00.0"  # mlx5_3, the ConnectX-7 rail of GPU 1 (0000:3b:00.0)
GBPS = 125_000_000


def real_rates() -> list[tuple[str, str]]:
    rows = []
    for line in RATES.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        state, rate, _where = line.split("\t")
        rows.append((state, rate))
    return rows


# -- the rate string -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("400 Gb/sec (4X NDR)\n", LinkRate(400 * GBPS, 4, "NDR")),
        ("100 Gb/sec (1X NDR)\n", LinkRate(100 * GBPS, 1, "NDR")),  # the issue's fault
        ("200 Gb/sec (2X NDR)\n", LinkRate(200 * GBPS, 2, "NDR")),  # amd-genoa fixture
        ("100 Gb/sec (2X HDR)\n", LinkRate(100 * GBPS, 2, "HDR")),
        ("400 Gb/sec (8X HDR)\n", LinkRate(400 * GBPS, 8, "HDR")),  # 400G RoCE
        ("100 Gb/sec (4X EDR)\n", LinkRate(100 * GBPS, 4, "EDR")),  # 100G RoCE
        ("25 Gb/sec (1X EDR)\n", LinkRate(25 * GBPS, 1, "EDR")),  # 25G RoCE
        ("50 Gb/sec (2X EDR)\n", LinkRate(50 * GBPS, 2, "EDR")),
        ("56 Gb/sec (4X FDR)\n", LinkRate(56 * GBPS, 4, "FDR")),
        ("40 Gb/sec (4X FDR10)\n", LinkRate(40 * GBPS, 4, "FDR10")),
        ("120 Gb/sec (12X QDR)\n", LinkRate(120 * GBPS, 12, "QDR")),
        ("2.5 Gb/sec (1X SDR)\n", LinkRate(312_500_000, 1, "SDR")),
        ("10 Gb/sec (4X)\n", LinkRate(10 * GBPS, 4, "SDR")),  # old kernels: SDR unnamed
        ("800 Gb/sec (4X XDR)\n", LinkRate(800 * GBPS, 4, "XDR")),
        ("0 Gb/sec (1X)", LinkRate(0, 1, None)),  # nameless and not SDR: no speed
        ("400 Gb/sec", LinkRate(400 * GBPS)),  # no parenthesis: rate only
        ("400 Gb/sec (3X NDR)", LinkRate(400 * GBPS)),  # a width the kernel never prints
        ("400 Gb/sec (4X ZDR)", LinkRate(400 * GBPS, 4, None)),  # a name it never prints
        ("400 Gb/sec (99999999999999X NDR)", LinkRate(400 * GBPS)),
    ],
)
def test_parse_link_rate(text: str, expected: LinkRate) -> None:
    assert parse_link_rate(text) == expected


def test_every_real_rate_text_parses_with_its_width_and_speed() -> None:
    rows = real_rates()
    assert len(rows) >= 12
    for _state, text in rows:
        rate = parse_link_rate(text)
        assert rate.width is not None and rate.speed is not None, text
        lane = lane_speed_bytes_per_second(rate.speed)
        assert lane is not None
        # the kernel computes the rate as lanes x lane speed: the parts agree with the whole
        assert rate.bytes_per_second == rate.width * lane, text


def test_hostile_rate_texts_fail_cleanly_or_parse_the_rate_only() -> None:
    huge = "400 Gb/sec (" + "4" * 1_000_000 + "X NDR)"
    assert parse_link_rate(huge) == LinkRate(400 * GBPS)
    assert parse_link_rate("400 Gb/sec " + " " * 100_000 + "(4X NDR)") == LinkRate(400 * GBPS)
    for bad in ("", "NDR", "(4X NDR)", "4X NDR 400 Gb/sec", "\x00" * 64):
        with pytest.raises(ValueError):
            parse_link_rate(bad)


# -- --infiniband.expected-rate ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("mlx5_*=400", ExpectedRate("mlx5_*", None, 400 * GBPS)),
        ("mlx5_[0-9]:1=400Gb/s", ExpectedRate("mlx5_[0-9]", 1, 400 * GBPS)),
        ("mlx5_1?=200G", ExpectedRate("mlx5_1?", None, 200 * GBPS)),
        ("ibp*=2.5", ExpectedRate("ibp*", None, 312_500_000)),
    ],
)
def test_parse_expected_rate(text: str, expected: ExpectedRate) -> None:
    assert parse_expected_rate(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "mlx5_*", "=400", "mlx5_*=", "mlx5_*=0", "mlx5_*=-4", "mlx5/*=400", "a" * 70 + "=1"],
)
def test_parse_expected_rate_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="DEVICE_GLOB"):
        parse_expected_rate(text)


def test_a_bad_expected_rate_flag_is_one_line_and_exit_2() -> None:
    proc = fabricscope(["agent", "--once", "--infiniband.expected-rate", "mlx5_*=fast"])
    assert proc.returncode == 2
    assert "DEVICE_GLOB[:PORT]=RATE_GBPS" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- the port's rate against history, peers and expectation --------------------------------


def set_rate(root: Path, device: str, text: str) -> None:
    (root / "class/infiniband" / device / "ports/1/rate").resolve().write_text(text + "\n")


def checks(snap: InfinibandSnapshot, device: str) -> dict[str, bool]:
    return {c.comparison: c.degraded for c in capacity.rate_checks(snap) if c.device == device}


def rendered(snap: InfinibandSnapshot) -> dict[tuple[str, ...], float]:
    out = Families()
    render(snap, out)
    return {
        labels: value
        for spec, samples in out.items()
        if spec.name == "fabricscope_infiniband_port_rate_degraded"
        for labels, value in samples
    }


def test_a_rail_trained_down_is_found_by_its_history_and_its_peers(dgx_sys_copy: Path) -> None:
    sampler = InfinibandSampler(SysfsReader(dgx_sys_copy))
    first = sampler.sample()
    assert capacity.findings(first) == []
    assert checks(first, "mlx5_4") == {"peers": False, "history": False}
    set_rate(dgx_sys_copy, "mlx5_4", "100 Gb/sec (1X NDR)")  # the issue's fault: still ACTIVE
    snap = sampler.sample()
    assert checks(snap, "mlx5_4") == {"peers": True, "history": True}
    (finding,) = capacity.findings(snap)
    assert (finding.kind, finding.subject) == ("port_rate_degraded", "mlx5_4/1")
    assert "100 Gb/s (1X NDR)" in finding.detail
    assert "400 Gb/s (4X NDR) of 6 of the 7 MT4129 Ethernet ports here (width 4X -> 1X)" in (
        finding.detail
    )
    assert "its own 400 Gb/s (4X NDR) since the agent started (width 4X -> 1X)" in finding.detail
    series = rendered(snap)
    assert series[("mlx5_4", "1", "peers")] == 1 and series[("mlx5_4", "1", "history")] == 1
    assert series[("mlx5_0", "1", "peers")] == 0
    # the storage NICs (ConnectX-6 Dx, 100G by design) are peers of each other only
    assert series[("mlx5_1", "1", "peers")] == 0
    assert ("mlx5_11", "1", "history") not in series  # DOWN: not judged (placeholder rate)


def test_a_speed_drop_is_named_as_one(dgx_sys_copy: Path) -> None:
    sampler = InfinibandSampler(SysfsReader(dgx_sys_copy))
    sampler.sample()
    set_rate(dgx_sys_copy, "mlx5_9", "200 Gb/sec (4X HDR)")
    (finding,) = capacity.findings(sampler.sample())
    assert "speed NDR -> HDR" in finding.detail and "width" not in finding.detail


def test_one_shot_reads_have_no_history_but_still_peers(dgx_sys_copy: Path) -> None:
    set_rate(dgx_sys_copy, "mlx5_4", "100 Gb/sec (1X NDR)")
    snap = InfinibandSampler(SysfsReader(dgx_sys_copy)).sample()  # a new sampler: its first look
    assert checks(snap, "mlx5_4") == {"peers": True, "history": False}


def test_no_majority_no_peer_comparison(dgx_sys_copy: Path) -> None:
    for dev in ("mlx5_0", "mlx5_3", "mlx5_4"):  # 3 of 7 ConnectX-7 ports at 200, 4 at 400
        set_rate(dgx_sys_copy, dev, "200 Gb/sec (2X NDR)")
    snap = InfinibandSampler(SysfsReader(dgx_sys_copy)).sample()
    assert "peers" in checks(snap, "mlx5_0")  # 4 of 7 is a majority
    set_rate(dgx_sys_copy, "mlx5_5", "200 Gb/sec (2X NDR)")  # 4 of 7 at 200: the reference is 200
    snap = InfinibandSampler(SysfsReader(dgx_sys_copy)).sample()
    assert checks(snap, "mlx5_9")["peers"] is False  # faster than the reference: not below
    assert checks(snap, "mlx5_0")["peers"] is False  # (the expectation flag is for this case)
    set_rate(
        dgx_sys_copy, "mlx5_5", "300 Gb/sec (3X NDR)"
    )  # 3 at 200, 3 at 400, 1 other: no majority
    snap = InfinibandSampler(SysfsReader(dgx_sys_copy)).sample()
    assert all("peers" not in checks(snap, d) for d in ("mlx5_0", "mlx5_9", "mlx5_5"))


def test_fewer_than_three_peers_are_not_compared(dgx_sys_copy: Path) -> None:
    set_rate(dgx_sys_copy, "mlx5_2", "50 Gb/sec (2X EDR)")
    snap = InfinibandSampler(SysfsReader(dgx_sys_copy)).sample()
    # two ConnectX-6 Dx ports of four left: one against one cannot say which is wrong
    two = InfinibandSnapshot(
        devices=tuple(d for d in snap.devices if d.name in ("mlx5_1", "mlx5_2")), issues=()
    )
    assert all(c.comparison != "peers" for c in capacity.rate_checks(two))


def test_expected_rate_matches_device_and_port(dgx_sys_copy: Path) -> None:
    rules = [parse_expected_rate("mlx5_[1278]=100"), parse_expected_rate("mlx5_*:1=400")]
    snap = InfinibandSampler(SysfsReader(dgx_sys_copy), rules).sample()
    assert checks(snap, "mlx5_1")["expected"] is False  # first match: 100, and it runs 100
    assert checks(snap, "mlx5_0")["expected"] is False
    set_rate(dgx_sys_copy, "mlx5_10", "200 Gb/sec (4X HDR)")
    snap = InfinibandSampler(SysfsReader(dgx_sys_copy), rules).sample()
    assert checks(snap, "mlx5_10") == {"expected": True, "peers": True, "history": False}
    other_port = InfinibandSampler(SysfsReader(dgx_sys_copy), [parse_expected_rate("mlx5_*:2=400")])
    assert "expected" not in checks(other_port.sample(), "mlx5_10")


def test_history_follows_the_hca_not_the_name(dgx_sys_copy: Path) -> None:
    sampler = InfinibandSampler(SysfsReader(dgx_sys_copy))
    sampler.sample()
    guid = (dgx_sys_copy / "class/infiniband/mlx5_4/node_guid").resolve()
    guid.write_text("b83f:d203:00ff:0001\n")  # the card was replaced: a new node GUID
    set_rate(dgx_sys_copy, "mlx5_4", "200 Gb/sec (2X NDR)")
    assert checks(sampler.sample(), "mlx5_4")["history"] is False


def test_a_port_that_goes_down_and_back_slower_keeps_its_history(dgx_sys_copy: Path) -> None:
    sampler = InfinibandSampler(SysfsReader(dgx_sys_copy))
    sampler.sample()
    state = (dgx_sys_copy / "class/infiniband/mlx5_4/ports/1/state").resolve()
    state.write_text("1: DOWN\n")
    set_rate(dgx_sys_copy, "mlx5_4", "40 Gb/sec (4X QDR)")  # what a DOWN ConnectX-7 port reads
    snap = sampler.sample()
    assert checks(snap, "mlx5_4") == {}  # DOWN: port_down's business, no rate judgement
    state.write_text("4: ACTIVE\n")
    set_rate(dgx_sys_copy, "mlx5_4", "200 Gb/sec (2X NDR)")
    assert checks(sampler.sample(), "mlx5_4")["history"] is True


def test_history_is_bounded_and_forgets_vanished_devices(dgx_sys_copy: Path) -> None:
    one = InfinibandSampler(SysfsReader(dgx_sys_copy)).sample()
    dev = next(d for d in one.devices if d.name == "mlx5_0")
    many = InfinibandSnapshot(
        devices=tuple(
            replace(dev, name=f"mlx5_{i}", node_guid=f"{i:016x}")
            for i in range(capacity.MAX_HISTORY + 50)
        )
    )
    peaks = capacity.PeakRates()
    assert len(peaks.update(many)) == capacity.MAX_HISTORY
    assert len(peaks.update(one)) == 11  # the real tree's ACTIVE ports; the rest forgotten


def test_the_agent_exports_width_speed_and_the_judgement(dgx_sys_copy: Path) -> None:
    set_rate(dgx_sys_copy, "mlx5_4", "100 Gb/sec (1X NDR)")
    proc = fabricscope(
        [
            "agent",
            "--once",
            "--no-sampler.netdev",
            f"--path.sysfs={dgx_sys_copy}",
            "--infiniband.expected-rate=mlx5_[0345]=400",
        ]
    )
    assert proc.returncode == 0, proc.stderr
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(proc.stdout)
        for s in fam.samples
    }
    p = "fabricscope_infiniband_port_"
    m4 = (("device", "mlx5_4"), ("port", "1"))
    assert got[(p + "link_width", m4)] == 1
    assert (p + "lane_speed_bytes_per_second", m4) not in got  # the rate / width, below full
    assert got[(p + "rate_bytes_per_second", m4)] == 100 * GBPS
    assert got[(p + "rate_degraded", (("comparison", "expected"), *m4))] == 1
    assert got[(p + "rate_degraded", (("comparison", "peers"), *m4))] == 1
    assert got[("fabricscope_findings", (("kind", "port_rate_degraded"),))] == 1
    full = fabricscope(
        [
            "agent",
            "--once",
            "--no-sampler.netdev",
            f"--path.sysfs={dgx_sys_copy}",
            "--collector.detail=full",
        ]
    )
    assert f'{p}lane_speed_bytes_per_second{{device="mlx5_4",port="1"}} 1.25e+10' in full.stdout


# -- PCIe speed: NICs always, GPUs only busy ---------------------------------------------


def set_speed(root: Path, address: str, text: str, *, parent: bool = True) -> None:
    dev = (root / "bus/pci/devices" / address).resolve()
    for d in (dev, dev.parent) if parent else (dev,):
        (d / "current_link_speed").write_text(text + "\n")


def pci_findings(root: Path) -> set[tuple[str, str]]:
    topo = topology.analyse(PciSampler(SysfsReader(root)).sample())
    return {(f.kind, f.subject) for f in topology.findings(topo)}


def test_a_nic_below_its_speed_is_a_finding(dgx_sys_copy: Path) -> None:
    before = pci_findings(dgx_sys_copy)
    set_speed(dgx_sys_copy, NIC, "8.0 GT/s PCIe")  # the issue's fault: Gen5 x16 NIC at Gen3 speed
    after = pci_findings(dgx_sys_copy)
    assert after - before == {("pci_link_speed_degraded", NIC)}
    topo = topology.analyse(PciSampler(SysfsReader(dgx_sys_copy)).sample())
    (link,) = [x for x in topo.links if x.device == NIC]
    assert (link.speed, link.expected_speed, link.speed_degraded) == (8e9, 32e9, True)
    (finding,) = [f for f in topology.findings(topo) if f.kind == "pci_link_speed_degraded"]
    assert "8 GT/s, below the 32 GT/s" in finding.detail and "mlx5_3" in finding.detail


def test_a_gen4_nic_under_a_gen5_switch_is_at_its_speed(dgx_sys_copy: Path) -> None:
    topo = topology.analyse(PciSampler(SysfsReader(dgx_sys_copy)).sample())
    cx6 = {x.device: x for x in topo.links}["0000:1b:00.0"]  # ConnectX-6 Dx, real lspci
    assert (cx6.speed, cx6.expected_speed, cx6.speed_degraded) == (16e9, 16e9, False)


def test_a_gpu_at_idle_speed_is_not_judged_by_sysfs(dgx_sys_copy: Path) -> None:
    set_speed(dgx_sys_copy, "0000:3b:00.0", "2.5 GT/s PCIe")  # GPU 1 idle, as real idle GPUs read
    topo = topology.analyse(PciSampler(SysfsReader(dgx_sys_copy)).sample())
    gpu = {x.device: x for x in topo.links}["0000:3b:00.0"]
    assert gpu.speed_degraded is None
    assert not {k for k, _ in pci_findings(dgx_sys_copy)} & {"pci_link_speed_degraded"}


def test_unknown_speeds_and_virtual_functions_are_not_judged() -> None:
    snap = PciSampler(SysfsReader(FIXTURES / "cloud-vm-h100-vf" / "sys")).sample()
    topo = topology.analyse(snap)
    nic_links = [x for x in topo.links if snap.get(x.device) and snap.get(x.device).role == "nic"]
    assert nic_links and all(x.speed_degraded is None for x in nic_links)


def test_amd_genoa_nics_on_root_ports_hold_their_speed() -> None:
    snap = PciSampler(SysfsReader(FIXTURES / "amd-genoa-rootports" / "sys")).sample()
    nics = [x for x in topology.analyse(snap).links if snap.get(x.device).role == "nic"]
    assert nics and all(x.speed_degraded is False for x in nics)


def gpu(gen: int | None, max_gen: int | None, procs: int | None) -> NvmlGpu:
    return NvmlGpu(
        index=0,
        pci_bus_id="0000:3b:00.0",
        pcie=PcieLink(gen, max_gen, 16, 16, 0),
        compute_processes=None
        if procs is None
        else tuple(ComputeProcess(100 + i, 1 << 30) for i in range(procs)),
    )


@pytest.mark.parametrize(
    ("gen", "max_gen", "procs", "judged"),
    [
        (1, 5, 0, None),  # idle at Gen1: by design, never judged
        (1, 5, None, None),  # NVML did not answer the process list
        (5, 5, 2, False),  # busy at its highest generation
        (4, 5, 1, True),  # busy below it
        (4, 4, 1, False),  # a Gen5 GPU in a Gen4 system: NVML's maximum is the system's
        (None, 5, 1, None),
        (4, None, 1, None),
    ],
)
def test_a_gpu_is_judged_on_generation_only_when_busy(
    gen: int | None, max_gen: int | None, procs: int | None, judged: bool | None
) -> None:
    g = gpu(gen, max_gen, procs)
    assert generation_degraded_under_load(g) is judged
    kinds = {f.kind for f in nvml_findings(NvmlSnapshot(gpus=(g,)))}
    assert ("gpu_pcie_speed_degraded" in kinds) is bool(judged)
