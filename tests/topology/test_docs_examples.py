"""docs/topology.md's examples are what the code renders and what the schedulers accept: its
Kueue Topology is ``fabricscope topology --output kueue``'s, its ResourceFlavor validates
against Kueue's CRD and names that Topology, its Job validates strictly (kubernetes-validate)
and its PodSet annotation names a level of it, its HyperNode validates against Volcano's CRD
and its Volcano Job against Volcano's Job CRD. And the validation itself refuses what the API
server would."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
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
    for version in ("1.25.0", "1.37.0"):  # the chart's range (tests/deploy)
        kubernetes_validate.validate(job, version, strict=True)
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
    validate(job, "batch.volcano.sh_jobs.yaml", "v1alpha1")
    assert job["spec"]["networkTopology"] == {"mode": "hard", "highestTierAllowed": 1}
    # the tier it names is a HyperNode tier the map renders (1: the leaf groups)
    assert job["spec"]["networkTopology"]["highestTierAllowed"] == hn["spec"]["tier"]


def test_kubernetes_validate_passes_any_custom_resource_unchecked() -> None:
    """Why custom resources are validated against their CRDs here: kubernetes-validate has
    no schema for them and says so, for any content. Should it ever check them, this fails."""
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Topology", "spec": 5}, "1.37.0", True
        )


Mutation = Callable[[dict[str, Any]], None]


@pytest.mark.parametrize(
    ("mutate", "why"),
    [
        (lambda o: o["metadata"]["labels"].update(x=5), "not of type"),  # a label not a string
        (lambda o: o["metadata"].update(nam="x"), "'nam' was unexpected"),
        (lambda o: o["metadata"].update(name="Leaf-0X2"), "not a DNS subdomain"),
        (lambda o: o["metadata"].update(name="a" * 254), "not a DNS subdomain"),
        (lambda o: o["spec"].update(tier="1"), "not of type"),
        (lambda o: o["spec"]["members"][0].update(kind="Node"), "'kind' was unexpected"),
    ],
)
def test_the_validation_refuses_what_the_api_server_would(mutate: Mutation, why: str) -> None:
    hn = copy.deepcopy(blocks()["topology.volcano.sh/HyperNode"])
    mutate(hn)
    with pytest.raises((jsonschema.ValidationError, AssertionError), match=why):
        validate(hn, "topology.volcano.sh_hypernodes.yaml", "v1alpha1")
