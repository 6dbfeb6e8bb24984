"""Each node state of a fleet history, as the real agent exports it (``agent --once``).

A state is a variant of the DGX H100 fixture tree (``tests/fixtures/dgx-h100``: 8
ConnectX-7 compute rails, set to InfiniBand as on an InfiniBand compute fabric, and 4
ConnectX-6 Dx Ethernet ports) with the recorded 2x H200 NVML answers
(``tests/fixtures/nvml``) whose per-GPU series are repeated for 8 GPUs:

==================  ===========================================================================
``healthy``         the tree as captured
``saturated-K``     K compute rails' 32-bit ``port_xmit_wait`` at 2^32-1, where the hardware
                    stops it (what every congested ConnectX-7 port reaches within seconds)
``disabled``        6 ports administratively disabled (``1: DOWN``, ``3: Disabled``): 0.1 % of
                    a 500-node fleet's 6,000 ports, on one node
``rate``            a rail retrained at ``200 Gb/sec (2X NDR)`` (the planted degraded port)
``x8``              a rail's ConnectX-7 retrained at PCIe x8 (the planted NIC at x8)
``lost``            GPU 1 answers GPU_IS_LOST, after XID 79 (the planted lost GPU)
==================  ===========================================================================

Only the families the shipped rules and the Fleet dashboard read are kept (found by name in
``deploy/rules/*.rules.yaml`` and ``dashboards/boards/fleet.py``). ``bench/fleet_history.py``
turns these states into a fleet's history over time; this module knows nothing of time.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agent.core.runner import SamplerSpec  # noqa: E402
from agent.core.sysfs import SysfsReader  # noqa: E402
from agent.ibpeer.sampler import IbPeerSampler  # noqa: E402
from agent.samplers import Latest  # noqa: E402
from agent.snapshot import NVML_RECORDING as IN_SNAPSHOT  # noqa: E402
from agent.snapshot import capture  # noqa: E402
from exporter.app import AgentApp  # noqa: E402
from exporter.metrics.catalog import AREAS, all_specs  # noqa: E402

DGX = ROOT / "tests" / "fixtures" / "dgx-h100" / "sys"
NVML_RECORDING = ROOT / "tests" / "fixtures" / "nvml" / "h200x2.recording.json"
RULES = ROOT / "deploy" / "rules"
FLEET_BOARD = ROOT / "dashboards" / "boards" / "fleet.py"

#: the eight ConnectX-7 compute rails of the DGX tree (InfiniBand here) and the four
#: ConnectX-6 Dx Ethernet ports
RAILS = ("mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11")
ETHERNET = ("mlx5_1", "mlx5_2", "mlx5_7", "mlx5_8")
GPUS = 8
SATURATED_MAX = 4294967295  # 2^32 - 1: a 32-bit PMA counter the hardware stopped
#: the 0.1 % of a 500-node fleet's ports, all on one node
DISABLED_PORTS = ("mlx5_1", "mlx5_2", "mlx5_7", "mlx5_8", "mlx5_10", "mlx5_11")
RATE_PORT = "mlx5_5"  # the planted degraded port (2X NDR)
X8_NIC = ("mlx5_3", "0000:3c:00.0")  # the planted NIC at PCIe x8: device, PCI function
LOST_GPU = "1"
BAD_CABLE_PORT = "mlx5_4"

#: NVIDIA's application XIDs that jobs cause every day (deploy/rules/hardware.rules.yaml)
APP_XIDS = ("13", "31", "43", "45")


# --- the agent's series for each node state ------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float
    counter: bool


#: families the agent leaves out below ``full`` detail on a healthy node (the fleet's agent
#: runs at ``default``), each with the per-GPU family its catalog ``fold`` names, which the
#: healthy node does export: every NVLink trained (``fabricscope_nvlink_up`` only for a link
#: that is down) and no replay, recovery or CRC-flit error (``fabricscope_nvlink_errors_total``
#: only for a link where one is non-zero), as the recorded H200s answer. An alert reading
#: one of these reads the healthy fleet's absence of it wherever its fold is in the history.
FOLDED_WHEN_HEALTHY = {
    "fabricscope_nvlink_up": "fabricscope_gpu_nvlinks_up",
    "fabricscope_nvlink_errors_total": "fabricscope_gpu_nvlink_errors_total",
    # the ibpeer sampler: a link trained at both ends' best (no *_degraded series), a switch
    # end counting no error (no peer counter), beside the cable it read (peer_info)
    "fabricscope_infiniband_link_width_degraded": "fabricscope_infiniband_peer_info",
    "fabricscope_infiniband_link_speed_degraded": "fabricscope_infiniband_peer_info",
    "fabricscope_infiniband_peer_port_symbol_errors_total": "fabricscope_infiniband_peer_info",
    "fabricscope_infiniband_peer_port_receive_errors_total": "fabricscope_infiniband_peer_info",
}


#: families the agent exports only once something happened (a counter born with its first
#: event), each with a family every agent exports: a healthy node has none of it (the real
#: agent on the healthy tree exports ``fabricscope_sampler_success`` for each sampler and no
#: read error), which is what an alert reading it reads wherever the other is in the history
BORN_WITH_FIRST_EVENT = {"fabricscope_sampler_read_errors_total": "fabricscope_sampler_success"}


def folded_when_healthy() -> dict[str, str]:
    """:data:`FOLDED_WHEN_HEALTHY`, checked against the catalog: each family folds below
    ``full`` and its fold names the per-GPU family, or it and the family beside it are one
    sampler's (raises when the catalog says otherwise)."""
    specs = {s.name: s for s in all_specs()}
    area = {s.name: a for a, ar in AREAS.items() for s in ar.specs}
    for name, fold in FOLDED_WHEN_HEALTHY.items():
        spec = specs.get(name)
        if spec is None or not spec.fold or spec.detail == "full" or fold not in specs:
            raise ValueError(f"{name}: the catalog no longer folds it")
        if fold not in spec.fold and area.get(name) != area.get(fold):
            raise ValueError(f"{name}: {fold} is neither its fold nor its sampler's")
    return dict(FOLDED_WHEN_HEALTHY)


