"""What every rendering of a map must satisfy: the Kueue Topology and the Volcano HyperNodes
against the upstream CRD schemas (and the CEL rules jsonschema cannot run, checked by hand),
the labels against Kubernetes' label syntax, the Slurm file's nesting."""

from __future__ import annotations

import re

from exporter.topology import render
from exporter.topology.model import FabricMap
from tests.topology.conftest import validate

#: a label value (Kubernetes: at most 63, alphanumeric at both ends, - _ . inside)
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def check_all(fmap: FabricMap, keys: render.LabelKeys) -> None:
    labels = render.node_labels(fmap, keys)
    tier_keys = {keys.key(t) for t in fmap.tiers}
    placed = {p.node for p in fmap.places}
    for node, lb in labels.items():
        want = (tier_keys if node in placed else set()) | (
            {keys.accelerator} if node in fmap.domains and keys.accelerator else set()
        )
        assert set(lb) == want, node
        assert set(lb) <= set(keys.keys), node
        for v in lb.values():
            assert len(v) <= 63 and LABEL_VALUE.fullmatch(v), (node, v)
    for version in render.KUEUE_VERSIONS:
        topo = render.kueue_topology(
            keys, api_version=version, depth=fmap.depth, domains=bool(fmap.domains)
        )
        validate(topo, "kueue.x-k8s.io_topologies.yaml", version)
        levels = [lv["nodeLabel"] for lv in topo["spec"]["levels"]]  # type: ignore[index]
        # the CRD's CEL rule: kubernetes.io/hostname, when present, is the last level
        assert levels[-1] == render.HOSTNAME and levels.count(render.HOSTNAME) == 1
    by_label = render.volcano_hypernodes(fmap, keys, by_label=True)
    for hn in by_label:
        validate(hn, "topology.volcano.sh_hypernodes.yaml", "v1alpha1")
    selected = {
        (hn["metadata"]["name"], node)  # type: ignore[index]
        for hn in by_label
        for m in hn["spec"]["members"]  # type: ignore[index]
        if "labelMatch" in m["selector"]
        for node, lb in labels.items()
        if m["selector"]["labelMatch"]["matchLabels"].items() <= lb.items()
    }
    hypernodes = render.volcano_hypernodes(fmap, keys)
    exact = {
        (hn["metadata"]["name"], m["selector"]["exactMatch"]["name"])  # type: ignore[index]
        for hn in hypernodes
        for m in hn["spec"]["members"]  # type: ignore[index]
        if hn["spec"]["tier"] == 1  # type: ignore[index]
    }
    # the label selectors pick exactly the nodes the names list
    assert selected == exact
    names = set()
    for hn in hypernodes:
        validate(hn, "topology.volcano.sh_hypernodes.yaml", "v1alpha1")
        for m in hn["spec"]["members"]:  # type: ignore[index]
            # the CRD's CEL rules: exactly one of exactMatch, regexMatch, labelMatch
            assert len(m["selector"]) == 1
        names.add(hn["metadata"]["name"])  # type: ignore[index]
    assert len(names) == len(hypernodes)
    # every node in exactly one tier-1 HyperNode, every tier-1 HyperNode in one tier-2
    members = [
        m["selector"]["exactMatch"]["name"]
        for hn in hypernodes
        for m in hn["spec"]["members"]  # type: ignore[index]
    ]
    assert sorted(members) == sorted(
        [*placed, *(n for n in names if not n.startswith(render.TIER_NAMES[fmap.depth - 1]))]
    )
    conf = render.slurm_tree(fmap).splitlines()
    switches = [ln.split()[0].removeprefix("SwitchName=") for ln in conf[1:]]
    assert len(switches) == len(set(switches))
    in_leaves = [n for ln in conf[1:] if " Nodes=" in ln for n in ln.split("Nodes=")[1].split(",")]
    assert sorted(in_leaves) == sorted(placed)
    # every switch line but the top tier's is named once as a child
    children = [
        c for ln in conf[1:] if " Switches=" in ln for c in ln.split("Switches=")[1].split(",")
    ]
    assert len(children) == len(set(children)) and set(children) <= set(switches)
    blocks = render.slurm_block(fmap).splitlines()
    in_blocks = [
        n for ln in blocks if ln.startswith("BlockName=") for n in ln.split("Nodes=")[1].split(",")
    ]
    assert sorted(in_blocks) == sorted(fmap.domains)
