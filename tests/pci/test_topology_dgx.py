"""The DGX-class fixture end to end: exactly the injected PCI faults are found, the path
matrix is the Dell topology's (and the real H100 `nvidia-smi topo -m` pattern), the tree is
what build_fixture.py makes, and node_exporter reads its InfiniBand part."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.core.findings import Finding
from agent.core.sysfs import SysfsReader
from agent.pci.sampler import PciSampler, PciSnapshot
from agent.pci.topology import Topology, analyse, findings, path_type

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "dgx-h100"

# The Dell lspci: one PEX890xx switch per GPU, the GPU's ConnectX-7 (and on two switches a
# dual-port ConnectX-6 Dx) beside it; buses below 0x80 are NUMA node 0, the rest node 1.
SWITCH_NICS = {
    "0000:19:00.0": ("0000:1a:00.0", "0000:1b:00.0", "0000:1b:00.1"),
    "0000:3b:00.0": ("0000:3c:00.0",),
    "0000:4c:00.0": ("0000:4d:00.0",),
    "0000:5d:00.0": ("0000:5e:00.0",),
    "0000:9b:00.0": ("0000:9c:00.0", "0000:9d:00.0", "0000:9d:00.1"),
    "0000:bb:00.0": ("0000:bc:00.0",),
    "0000:cb:00.0": ("0000:cc:00.0",),
    "0000:db:00.0": ("0000:dc:00.0",),
}
CX7 = ("mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11")

# NVIDIA/nccl issue 1453 (a real 8x H100 host): the GPU rows, NIC1..NIC8 columns (NIC0, a
# management NIC SYS to everything, has no counterpart here). GPU i is PIX with NIC 8-i.
ISSUE_1453_ROWS = """\
SYS SYS SYS SYS NODE NODE NODE PIX
SYS SYS SYS SYS NODE NODE PIX NODE
SYS SYS SYS SYS NODE PIX NODE NODE
SYS SYS SYS SYS PIX NODE NODE NODE
NODE NODE NODE PIX SYS SYS SYS SYS
NODE NODE PIX NODE SYS SYS SYS SYS
NODE PIX NODE NODE SYS SYS SYS SYS
PIX NODE NODE NODE SYS SYS SYS SYS
"""


def socket_of(address: str) -> int:
    return 0 if int(address[5:7], 16) < 0x80 else 1


@pytest.fixture
def dgx_snapshot(dgx_sys_root: Path) -> PciSnapshot:
    return PciSampler(SysfsReader(dgx_sys_root)).sample()


@pytest.fixture
def dgx_topology(dgx_snapshot: PciSnapshot) -> Topology:
    return analyse(dgx_snapshot)


def test_exactly_the_injected_pci_faults(dgx_topology: Topology) -> None:
    assert findings(dgx_topology) == [
        Finding(
            "acs_p2p_redirect",
            "0000:b9:01.0",
            "bridge 0000:b9:01.0 redirects peer-to-peer traffic to the root complex (ACS "
            "Control 0x001d); GPUDirect P2P/RDMA through it takes the long way",
        ),
        Finding(
            "acs_p2p_redirect",
            "0000:b9:02.0",
            "bridge 0000:b9:02.0 redirects peer-to-peer traffic to the root complex (ACS "
            "Control 0x001d); GPUDirect P2P/RDMA through it takes the long way",
        ),
        Finding(
            "nic_cross_numa",
            "0000:5d:00.0",
            "GPU 0000:5d:00.0 is on NUMA node 0 but its nearest NIC mlx5_5 (0000:5e:00.0) "
            "(PIX) is on NUMA node 1",
        ),
        Finding(
            "pci_link_width_degraded",
            "0000:38:00.0",
            "PCIe link 0000:37:01.0 -> 0000:38:00.0 trained at x8, both ends support x16",
        ),
    ]


def test_gpu_nic_matrix_is_the_dell_topology(dgx_topology: Topology) -> None:
    got = {(p.a, p.b): p.path_type for p in dgx_topology.gpu_nic}
    expected = {}
    for gpu, beside in SWITCH_NICS.items():
        for nic in (n.address for n in dgx_topology.nics):
            if nic in beside:
                expected[gpu, nic] = "PIX"
            else:
                expected[gpu, nic] = "NODE" if socket_of(gpu) == socket_of(nic) else "SYS"
    assert len(expected) == 8 * 12
    assert got == expected


def test_gpu_gpu_paths(dgx_topology: Topology) -> None:
    for p in dgx_topology.gpu_gpu:
        assert p.path_type == ("NODE" if socket_of(p.a) == socket_of(p.b) else "SYS"), p
    assert len(dgx_topology.gpu_gpu) == 28


def test_cx7_columns_match_the_real_h100_topo_m(dgx_topology: Topology) -> None:
    """Reorder the issue's NIC1..NIC8 as its PIX pairing says and compare cell by cell."""
    rows = [line.split() for line in ISSUE_1453_ROWS.splitlines()]
    by_name = {n.rdma_devices[0]: n for n in dgx_topology.nics}
    snap = dgx_topology.snapshot
    for i, gpu in enumerate(dgx_topology.gpus):
        for k in range(1, 9):  # issue NICk is PIX with issue GPU(8-k): our CX7[8-k]
            nic = by_name[CX7[8 - k]]
            assert path_type(gpu, nic, snap) == rows[i][k - 1], (gpu.address, CX7[8 - k])


