"""agent/pci/topology.py on hand-built snapshots (path types checked by hand), and on a tree
rebuilt from a real host whose `nvidia-smi topo -m` is known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.core.findings import Finding
from agent.core.sysfs import SysfsReader
from agent.node_findings import collect
from agent.pci.sampler import AcsState, PciDevice, PciLink, PciSampler, PciSnapshot, PortType, Role
from agent.pci.topology import (
    PATH_RANK,
    GpuAffinity,
    LinkCheck,
    analyse,
    findings,
    path_type,
)
from agent.topo_report import format_table, to_json


def dev(
    address: str,
    role: Role,
    upstream: tuple[str, ...] = (),
    *,
    host: str = "pci0000:00",
    numa: int | None = 0,
    width: tuple[int | None, int | None] = (16, 16),
    port_type: PortType | None = None,
    acs: AcsState | None = None,
    rdma: tuple[str, ...] = (),
) -> PciDevice:
    return PciDevice(
        address=address,
        role=role,
        sysfs_path="devices/" + "/".join((host, *upstream, address)),
        host_bridge=host,
        upstream=upstream,
        numa_node=numa,
        link=PciLink(width=width[0], max_width=width[1]),
        port_type=port_type,
        acs=acs,
        rdma_devices=rdma,
    )


def snapshot(*devices: PciDevice) -> PciSnapshot:
    return PciSnapshot(devices=tuple(sorted(devices, key=lambda d: d.address)))


# One root port, a PEX switch (up 02, downs 03:00/03:01), a second-level switch under 03:02
# (up 05, downs 06:00/06:01). GPU A and NIC A behind the first switch, GPU B and NIC B
# behind the second; a dual-function NIC directly on a second root port of the same host
# bridge; a GPU on another host bridge of NUMA 0 and one on NUMA 1.
RP, UP, D0, D1, D2 = "0000:00:01.0", "0000:02:00.0", "0000:03:00.0", "0000:03:01.0", "0000:03:02.0"
UP2, E0, E1 = "0000:05:00.0", "0000:06:00.0", "0000:06:01.0"
TREE = snapshot(
    dev(RP, "bridge"),
    dev(UP, "bridge", (RP,)),
    dev(D0, "bridge", (RP, UP)),
    dev(D1, "bridge", (RP, UP)),
    dev(D2, "bridge", (RP, UP)),
    dev(UP2, "bridge", (RP, UP, D2)),
    dev(E0, "bridge", (RP, UP, D2, UP2)),
    dev(E1, "bridge", (RP, UP, D2, UP2)),
    dev("0000:04:00.0", "gpu", (RP, UP, D0)),
    dev("0000:04:01.0", "nic", (RP, UP, D1), rdma=("mlx5_0",)),
    dev("0000:07:00.0", "gpu", (RP, UP, D2, UP2, E0)),
    dev("0000:08:00.0", "nic", (RP, UP, D2, UP2, E1), rdma=("mlx5_1",)),
    dev("0000:00:02.0", "bridge"),
    dev("0000:09:00.0", "nic", ("0000:00:02.0",), rdma=("mlx5_2",)),
    dev("0000:09:00.1", "nic", ("0000:00:02.0",), rdma=("mlx5_3",)),
    dev("0000:40:01.0", "bridge", host="pci0000:40"),
    dev("0000:41:00.0", "gpu", ("0000:40:01.0",), host="pci0000:40"),
    dev("0000:80:01.0", "bridge", host="pci0000:80", numa=1),
    dev("0000:81:00.0", "gpu", ("0000:80:01.0",), host="pci0000:80", numa=1),
)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("0000:04:00.0", "0000:04:01.0", "PIX"),  # one switch: down -> up -> down
        ("0000:07:00.0", "0000:08:00.0", "PIX"),  # one (second-level) switch
        ("0000:04:00.0", "0000:08:00.0", "PXB"),  # two switches, below one root port
        ("0000:04:00.0", "0000:07:00.0", "PXB"),
        ("0000:09:00.0", "0000:09:00.1", "PIX"),  # two functions of one card: one bridge
        ("0000:04:00.0", "0000:09:00.0", "PHB"),  # two root ports of one host bridge
        ("0000:04:00.0", "0000:41:00.0", "NODE"),  # two host bridges, both NUMA 0
        ("0000:04:00.0", "0000:81:00.0", "SYS"),  # NUMA 0 <-> NUMA 1
        ("0000:41:00.0", "0000:81:00.0", "SYS"),
    ],
)
def test_path_types_by_hand(a: str, b: str, expected: str) -> None:
    da, db = TREE.get(a), TREE.get(b)
    assert da is not None and db is not None
    assert path_type(da, db, TREE) == expected
    assert path_type(db, da, TREE) == expected


@pytest.mark.parametrize(
    ("numa_a", "numa_b", "expected"),
    [(0, 0, "NODE"), (0, 1, "SYS"), (-1, -1, "NODE"), (None, None, "NODE"), (-1, 0, "SYS")],
)
def test_between_host_bridges_numa_decides(
    numa_a: int | None, numa_b: int | None, expected: str
) -> None:
    a = dev("0000:01:00.0", "gpu", host="pci0000:00", numa=numa_a)
    b = dev("0000:41:00.0", "nic", host="pci0000:40", numa=numa_b)
    assert path_type(a, b, snapshot(a, b)) == expected


def test_root_port_numa_outranks_a_device_override() -> None:
    """The root complex's node decides NODE vs SYS; one device's numa_node does not."""
    snap = snapshot(
        dev("0000:00:01.0", "bridge", numa=0),
        dev("0000:01:00.0", "gpu", ("0000:00:01.0",), numa=0),
        dev("0000:40:01.0", "bridge", host="pci0000:40", numa=0),
        dev("0000:41:00.0", "nic", ("0000:40:01.0",), host="pci0000:40", numa=1),
    )
    gpu, nic = snap.by_role("gpu")[0], snap.by_role("nic")[0]
    assert path_type(gpu, nic, snap) == "NODE"


def test_port_types_from_config_outrank_depth() -> None:
    """With port types known, they decide which bridges form one switch (here the depth
    rule would say one switch: PIX; the types say three: PXB)."""
    upstream = (RP, UP)
    kinds: dict[str, PortType] = {RP: "root_port", UP: "downstream_port"}
    bridges = [dev(a, "bridge", upstream[:i], port_type=kinds[a]) for i, a in enumerate(upstream)]
    bridges += [
        dev(D0, "bridge", upstream, port_type="upstream_port"),
        dev(D1, "bridge", upstream, port_type="upstream_port"),
    ]
    gpu = dev("0000:04:00.0", "gpu", (*upstream, D0))
    nic = dev("0000:04:01.0", "nic", (*upstream, D1))
    assert path_type(gpu, nic, snapshot(*bridges, gpu, nic)) == "PXB"
    untyped = snapshot(*(dev(b.address, "bridge", b.upstream) for b in bridges), gpu, nic)
    assert path_type(gpu, nic, untyped) == "PIX"


def test_affinity_ties_and_cross_numa() -> None:
    topo = analyse(TREE)
    assert topo.affinity == (
        GpuAffinity("0000:04:00.0", 0, 0, None, ("0000:04:01.0",), "PIX", False),
        GpuAffinity("0000:07:00.0", 1, 0, None, ("0000:08:00.0",), "PIX", False),
        # its host bridge has no NIC: every NIC is NODE away, a four-way tie
        GpuAffinity(
            "0000:41:00.0",
            2,
            0,
            None,
            ("0000:04:01.0", "0000:08:00.0", "0000:09:00.0", "0000:09:00.1"),
            "NODE",
            False,
        ),
        GpuAffinity(
            "0000:81:00.0",
            3,
            1,
            None,
            ("0000:04:01.0", "0000:08:00.0", "0000:09:00.0", "0000:09:00.1"),
            "SYS",
            True,
        ),
    )
    assert [f.subject for f in findings(topo) if f.kind == "nic_cross_numa"] == ["0000:81:00.0"]


def test_cross_numa_unknown_and_no_nics() -> None:
    gpu = dev("0000:01:00.0", "gpu", numa=-1)
    nic = dev("0000:41:00.0", "nic", host="pci0000:40", numa=1)
    (aff,) = analyse(snapshot(gpu, nic)).affinity
    assert (aff.nearest_path_type, aff.cross_numa) == ("SYS", None)  # GPU's node unknown
    (alone,) = analyse(snapshot(gpu)).affinity
    assert (alone.nearest_nics, alone.nearest_path_type, alone.cross_numa) == ((), None, None)
    assert findings(analyse(snapshot(gpu))) == []


def test_link_checks_judge_each_link_once_at_its_downstream_end() -> None:
    rp, up, down = "0000:00:01.0", "0000:01:00.0", "0000:02:00.0"
    snap = snapshot(
        dev(rp, "bridge", width=(8, 16)),  # reports the same x8 link as `up`: not judged
        dev(up, "bridge", (rp,), width=(8, 16)),
        dev(down, "bridge", (rp, up), width=(8, 16)),  # the link to its child: child judges
        dev("0000:03:00.0", "nic", (rp, up, down), width=(8, 8)),  # x8 card: not degraded
        dev("0000:02:01.0", "bridge", (rp, up), width=(8, 8)),
        dev("0000:04:00.0", "gpu", (rp, up, "0000:02:01.0"), width=(8, 16)),  # x8 slot: fine
        dev("0000:02:02.0", "bridge", (rp, up), width=(16, 16)),
        dev("0000:05:00.0", "nic", (rp, up, "0000:02:02.0"), width=(4, 16)),
        dev("0000:05:00.1", "nic", (rp, up, "0000:02:02.0"), width=(4, 16)),
        dev("0000:02:03.0", "bridge", (rp, up), width=(None, 16)),
        dev("0000:06:00.0", "gpu", (rp, up, "0000:02:03.0"), width=(None, 16)),
    )
    topo = analyse(snap)
    assert topo.links == (
        LinkCheck(up, rp, 8, 16, True),
        LinkCheck("0000:03:00.0", down, 8, 8, False),
        LinkCheck("0000:04:00.0", "0000:02:01.0", 8, 8, False),
        LinkCheck("0000:05:00.0", "0000:02:02.0", 4, 16, True),
        LinkCheck("0000:05:00.1", "0000:02:02.0", 4, 16, True),
        LinkCheck(
            "0000:06:00.0",
            "0000:02:03.0",
            None,
            16,
            None,
            False,
            "width 0 and speed Unknown: the link state is not reported",
        ),
    )
    degraded = [f.subject for f in findings(topo) if f.kind == "pci_link_width_degraded"]
    assert degraded == ["0000:01:00.0", "0000:05:00.0"]  # one finding per physical link


def test_acs_findings_skip_root_ports_and_unknowns() -> None:
    on = AcsState(0x170, 0x001D)
    rp, up = "0000:00:01.0", "0000:01:00.0"
    snap = snapshot(
        dev(rp, "bridge", acs=on),  # P2P across root ports goes through the RC anyway
        dev(up, "bridge", (rp,), acs=AcsState(None, 0)),
        dev("0000:02:00.0", "bridge", (rp, up), acs=on),
        dev("0000:02:01.0", "bridge", (rp, up), acs=None),  # config unreadable: unknown
        dev("0000:03:00.0", "gpu", (rp, up, "0000:02:00.0")),
        dev("0000:04:00.0", "nic", (rp, up, "0000:02:01.0")),
    )
    assert findings(analyse(snap)) == [
        Finding(
            "acs_p2p_redirect",
            "0000:02:00.0",
            "bridge 0000:02:00.0 redirects peer-to-peer traffic to the root complex (ACS "
            "Control 0x001d); GPUDirect P2P/RDMA through it takes the long way",
        )
    ]


SMALL = snapshot(
    dev("0000:00:01.0", "bridge"),
    dev("0000:01:00.0", "gpu", ("0000:00:01.0",)),
    dev("0000:02:00.0", "nic", ("0000:00:01.0",), rdma=("mlx5_0",)),
    dev("0000:80:01.0", "bridge", host="pci0000:80", numa=1),
    dev("0000:81:00.0", "gpu", ("0000:80:01.0",), host="pci0000:80", numa=1),
)


def test_format_table_exact() -> None:
    assert format_table(analyse(SMALL), collect(pci=SMALL)) == (
        "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\n"
        "GPU0\t X \tSYS\tPIX\tN/A\t0\n"
        "GPU1\tSYS\t X \tSYS\tN/A\t1\n"
        "\n"
        "Legend:\n"
        "\n"
        "  X    = Self\n"
        "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA "
        "nodes\n"
        "  NODE = Connection traversing PCIe and the interconnect between host bridges in a "
        "node\n"
        "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n"
        "  PXB  = Connection traversing multiple PCIe bridges (without the PCIe Host Bridge)\n"
        "  PIX  = Connection traversing at most a single PCIe bridge\n"
        "  NV#  = Connection traversing a bonded set of # NVLinks (from NVML, when it answers)\n"
        "\n"
        "GPU Legend:\n"
        "\n"
        "  GPU0: 0000:01:00.0\n"
        "  GPU1: 0000:81:00.0\n"
        "\n"
        "NIC Legend:\n"
        "\n"
        "  NIC0: mlx5_0 (0000:02:00.0)\n"
        "\n"
        "PCIe links on GPU/NIC paths: 3 judged, 0 degraded, 0 not reported\n"
        "\n"
        "ACS on bridges of GPU/NIC paths:\n"
        "\n"
        "  0000:00:01.0 bridge: config space not readable (privilege: needs CAP_SYS_ADMIN)\n"
        "  0000:80:01.0 bridge: config space not readable (privilege: needs CAP_SYS_ADMIN)\n"
        "\n"
        "RDMA ports:\n"
        "\n"
        "  not read (no InfiniBand sampler data)\n"
        "\n"
        "Findings:\n"
        "\n"
        "  warning  nic_cross_numa 0000:81:00.0: GPU 0000:81:00.0 is on NUMA node 1 but its "
        "nearest NIC mlx5_0 (0000:02:00.0) (SYS) is on NUMA node 0\n"
        "\n"
        "  not checked (no data): infiniband, nvml, workload\n"
    )


def test_to_json_exact_and_serialisable() -> None:
    doc = to_json(analyse(SMALL), collect(pci=SMALL))
    assert json.loads(json.dumps(doc)) == doc
    assert doc == {
        "gpus": [
            {
                "pci_bus_id": "0000:01:00.0",
                "numa_node": 0,
                "cpus": None,
                "rdma_devices": [],
                "netdevs": [],
                "upstream": ["0000:00:01.0"],
                "virtual_function": False,
                "index": 0,
                "nearest_nics": ["0000:02:00.0"],
                "nearest_path_type": "PIX",
                "nearest_nic_cross_numa": False,
            },
            {
                "pci_bus_id": "0000:81:00.0",
                "numa_node": 1,
                "cpus": None,
                "rdma_devices": [],
                "netdevs": [],
                "upstream": ["0000:80:01.0"],
                "virtual_function": False,
                "index": 1,
                "nearest_nics": ["0000:02:00.0"],
                "nearest_path_type": "SYS",
                "nearest_nic_cross_numa": True,
            },
        ],
        "nics": [
            {
                "pci_bus_id": "0000:02:00.0",
                "numa_node": 0,
                "cpus": None,
                "rdma_devices": ["mlx5_0"],
                "netdevs": [],
                "upstream": ["0000:00:01.0"],
                "virtual_function": False,
            }
        ],
        "gpu_nic_paths": [
            {"gpu": "0000:01:00.0", "nic": "0000:02:00.0", "path_type": "PIX"},
            {"gpu": "0000:81:00.0", "nic": "0000:02:00.0", "path_type": "SYS"},
        ],
        "gpu_gpu_paths": [
            {"gpu": "0000:01:00.0", "peer_gpu": "0000:81:00.0", "path_type": "SYS", "nvlinks": 0}
        ],
        "links": [
            {
                "pci_bus_id": "0000:01:00.0",
                "upstream_pci_bus_id": "0000:00:01.0",
                "width": 16,
                "expected_width": 16,
                "reported": True,
                "not_reported": None,
                "degraded": False,
            },
            {
                "pci_bus_id": "0000:02:00.0",
                "upstream_pci_bus_id": "0000:00:01.0",
                "width": 16,
                "expected_width": 16,
                "reported": True,
                "not_reported": None,
                "degraded": False,
            },
            {
                "pci_bus_id": "0000:81:00.0",
                "upstream_pci_bus_id": "0000:80:01.0",
                "width": 16,
                "expected_width": 16,
                "reported": True,
                "not_reported": None,
                "degraded": False,
            },
        ],
        "acs": [
            {
                "pci_bus_id": a,
                "port_type": None,
                "state": "unreadable",
                "control": None,
                "judged": False,
                "finding": False,
            }
            for a in ("0000:00:01.0", "0000:80:01.0")
        ],
        "acs_p2p_redirect": [],
        "pci_unavailable": None,
        "rdma_ports": None,
        "findings": [
            {
                "kind": "nic_cross_numa",
                "severity": "warning",
                "subject": "0000:81:00.0",
                "detail": "GPU 0000:81:00.0 is on NUMA node 1 but its nearest NIC mlx5_0 "
                "(0000:02:00.0) (SYS) is on NUMA node 0",
                "alert": "FabricscopeGpuNearestNicCrossNuma",
            }
        ],
        "areas_not_checked": ["infiniband", "nvml", "workload"],
    }


def test_path_ranks() -> None:
    assert PATH_RANK == {"PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5}


# -- a real host: ASUS ESC8000A-E12, 2x AMD Genoa, 4x RTX 6000 Ada, 2x dual-port ConnectX-7 --
#
# From luigifcruz/stelline docs/quickstart/validated-hardware/server/asus-esc8000a-e12.md
# @ 5abfb58163aa40435812fa5e5a06c6eff46a8917 (MIT): `lspci -tv` gives the tree (every GPU and
# NIC directly on an AMD root port, each on its own host bridge), the `lspci -vvv` blocks the
# NUMA nodes of the GPUs and of function 0 of each NIC (function 1 is the same card, so the
# same node is written), `nvidia-smi topo -m` the CPU affinity and the expected matrix.
# Root ports get no numa_node file (their blocks are not in the capture), nor do
# non-GPU/NIC functions other than the GPUs' audio functions, which test classification.
ASUS = [
    # (host bridge, root port, function, vendor, class, numa, rdma device, cpulist)
    ("00", "0000:00:01.1", "0000:01:00.0", 0x10DE, 0x030000, 0, None, "0-31"),
    ("00", "0000:00:01.1", "0000:01:00.1", 0x10DE, 0x040300, 0, None, None),
    ("20", "0000:20:03.1", "0000:21:00.0", 0x15B3, 0x020000, 0, "mlx5_0", None),
    ("20", "0000:20:03.1", "0000:21:00.1", 0x15B3, 0x020000, 0, "mlx5_1", None),
    ("40", "0000:40:01.1", "0000:41:00.0", 0x10DE, 0x030000, 0, None, "0-31"),
    ("40", "0000:40:01.1", "0000:41:00.1", 0x10DE, 0x040300, 0, None, None),
    ("80", "0000:80:01.1", "0000:81:00.0", 0x15B3, 0x020000, 1, "mlx5_2", None),
    ("80", "0000:80:01.1", "0000:81:00.1", 0x15B3, 0x020000, 1, "mlx5_3", None),
    ("c0", "0000:c0:01.1", "0000:c1:00.0", 0x10DE, 0x030000, 1, None, "32-63"),
    ("e0", "0000:e0:01.1", "0000:e1:00.0", 0x10DE, 0x030000, 1, None, "32-63"),
]
# the capture's header line ends "CPU Affinity    NUMA Affinity   GPU NUMA ID"
ASUS_TOPO_M = """\
        GPU0    GPU1    GPU2    GPU3    NIC0    NIC1    NIC2    NIC3    CPU Affinity ...
