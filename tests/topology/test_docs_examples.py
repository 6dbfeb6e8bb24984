"""docs/topology.md's examples are what the code renders and what the schedulers accept: its
Kueue Topology is ``fabricscope topology --output kueue``'s, its ResourceFlavor validates
against Kueue's CRD and names that Topology, its Job's PodSet annotation names a level of it,
and its HyperNode validates against Volcano's CRD."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from exporter.topology import render
from tests.topology.conftest import validate

DOC = Path(__file__).resolve().parents[2] / "docs" / "topology.md"


def blocks() -> dict[str, dict[str, Any]]:
    """The doc's YAML examples by kind (the first of each)."""
    out: dict[str, dict[str, Any]] = {}
    for body in re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S):
        doc = yaml.safe_load(body)
        if isinstance(doc, dict) and "kind" in doc:
            key = f"{doc['apiVersion'].split('/')[0]}/{doc['kind']}"
            out.setdefault(key, doc)
    return out


def test_the_kueue_examples_are_what_the_code_renders_and_kueue_accepts() -> None:
    b = blocks()
    topo = b["kueue.x-k8s.io/Topology"]
    assert topo == render.kueue_topology(render.LabelKeys())
    flavor = b["kueue.x-k8s.io/ResourceFlavor"]
    validate(flavor, "kueue.x-k8s.io_resourceflavors.yaml", "v1beta2")
    assert flavor["spec"]["topologyName"] == topo["metadata"]["name"]
    assert flavor["spec"]["nodeLabels"]  # the CRD's CEL rule: a TAS flavor selects nodes
    job = b["batch/Job"]
    annotations = job["spec"]["template"]["metadata"]["annotations"]
    levels = {lv["nodeLabel"] for lv in topo["spec"]["levels"]}
    assert annotations["kueue.x-k8s.io/podset-required-topology"] in levels
    assert "kueue.x-k8s.io/podset-preferred-topology: fabric.topograph.run/tier-0" in (
        DOC.read_text()
    )


def test_the_volcano_example_is_a_valid_hypernode_as_rendered() -> None:
    b = blocks()
    hn = b["topology.volcano.sh/HyperNode"]
    validate(hn, "topology.volcano.sh_hypernodes.yaml", "v1alpha1")
    assert hn["metadata"]["name"] == render.hypernode_name(0, "0x0000000000200002")
    assert hn["spec"]["tier"] == 1 and hn["spec"]["tierName"] == render.TIER_NAMES[0]
    job = b["batch.volcano.sh/Job"]
    assert job["spec"]["networkTopology"] == {"mode": "hard", "highestTierAllowed": 1}
