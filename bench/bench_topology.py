"""What the fabric map costs at fleet size: a rail-optimised fabric of ``--nodes`` nodes with
``--rails`` HCAs each (32 nodes per scalable unit, one leaf per rail per unit, every leaf
cabled to ``--uplinks`` of ``--spines`` spines), as the three Prometheus queries would answer
it (one sample per cabled port and per leaf uplink), parsed, built and rendered in every
output: peak RSS of this process (the controller's limit comes from it) and the CPU time of
parse + build + render. The samples are synthetic in shape only: label sets exactly as the
agents export them.

    python bench/bench_topology.py [--nodes 4096] [--rails 8] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.jsonout import emit
from exporter.topology import model, parse, render


def g(i: int) -> str:
    return f"0x{i:016x}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=4096)
    ap.add_argument("--rails", type=int, default=8)
    ap.add_argument("--spines", type=int, default=64)
    ap.add_argument("--uplinks", type=int, default=16)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    units = (a.nodes + 31) // 32
    peers = [
        (
            {
                "instance": f"node-{n:05d}",
                "device": f"mlx5_{r}",
                "port": "1",
                "peer_guid": g(1000 + (n // 32) * a.rails + r),
                "peer_port": str(n % 32 + 1),
                "node_type": "switch",
                "lid": str(n % 32 + 1),
                "peer_description": f"MF0;su{n // 32}-leaf{r}:MQM9700/U1",
            },
            1.0,
        )
        for n in range(a.nodes)
        for r in range(a.rails)
    ]
    leaves = units * a.rails
    links = [
        (
            {
                "switch_guid": g(1000 + leaf),
                "switch_port": str(33 + s),
                "peer_guid": g(10**6 + (leaf * a.uplinks + s) % a.spines),
                "peer_port": str(leaf % 64 + 1),
            },
            1.0,
        )
        for leaf in range(leaves)
        for s in range(a.uplinks)
    ]
    t0 = time.process_time()
    rejects = parse.Rejects()
    fmap = model.build(parse.attachments(peers, None, rejects), parse.switch_links(links, rejects))
    keys = render.LabelKeys()
    render.node_labels(fmap, keys)
    render.kueue_topology(keys)
    render.volcano_hypernodes(fmap, keys)
    render.slurm_tree(fmap)
    render.graph(fmap, keys)
    cpu = time.process_time() - t0
    result = {
        "nodes": len(fmap.places),
        "cabled_ports": len(peers),
        "leaf_uplinks": len(links),
        "leaf_groups": len(fmap.groups(model.LEAF)),
        "blocks": len(fmap.groups(model.BLOCK)),
        "cpu_seconds": round(cpu, 2),
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "rejects": rejects.total,
    }
    emit(result, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