GPU0     X      NODE    SYS     SYS     NODE    NODE    SYS     SYS     0-31    0               N/A
GPU1    NODE     X      SYS     SYS     NODE    NODE    SYS     SYS     0-31    0               N/A
GPU2    SYS     SYS      X      NODE    SYS     SYS     NODE    NODE    32-63   1               N/A
GPU3    SYS     SYS     NODE     X      SYS     SYS     NODE    NODE    32-63   1               N/A
NIC0    NODE    NODE    SYS     SYS      X      PIX     SYS     SYS
NIC1    NODE    NODE    SYS     SYS     PIX      X      SYS     SYS
NIC2    SYS     SYS     NODE    NODE    SYS     SYS      X      PIX
NIC3    SYS     SYS     NODE    NODE    SYS     SYS     PIX      X
"""


@pytest.fixture
def asus_sys_root(tmp_path: Path) -> Path:
    """A sysfs tree of the ASUS ESC8000A-E12 above, written from the transcribed table."""
    for host, rp, fn, vendor, cls, numa, rdma, cpus in ASUS:
        base = tmp_path / "devices" / f"pci0000:{host}"
        for d, v, c in ((base / rp, 0x1022, 0x060400), (base / rp / fn, vendor, cls)):
            d.mkdir(parents=True, exist_ok=True)
            (d / "vendor").write_text(f"0x{v:04x}\n")
            (d / "class").write_text(f"0x{c:06x}\n")
        (base / rp / fn / "numa_node").write_text(f"{numa}\n")
        if cpus:
            (base / rp / fn / "local_cpulist").write_text(cpus + "\n")
        if rdma:
            (base / rp / fn / "infiniband" / rdma).mkdir(parents=True)
        for addr, target in ((rp, base / rp), (fn, base / rp / fn)):
            link = tmp_path / "bus/pci/devices" / addr
            if not link.is_symlink():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(Path("../../..") / target.relative_to(tmp_path))
    return tmp_path


def test_asus_esc8000a_matches_its_nvidia_smi_topo_m(asus_sys_root: Path) -> None:
    snap = PciSampler(SysfsReader(asus_sys_root)).sample()
    topo = analyse(snap)
    names = [f"GPU{i}" for i in range(4)] + [f"NIC{i}" for i in range(4)]
    devices = [*topo.gpus, *topo.nics]
    rows = [line.split() for line in ASUS_TOPO_M.splitlines()[1:]]
    expected = {(r[0], names[j]): r[1 + j] for r in rows for j in range(8) if r[1 + j] != "X"}
    got = {
        (names[i], names[j]): path_type(a, b, snap)
        for i, a in enumerate(devices)
        for j, b in enumerate(devices)
        if i != j
    }
    assert len(expected) == 8 * 7
    assert got == expected
    assert [n.rdma_devices for n in topo.nics] == [
        ("mlx5_0",),
        ("mlx5_1",),
        ("mlx5_2",),
        ("mlx5_3",),
    ]
    # the CPU and NUMA affinity columns
    table = format_table(topo, collect(pci=topo)).splitlines()
    assert [line.split("\t")[-2:] for line in table[1:5]] == [[r[9], r[10]] for r in rows[:4]]
    assert findings(topo) == []
