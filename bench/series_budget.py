"""The series budget: how many series one GPU node costs Prometheus, per detail level.

Counts what the real agent (every sampler that can run from recorded data, rendered and
served through the same ``AgentApp`` as ``fabricscope agent``) exports for an 8-GPU node:

- sysfs: the DGX fixture tree (``tests/fixtures/dgx-h100/sys``: 8x H100, 8x ConnectX-7,
  2x dual-port ConnectX-6 Dx, 54 PCI functions on the GPU/NIC paths, 12 RDMA ports). As
  captured its 12 ports are RoCE (``roce``). The ``ib`` node is the same tree with the eight
  ConnectX-7 ports' ``link_layer`` set to InfiniBand, as a DGX H100 on an InfiniBand compute
  fabric has them (the ConnectX-6 Dx storage ports stay Ethernet). A derived tree: the
  counters' files are the fixture's, only ``link_layer`` changes.
- NVML: the 2x H200 recording (``tests/fixtures/nvml/h200x2.recording.json``, 18 NVLinks per
  GPU, every link's crc_data and ecc_data non-zero as on that healthy node), replayed by the
  real NVML sampler. An 8-GPU node is counted as its series without a ``gpu`` label plus
  8 times the mean per-GPU count.
- netdev (netlink and ethtool, which no fixture can replay): one interface per RDMA port,
  modelled. RoCE ports: mlx5 with every ethtool statistic the kernel's mlx5 counter reference
  names (``tests/fixtures/netdev-mlx5-counters``, two channels, lanes 0-3), per-priority
  pause counters for priority 3 only (mlx5 lists them only for PFC-enabled priorities; one
  lossless RoCE class), the other per-priority counters for all 8. InfiniBand ports: IPoIB
  with the kernel's 64-bit link counters and no ethtool statistic the default include
  matches. Every value 0 (a healthy, idle node; the folds below full depend on values:
  a counter that is non-zero adds its series).
- ibpeer (the far ends of the node's InfiniBand cables and its share of its leaves' uplinks):
  the real sampler replaying the tool answers ``bench/bench_ibpeer.py --record`` took from a
  simulated rail-optimised fat tree (``tests/fixtures/ibpeer-sim-dgx``: this node's 8
  InfiniBand HCAs on 8 leaves with 3 other hosts each and 4 spines; it reads 8 of the leaves'
  uplinks, both ends). The ``roce`` node has no InfiniBand port: ibpeer has no data there.
- The NVML and ibpeer samplers run in process here, as the agent runs them in supervised
  children (:class:`InChild`): the agent's series of a child (its restarts, its crashed,
  hung and backoff errors) are counted.

Not counted: attribution, throughput and the probe, whose series grow with pods and jobs
(about 3 per GPU for attribution, a few per job; the probe's are bounded, see docs/performance.md).

    python bench/series_budget.py [--budget 1200] [--json FILE]

Exits 1 when either node (``ib`` or ``roce``) at ``--collector.detail=default`` exports
more than ``--budget`` series (1,200; CI runs it through tests/test_series_budget.py).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agent.config import AgentConfig, NvmlSettings, Paths, Sampling  # noqa: E402
from agent.core.procstat import read_process  # noqa: E402
from agent.core.runner import SamplerSpec  # noqa: E402
from agent.core.sampler import Sampler, Snapshot  # noqa: E402
from agent.core.sysfs import SysfsReader  # noqa: E402
from agent.core.tools import ToolError, ToolOutput  # noqa: E402
from agent.ibpeer.sampler import IbPeerSampler  # noqa: E402
from agent.netdev.stats import (  # noqa: E402
    DEFAULT_ETHTOOL_INCLUDE,
    LinkStats64,
    NetdevSample,
    NetdevSnapshot,
    parse_ethtool_stats,
)
from agent.nvml.record import ReplayNvml, load  # noqa: E402
from agent.samplers import Latest, build_specs  # noqa: E402
from exporter.app import AgentApp  # noqa: E402
from exporter.metrics import nvml as nvml_metrics  # noqa: E402
from exporter.metrics.spec import DETAILS, Detail  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
TREE = FIXTURES / "dgx-h100" / "sys"
RECORDING = FIXTURES / "nvml" / "h200x2.recording.json"
MLX5_NAMES = FIXTURES / "netdev-mlx5-counters" / "counters-rst-names.txt"
IBPEER_RECORDING = FIXTURES / "ibpeer-sim-dgx" / "recording.json"
GPUS = 8
BUDGET = 1200
#: the priority a RoCE fabric runs lossless (PFC on); NVIDIA's RoCE guides use 3
PFC_PRIORITY = 3

#: anchors, with where each figure comes from (not measured by this script)
ANCHORS = (
    (
        "dcgm-exporter, default counters",
        "at most ~170 (21 fields per GPU, NVLink as one aggregate per GPU; "
        "its etc/default-counters.csv)",
    ),
    (
        "node_exporter 1.5 infiniband collector, DGX tree",
        "300 (25 per port x 12 ports; counted 2026-11-25)",
    ),
)


class ModelNetdev:
    """A netdev sampler answering with a fixed snapshot (netlink cannot be replayed)."""

    name = "netdev"

    def __init__(self, snapshot: NetdevSnapshot) -> None:
        self._snapshot = snapshot

    def sample(self) -> NetdevSnapshot:
        return self._snapshot


class InChild:
    """A sampler the agent runs in a supervised child (``agent.core.isolation``), run here
    in process: the runner sees a child with no restarts, and exports what it exports for
    one (``fabricscope_sampler_child_restarts_total``, the child's failure reasons)."""

    restarts_total = 0

    def __init__(self, sampler: Sampler) -> None:
        self._sampler = sampler
        #: the child's process_* series (this process's figures stand in for the child's)
        self.child_stats = read_process()

    @property
    def name(self) -> str:
        return self._sampler.name

    def sample(self) -> Snapshot:
        return self._sampler.sample()


class ReplayTools:
    """The ibpeer sampler's tool runner, answering from a recording (command -> output)."""

    def __init__(self, path: Path) -> None:
        doc = json.loads(path.read_text())
        self._answers = {tuple(c["argv"]): c["stdout"] for c in doc["calls"]}

    def __call__(
        self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None
    ) -> ToolOutput:
        out = self._answers.get(tuple(argv))
        if out is None:
            raise ToolError("io", f"not in the recording: {' '.join(argv)}")
        return ToolOutput(out, 0.0)


def mlx5_statistics() -> list[tuple[str, int]]:
    """Every mlx5 ethtool name of the kernel's reference, expanded as a two-channel port
    with PFC on PFC_PRIORITY only; values 0."""
    out: list[tuple[str, int]] = []
    pause = re.compile(r"(?:rx|tx)_prio\[p\]_pause(?:_duration|_transition)?")
    for template in MLX5_NAMES.read_text().split():
        if "[i]" in template:
            names = [template.replace("[i]", i) for i in ("", "0", "1")]
        elif "[p]" in template:
            prios = [PFC_PRIORITY] if pause.fullmatch(template) else range(8)
            names = [template.replace("[p]", str(p)) for p in prios]
        elif "[l]" in template:
            names = [template.replace("[l]", str(lane)) for lane in range(4)]
        else:
            names = [template]
        out += [(n, 0) for n in names]
    return out


def netdev_model(tree: Path) -> NetdevSnapshot:
    """One modelled interface per RDMA port netdev of ``tree`` (see the module doc)."""
    zero = LinkStats64(**{f: 0 for f in LinkStats64.__slots__})
    roce = parse_ethtool_stats(mlx5_statistics(), DEFAULT_ETHTOOL_INCLUDE)
    samples = []
    for i, port_dir in enumerate(sorted((tree / "class" / "infiniband").glob("*/ports/*"))):
        ndev = port_dir / "gid_attrs" / "ndevs" / "0"
        name = ndev.read_text().strip() if ndev.is_file() else f"ib{i}"
        ethernet = (port_dir / "link_layer").read_text().strip() == "Ethernet"
        samples.append(
            NetdevSample(
                name=name if ethernet else f"ibp{i}s0",
                ifindex=i + 2,
                operstate="up",
                carrier=1,
                carrier_changes=2,
                mtu_bytes=9000 if ethernet else 4092,
                speed_bytes_per_second=50_000_000_000,
                driver="mlx5_core" if ethernet else "mlx5_core[ib_ipoib]",
                stats=zero,
                ethtool=roce if ethernet else None,
            )
        )
    return NetdevSnapshot(tuple(samples))


def infiniband_tree(workdir: Path) -> Path:
    """The DGX tree with its ConnectX-7 (MT4129) ports on an InfiniBand fabric."""
    tree = workdir / "sys"
    shutil.copytree(TREE, tree, symlinks=True)
    for dev in sorted((tree / "class" / "infiniband").iterdir()):
        if (dev / "hca_type").read_text().strip() != "MT4129":
            continue
        for port in (dev / "ports").iterdir():
            (port / "link_layer").write_text("InfiniBand\n")
    return tree


def count(tree: Path, detail: Detail) -> dict[str, int]:
    """Series by area for one 8-GPU node (sysfs tree + NVML replay + netdev model)."""
    config = AgentConfig(
        paths=Paths(str(tree), str(tree / "no-procfs")),
        sampling=Sampling(frozenset({"infiniband", "pci", "nvml", "workload"})),
        nvml=NvmlSettings(isolate=False),
    )
    recording = load(RECORDING)
    latest = Latest()
    specs = build_specs(
        config,
        SysfsReader(str(tree)),
        nvml_api=lambda: ReplayNvml(recording, strict=False),
        watch_xid=False,
        run_probes=False,
        latest=latest,
        once=True,
    )
    # the agent runs NVML in a supervised child (NvmlSettings.isolate, on by default)
    specs = [
        replace(s, sampler=InChild(s.sampler)) if s.sampler.name == "nvml" else s for s in specs
    ]
    specs.append(SamplerSpec(ModelNetdev(netdev_model(tree)), 15.0, 10.0))  # type: ignore[arg-type]
    # ... and ibpeer too (agent.ibpeer.child.isolated_sampler), here on recorded answers
    ibpeer = IbPeerSampler(
        SysfsReader(str(tree)),
        tool=ReplayTools(IBPEER_RECORDING),
        tables_per_pass=64,
        spread=False,
        extended=detail == "full",
    )
    specs.append(SamplerSpec(InChild(ibpeer), 60.0, 10.0))
    app = AgentApp(sorted(specs, key=lambda s: s.sampler.name), latest, detail=detail)
    body = app.run_once().decode()
    nvml_names = {s.name for s in nvml_metrics.SPECS}
    by_area: Counter[str] = Counter()
    per_gpu: Counter[str] = Counter()
    for line in body.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        gpu = re.search(r'[{,]gpu="(\d+)"', line)
        if name in nvml_names and gpu:
            per_gpu[gpu.group(1)] += 1
            continue
        by_area[_area(name)] += 1
    recorded = len(per_gpu)
    if recorded == 0:
        raise SystemExit("series_budget: the NVML replay gave no per-GPU series")
    by_area["nvml (per GPU x 8)"] = round(GPUS * sum(per_gpu.values()) / recorded)
    by_area["total"] = sum(by_area.values())
    return dict(by_area)


def _area(name: str) -> str:
    for prefix, area in (
        ("fabricscope_infiniband_peer_", "ibpeer"),
        ("fabricscope_infiniband_switch_", "ibpeer"),
        ("fabricscope_infiniband_link_", "ibpeer"),
        ("fabricscope_infiniband_", "infiniband"),
        ("fabricscope_netdev_", "netdev"),
        ("fabricscope_pci_", "pci"),
        ("fabricscope_numa_", "pci"),
        ("fabricscope_topology_", "topology"),
        ("fabricscope_gpu_", "nvml (node)"),
        ("fabricscope_nvlink_", "nvml (node)"),
        ("fabricscope_sampler_", "agent"),
        ("fabricscope_build_", "agent"),
        ("fabricscope_findings", "agent"),
    ):
        if name.startswith(prefix):
            return area
    return "other"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=BUDGET, help="series (default: %(default)s)")
    ap.add_argument("--json", default=None, help="also write the counts here")
    args = ap.parse_args(argv)
    results: dict[str, dict[str, dict[str, int]]] = {}
    with tempfile.TemporaryDirectory(prefix="fabricscope-budget-") as tmp:
        nodes = {"ib": infiniband_tree(Path(tmp)), "roce": TREE}
        for node, tree in nodes.items():
            results[node] = {d: count(tree, d) for d in DETAILS}
    areas = sorted({a for r in results.values() for c in r.values() for a in c} - {"total"})
    header = ["area"] + [f"{n} {d}" for n in results for d in DETAILS]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for area in [*areas, "total"]:
        row = [area] + [str(results[n][d].get(area, 0)) for n in results for d in DETAILS]
        print("| " + " | ".join(row) + " |")
    for what, figure in ANCHORS:
        print(f"anchor: {what}: {figure}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    failed = False
    for node, layer in (("ib", "InfiniBand"), ("roce", "RoCE")):
        got = results[node]["default"]["total"]
        if got > args.budget:
            failed = True
            print(
                f"series_budget: FAIL: an 8-GPU {layer} node exports {got} series at "
                f"--collector.detail=default, over the budget of {args.budget}"
            )
    if failed:
        return 1
    ib, roce = results["ib"]["default"]["total"], results["roce"]["default"]["total"]
    print(
        f"series_budget: ok: {ib} (InfiniBand) and {roce} (RoCE) series at the default "
        f"detail (budget {args.budget})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