def test_nearest_nics(dgx_topology: Topology) -> None:
    nearest = {a.address: (a.nearest_nics, a.nearest_path_type) for a in dgx_topology.affinity}
    assert nearest == {gpu: (nics, "PIX") for gpu, nics in SWITCH_NICS.items()}
    cross = {a.address for a in dgx_topology.affinity if a.cross_numa}
    assert cross == {"0000:5d:00.0"}
    assert [a.index for a in dgx_topology.affinity] == list(range(8))


def test_injected_ib_faults_are_in_the_tree(dgx_sys_root: Path) -> None:
    """Faults 4 and 5 are asserted by the infiniband tests; here: the files are there."""
    ports = dgx_sys_root / "class/infiniband"
    down = ports / "mlx5_11/ports/1"
    assert (down / "state").read_text() == "1: DOWN\n"
    assert (down / "phys_state").read_text() == "2: Polling\n"
    assert (down / "rate").read_text() == "40 Gb/sec (4X QDR)\n"
    up = [p for p in sorted(ports.iterdir()) if p.name != "mlx5_11"]
    assert {(p / "ports/1/state").read_text() for p in up} == {"4: ACTIVE\n"}
    sat = ports / "mlx5_6/ports/1/counters"
    values = {f: (sat / f).read_text().strip() for f in os.listdir(sat)}
    assert {k: v for k, v in values.items() if k in SATURATED} == SATURATED
    plain = ports / "mlx5_0/ports/1/counters/port_xmit_wait"
    assert plain.read_text() == "0\n"


SATURATED = {
    "port_xmit_wait": "4294967295",
    "port_xmit_discards": "65535",
    "link_downed": "255",
    "excessive_buffer_overrun_errors": "15",
}


# -- the tree is what the committed generator makes ----------------------------------------


def load_builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_fixture", FIXTURE / "build_fixture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


def tree(root: Path) -> dict[str, tuple[str, bytes]]:
    """Every entry under ``root`` as git can hold it: empty directories (the generator makes
    ``bus/pci/drivers/*`` for the driver links to point at) are left out, because a fresh
    clone does not have them."""
    out: dict[str, tuple[str, bytes]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            rel = str(full.relative_to(root))
            if full.is_symlink():
                out[rel] = ("link", os.readlink(full).encode())
            elif full.is_dir():
                out[rel] = ("dir", b"")
            else:
                out[rel] = ("file", full.read_bytes())
    held = {k for k, (kind, _) in out.items() if kind != "dir"}
    prefixes = {p for k in held for p in (k.rsplit("/", i)[0] for i in range(1, k.count("/") + 1))}
    return {k: v for k, v in out.items() if v[0] != "dir" or k in prefixes}


def test_fixture_regenerates_identically(tmp_path: Path, dgx_sys_root: Path) -> None:
    load_builder().build(tmp_path / "sys")
    fresh, committed = tree(tmp_path / "sys"), tree(dgx_sys_root)
    assert sorted(fresh) == sorted(committed)
    assert [k for k in sorted(fresh) if fresh[k] != committed[k]] == []


def test_fixture_stays_small() -> None:
    size = sum(
        (Path(d) / f).stat().st_size
        for d, _, files in os.walk(FIXTURE)
        for f in files
        if not (Path(d) / f).is_symlink()
    )
    assert size < 2_000_000


# -- node_exporter reads the InfiniBand part -----------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def node_exporter_metrics(dgx_sys_root: Path) -> Iterator[str]:
    binary = shutil.which("prometheus-node-exporter")
    assert binary, "prometheus-node-exporter missing: scripts/test.sh installs it"
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--path.sysfs={dgx_sys_root}",
            "--collector.disable-defaults",
            "--collector.infiniband",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    yield r.read().decode()
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(10)


def test_node_exporter_reads_the_infiniband_part(node_exporter_metrics: str) -> None:
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(node_exporter_metrics)
        for s in fam.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples[name, tuple(sorted(labels.items()))]

    assert value("node_scrape_collector_success", collector="infiniband") == 1
    info = {dict(k[1])["device"]: dict(k[1]) for k in samples if k[0] == "node_infiniband_info"}
    assert sorted(info) == sorted(f"mlx5_{i}" for i in range(12))
    assert info["mlx5_1"]["board_id"] == "MT_0000000359"
    assert info["mlx5_0"]["hca_type"] == "MT4129"
    port = {"device": "mlx5_11", "port": "1"}
    assert value("node_infiniband_state_id", **port) == 1
    assert value("node_infiniband_physical_state_id", **port) == 2
    sat = {"device": "mlx5_6", "port": "1"}
    assert value("node_infiniband_port_transmit_wait_total", **sat) == 4294967295
    assert value("node_infiniband_link_downed_total", **sat) == 255
    assert value("node_infiniband_port_discards_transmitted_total", **sat) == 65535
    # procfs's mlx5_0 values elsewhere; node_exporter multiplies the data words by 4
    ok = {"device": "mlx5_0", "port": "1"}
    assert value("node_infiniband_port_data_received_bytes_total", **ok) == 18126345378 * 4
    assert value("node_infiniband_rate_bytes_per_second", **ok) == 400e9 / 8