def referenced_families() -> set[str]:
    """Metric names the shipped rules and the Fleet dashboard read, and the per-GPU folds of
    those a healthy node leaves out (:data:`FOLDED_WHEN_HEALTHY`)."""
    text = "".join(p.read_text() for p in sorted(RULES.glob("*.rules.yaml")))
    text += FLEET_BOARD.read_text()
    names = set(re.findall(r"\bfabricscope_[a-z0-9_]+", text)) | {"fabricscope_build_info"}
    return names | {fold for name, fold in folded_when_healthy().items() if name in names}


def _write(tree: Path, rel: str, text: str) -> None:
    (tree / rel).write_text(text)


def _pci(tree: Path, bdf: str) -> Path:
    return (tree / "bus" / "pci" / "devices" / bdf).resolve()


def _healthy(tree: Path) -> None:
    """Undo the fixture's five documented faults (its PROVENANCE.md): a fleet node is healthy
    unless this history makes it otherwise. The ACS redirect (fault 3) is left: its series
    need CAP_SYS_ADMIN (``capabilities.acs``), which the chart does not grant by default,
    so the fleet has none (:func:`agent_states` drops them)."""
    nic = _pci(tree, "0000:5e:00.0")  # fault 1: mlx5_5's NUMA node rewritten to 1
    (nic / "numa_node").write_text("0\n")
    (nic / "local_cpulist").write_text("0-79\n")
    for bdf in ("0000:37:01.0", "0000:38:00.0"):  # fault 2: the switch uplink at x8
        (_pci(tree, bdf) / "current_link_width").write_text("16\n")
    port = "class/infiniband/mlx5_11/ports/1"  # fault 4: mlx5_11 DOWN
    _write(tree, f"{port}/state", "4: ACTIVE\n")
    _write(tree, f"{port}/phys_state", "5: LinkUp\n")
    _write(tree, f"{port}/rate", "400 Gb/sec (4X NDR)\n")
    # fault 5, mlx5_6's saturated counters (a real dump): mlx5_0's values, as on every
    # other port of the fixture; the saturated-4 state keeps the dump
    src = tree / "class/infiniband/mlx5_0/ports/1/counters"
    for f in src.iterdir():
        _write(tree, f"class/infiniband/mlx5_6/ports/1/counters/{f.name}", f.read_text())


def _variant_tree(base: Path, name: str) -> Path:
    """The DGX tree for ``name`` (rails set to InfiniBand, as on an InfiniBand fabric)."""
    tree = base / name / "sys"
    shutil.copytree(DGX, tree, symlinks=True)
    dump = {
        f.name: f.read_text() for f in (tree / "class/infiniband/mlx5_6/ports/1/counters").iterdir()
    }
    _healthy(tree)
    for dev in RAILS:
        _write(tree, f"class/infiniband/{dev}/ports/1/link_layer", "InfiniBand\n")
    if name.startswith("saturated-"):
        for dev in RAILS[: int(name.split("-")[1])]:
            _write(
                tree,
                f"class/infiniband/{dev}/ports/1/counters/port_xmit_wait",
                f"{SATURATED_MAX}\n",
            )
        if name == "saturated-4":  # the real dump: four counters of four widths stopped
            for f, text in dump.items():
                _write(tree, f"class/infiniband/mlx5_6/ports/1/counters/{f}", text)
    elif name == "disabled":
        for dev in DISABLED_PORTS:
            _write(tree, f"class/infiniband/{dev}/ports/1/state", "1: DOWN\n")
            _write(tree, f"class/infiniband/{dev}/ports/1/phys_state", "3: Disabled\n")
    elif name == "rate":
        _write(tree, f"class/infiniband/{RATE_PORT}/ports/1/rate", "200 Gb/sec (2X NDR)\n")
    elif name == "x8":
        (_pci(tree, X8_NIC[1]) / "current_link_width").write_text("8\n")
    return tree


