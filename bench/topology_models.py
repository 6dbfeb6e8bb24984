"""The fabric map on every one of topograph's test models (``tests/models/*.yaml``, copied
into ``tests/fixtures/topology/topograph-models``), each built as an ibsim fabric of the same
shape: OpenSM, one real agent per node reading its cables, its leaf's uplinks and its spines'
tables (``--ibpeer.spine-links``), their series in a real Prometheus, and each node's NVML
series (the exporter's rendering of a replayed pass) in the NVLink domain its model's
``accelerator.topology.test/domain`` annotation names. For each model: do the map's tier-0,
tier-1 and tier-2 groups equal the ones the model's switches define, is each node's leaf and
spine the one the model names, and do its NVLink domains (the domain label, the Slurm block
file) group the nodes as the model's domains do?

The test suite runs the two small models (``tests/topology/test_topology_sim.py``); the four
large ones (72 to 255 nodes) take minutes here, so they are proven by this script and its
result file rather than in every CI run.

    python bench/topology_models.py [--models nvl72,large,...] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.explain.client import ClientSettings, PrometheusClient
from exporter.topology import render, source
from exporter.topology.model import FabricMap
from tests.topology.checks import check_all
from tests.topology.domains import nvml_exposition
from tests.topology.lab import topology_run
from tests.topology.nets import Tree, expected_groups, from_topograph_model, grouped, model_domains

MODELS = Path(__file__).resolve().parent.parent / "tests/fixtures/topology/topograph-models"


def partition(fmap: FabricMap, tier: int) -> set[frozenset[str]]:
    return {frozenset(nodes) for nodes in fmap.groups(tier).values()}


def run_model(name: str, work: Path) -> dict[str, Any]:
    spec = yaml.safe_load((MODELS / f"{name}.yaml").read_text())
    tree = from_topograph_model(spec)
    domains = model_domains(spec)
    assert set(domains) <= set(tree.hosts)
    cliques = {d: k for k, d in enumerate(sorted(set(domains.values())), 1)}
    rendered = {k: nvml_exposition(k) for k in cliques.values()}
    extra = {h: rendered[cliques[d]] for h, d in domains.items()}
    t0 = time.monotonic()
    with topology_run(work, tree, [None], spine_links=True, extra=extra) as served:
        got = source.read(
            PrometheusClient(ClientSettings(served.url)),
            served.times[0],
            selector='job="fabricscope"',
        )
    seconds = time.monotonic() - t0
    fmap = got.fmap
    # switch tiers from a leaf to the top
    depth = max(len(p) for h in tree.hosts for p in _paths(tree, h))
    result: dict[str, Any] = {
        "nodes": len(tree.hosts),
        "switches": len(tree.uplinks),
        "model_tiers": depth,
        "map_tiers": fmap.depth,
        "seconds": round(seconds, 1),
        "rejects": dict(got.rejects),
        "placed": len(fmap.places),
    }
    tiers = {}
    for tier in range(min(3, depth)):
        tiers[f"tier-{tier}"] = partition(fmap, tier) == expected_groups(tree, tier)
    result["tiers_equal_model"] = tiers
    # each node's leaf and the spine above it, by the switch descriptions (the model's names)
    names_ok = True
    for host, devs in tree.hosts.items():
        place = fmap.place(host)
        if place is None:
            names_ok = False
            continue
        leaf = fmap.switches.get(place.tiers[0])
        want_leaf = next(iter(devs.values()))
        names_ok &= leaf == want_leaf
        spines = {fmap.switches.get(s) for s in _block_spines(fmap, place.tiers[1])}
        names_ok &= set(tree.uplinks[want_leaf]) <= spines
    result["leaf_and_spine_named_as_model"] = names_ok
    result["domains_model"] = len(set(domains.values()))
    result["domains_equal_model"] = grouped(fmap.domains) == grouped(domains)
    blocks = [ln for ln in render.slurm_block(fmap).splitlines() if ln.startswith("BlockName=")]
    result["slurm_blocks"] = len(blocks)
    result["slurm_blocks_equal_model"] = {
        frozenset(ln.split("Nodes=")[1].split(",")) for ln in blocks
    } == grouped(domains)
    check_all(fmap, render.LabelKeys())  # raises on an invalid rendering
    result["renderings_valid"] = True
    result["ok"] = (
        all(tiers.values())
        and fmap.depth == min(3, depth)
        and names_ok
        and result["domains_equal_model"]
        and result["slurm_blocks_equal_model"]
        and result["placed"] == result["nodes"]
        and not result["rejects"]
    )
    return result


def _paths(tree: Tree, host: str) -> list[list[str]]:
    """Every upward path of switches from the host's leaf to a top switch."""
    out: list[list[str]] = []

    def walk(sw: str, path: list[str]) -> None:
        ups = tree.uplinks[sw]
        if not ups:
            out.append(path)
        for up in ups:
            walk(up, [*path, up])

    for leaf in tree.hosts[host].values():
        walk(leaf, [leaf])
    return out


def _block_spines(fmap: FabricMap, block: str) -> set[str]:
    """The spines (switches above leaves) of a tier-1 group."""
    leaves = {p.tiers[0] for p in fmap.places if p.tiers[1] == block}
    return {lk.peer for lk in fmap.links if lk.switch in leaves}


def main() -> int:
    ap = argparse.ArgumentParser()
    names = sorted(p.stem for p in MODELS.glob("*.yaml"))
    ap.add_argument("--models", default=",".join(names))
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    results: dict[str, Any] = {}
    for name in a.models.split(","):
        with tempfile.TemporaryDirectory() as d:
            results[name] = run_model(name, Path(d))
        print(name, json.dumps(results[name]), flush=True)
    out = {
        "what": "topograph's test models as ibsim fabrics, real agents and Prometheus: "
        "the map's groups against the model's",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "machine": "2-core development machine, contended by other work (seconds are wall "
        "time of agents + ibsim + backfill + query)",
        "models": results,
    }
    text = json.dumps(out, indent=2, sort_keys=True)
    if a.out:
        Path(a.out).write_text(text + "\n")
    print(text)
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