def _recording(base: Path, name: str) -> Path:
    """The NVML recording for ``name``: as recorded, or GPU 1 lost after XID 79."""
    data = json.loads(NVML_RECORDING.read_text())
    if name == "lost":
        identity = ("UUID", "Name", "PciInfo", "Index", "Serial", "MinorNumber", "Handle")
        for key in data["calls"]:
            fn, _, args = key.partition("(")
            if args.split(",")[0].rstrip(")") == LOST_GPU and not any(i in fn for i in identity):
                data["calls"][key] = {"error": "GPU_IS_LOST", "code": 15}
        data["events"] = [{"gpu": int(LOST_GPU), "xid": 79}]
    path = base / name / "nvml.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def _agent_once(args: Sequence[str]) -> str:
    return subprocess.run(
        [sys.executable, "-m", "exporter.cli", "agent", "--once", "--log.level=error", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        cwd=ROOT,
    ).stdout


def _parse(text: str, keep: set[str]) -> list[Sample]:
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name not in keep or s.name.endswith(("_created",)):
                continue
            out.append(
                Sample(
                    s.name, tuple(sorted(s.labels.items())), float(s.value), fam.type == "counter"
                )
            )
    return out


def _eight_gpus(samples: list[Sample]) -> list[Sample]:
    """The recorded node has 2 GPUs; a DGX has 8: GPU 0's series stand for GPUs 2-7."""
    out = list(samples)
    for s in samples:
        labels = dict(s.labels)
        if labels.get("gpu") != "0":
            continue
        for g in range(2, GPUS):
            clone = dict(labels, gpu=str(g))
            if "uuid" in clone:
                clone["uuid"] = clone["uuid"][:-1] + str(g)
            out.append(Sample(s.name, tuple(sorted(clone.items())), s.value, s.counter))
    return out


IBPEER_RECORDING = ROOT / "tests" / "fixtures" / "ibpeer-sim-dgx" / "recording.json"
IBPEER_FAMILIES = frozenset(s.name for s in AREAS["ibpeer"].specs)


def _ibpeer_once(tree: Path, keep: set[str]) -> list[Sample]:
    """The ibpeer sampler's series for ``tree`` at the chart's detail (a fleet that enables
    it): the real sampler, run in process as ``bench/series_budget.py`` runs it, on the tool
    answers recorded from a simulated rail-optimised fat tree (``IBPEER_RECORDING``: the
    DGX's 8 rails each cabled to a leaf; its counters what the simulator's own traffic left,
    every link trained at both ends' best). What the switch ends count over time is
    ``bench/fleet_history.py``'s."""
    from series_budget import InChild, ReplayTools

    sampler = IbPeerSampler(
        SysfsReader(str(tree)),
        tool=ReplayTools(IBPEER_RECORDING),
        tables_per_pass=64,
        spread=False,
        extended=False,
    )
    app = AgentApp([SamplerSpec(InChild(sampler), 60.0, 10.0)], Latest(), detail="default")
    return _parse(app.run_once().decode(), keep & IBPEER_FAMILIES)


STATES = ("healthy", "saturated-1", "saturated-2", "saturated-4", "disabled", "rate", "x8", "lost")


def agent_states(work: Path, keep: set[str], *, acs: bool = False) -> dict[str, list[Sample]]:
    """Each node state's series, from the real agent: one sysfs run per tree (``lost`` has
    the healthy tree) and one NVML run per recording (as recorded, or ``lost``); with
    ``acs``, the ACS series of a fleet that grants ``capabilities.acs`` (the tree's bridges
    with the redirect on, as the fixture was captured: a BIOS default every node shares)."""
    common = [
        "--no-sampler.attribution",
        "--no-sampler.workload",
        "--no-sampler.netdev",
        "--kubelet.pod-resources-socket=",
        "--collector.detail=default",
    ]

    def sysfs(name: str) -> list[Sample]:
        tree = _variant_tree(work, name)
        out = _parse(_agent_once(["--path.sysfs", str(tree), "--no-sampler.nvml", *common]), keep)
        return out + _ibpeer_once(tree, keep)

    def nvml(name: str) -> list[Sample]:
        rec = _recording(work, name)
        snap = work / name / "nvml.tar.gz"
        (work / name / "empty").mkdir(exist_ok=True)
        capture(str(work / name / "empty"), [], str(snap), extra={IN_SNAPSHOT: rec.read_bytes()})
        out = _agent_once(
            ["--snapshot", str(snap), "--no-sampler.infiniband", "--no-sampler.pci", *common]
        )
        return _eight_gpus(_parse(out, keep))

    trees = [s for s in STATES if s != "lost"]
    with ThreadPoolExecutor(2) as pool:
        by_tree = dict(zip(trees, pool.map(sysfs, trees), strict=True))
        by_recording = dict(
            zip(("healthy", "lost"), pool.map(nvml, ("healthy", "lost")), strict=True)
        )
    out = {}
    for state in STATES:
        both = (
            by_tree["healthy" if state == "lost" else state]
            + by_recording["lost" if state == "lost" else "healthy"]
        )
        out[state] = [
            x for x in both if acs or x.name != "fabricscope_pci_acs_p2p_redirect_enabled"
        ]
    return out
