"""The fabric map against simulated fat trees: ibsim serving the net file, OpenSM, one real
agent per host, a real Prometheus holding their series; the tiers the map finds must be the
ones the net file defines, and every rendering must validate against the schedulers' CRDs.

- topograph's own test models (``tests/models/medium.yaml``: three tiers, four leaves under
  two spines under a core; ``small-tree.yaml``: two leaves, uneven, under one spine) built as
  ibsim fabrics of the same shape (both in one subnet, joined above their tops): the same
  leaf and spine grouping as topograph's models (and its labeler test's ``S2``/``S3`` under
  ``S1``) define; with the agents reading their spines' tables, ``medium``'s core tier too
  (its core above its spines; the switch joining the two models is above every agent's view);
  each node's NVML series in the NVLink domain its model's annotation names: the domain
  labels and the Slurm blocks group the nodes as the models' domains do.
- a two-tier tree with two spines, uneven leaves (3, 1 and 2 hosts) and a host with two HCAs
  on two leaves (a rail), in two phases: as built; then at once one uplink down (nothing
  moves), a leaf cut off from both spines (its block isolated, the rail host spanning two
  planes) and a leaf gone (its host's port down: the host leaves the map).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from exporter.cli.main import main
from exporter.explain.client import ClientSettings, PrometheusClient
from exporter.topology import files, render, source
from exporter.topology.model import FabricMap
from tests.topology.checks import check_all
from tests.topology.conftest import FIXTURES
from tests.topology.domains import nvml_exposition
from tests.topology.lab import Served, topology_run
from tests.topology.nets import (
    expected_groups,
    from_topograph_model,
    grouped,
    joined,
    model_domains,
)
from tests.topology.scenario import SCENARIO

KEYS = render.LabelKeys()


def read(served: Served, phase: int) -> FabricMap:
    got = source.read(
        PrometheusClient(ClientSettings(served.url)),
        served.times[phase],
        selector='job="fabricscope"',
    )
    assert got.rejects == {}
    return got.fmap


def partition(fmap: FabricMap, tier: int) -> set[frozenset[str]]:
    return {frozenset(nodes) for nodes in fmap.groups(tier).values()}


def described(fmap: FabricMap, tier: int) -> dict[str, set[str]]:
    """Tier value's switch description -> its nodes (values that are one switch)."""
    return {
        fmap.switches[value]: set(nodes)
        for value, nodes in fmap.groups(tier).items()
        if value in fmap.switches
    }


MODELS = ("medium", "small-tree")


def test_topograph_models_group_as_topograph_defines(tmp_path: Path) -> None:
    """Both models in one subnet (``nets.joined``: their tops under one more switch), each
    grouped as its model defines at every tier: ``medium``'s core joins its spines' blocks,
    ``small-tree``'s one block stays alone (the switch joining the two is cabled to
    ``medium``'s core, whose cables no agent reads)."""
    specs = {
        m: yaml.safe_load((FIXTURES / "topograph-models" / f"{m}.yaml").read_text()) for m in MODELS
    }
    trees = {m: from_topograph_model(spec) for m, spec in specs.items()}
    domains = {n: f"{m}/{d}" for m, spec in specs.items() for n, d in model_domains(spec).items()}
    clique = {d: k for k, d in enumerate(sorted(set(domains.values())), 1)}
    nvml = {d: nvml_exposition(k) for d, k in clique.items()}
    extra = {n: nvml[d] for n, d in domains.items()}
    with topology_run(
        tmp_path, joined(*trees.values()), [None], spine_links=True, extra=extra
    ) as served:
        fmap = read(served, 0)
    assert {p.node for p in fmap.places} == {h for t in trees.values() for h in t.hosts}
    for model, tree in trees.items():
        mine = set(tree.hosts)
        for tier in (0, 1, 2):
            got = {g for g in partition(fmap, tier) if g & mine}
            assert all(g <= mine for g in got), (model, tier)
            assert got == expected_groups(tree, tier), (model, tier)
        # tier 0 is the leaf the model names; tier 1 the switch above it
        spec = specs[model]
        for block in spec["blocks"]:
            leaf_nodes = described(fmap, 0)[block["switch"]]
            parents = {p for p, s in spec["switches"].items() if block["switch"] in s["switches"]}
            assert len(parents) == 1
            assert leaf_nodes <= described(fmap, 1)[parents.pop()]
    # NVLink domains: one label value and one Slurm block per model domain
    assert len(clique) == 6 and grouped(dict(fmap.domains)) == grouped(domains)
    blocks = [ln for ln in render.slurm_block(fmap).splitlines() if ln.startswith("BlockName=")]
    assert {frozenset(ln.split("Nodes=")[1].split(",")) for ln in blocks} == grouped(domains)
    check_all(fmap, KEYS)


def test_a_two_tier_tree_with_uneven_leaves_and_a_rail_host(scenario: Served) -> None:
    fmap = read(scenario, 0)
    assert described(fmap, 0) == {"lf1": {"h1", "h2", "h3"}, "lf2": {"h4"}, "lf3": {"h5", "h6"}}
    rail = fmap.place("r1")
    assert rail is not None and rail.rails
    assert {fmap.switches[g] for g in rail.leaves} == {"lf1", "lf3"}
    assert rail.tiers[0].startswith("rails-")
    assert partition(fmap, 0) == expected_groups(SCENARIO, 0)
    # one block: the whole fabric, named after its lowest spine
    assert partition(fmap, 1) == {frozenset(SCENARIO.hosts)}
    assert fmap.switches[next(iter(fmap.groups(1)))] in {"sp1", "sp2"}
    assert len(fmap.links) == 6
    check_all(fmap, KEYS)


def test_an_uplink_down_moves_nothing(scenario: Served) -> None:
    before, after = read(scenario, 0), read(scenario, 1)
    lf1 = next(g for g, d in before.switches.items() if d == "lf1")
    assert len([lk for lk in before.links if lk.switch == lf1]) == 2
    assert len([lk for lk in after.links if lk.switch == lf1]) == 1
    was, now = render.node_labels(before, KEYS), render.node_labels(after, KEYS)
    assert {h: now[h] for h in ("h1", "h2", "h3")} == {h: was[h] for h in ("h1", "h2", "h3")}


def test_a_leaf_cut_off_from_the_spines_is_its_own_block(scenario: Served) -> None:
    fmap = read(scenario, 1)
    blocks = {value: set(nodes) for value, nodes in fmap.groups(1).items()}
    lf3 = next(g for g, d in fmap.switches.items() if d == "lf3")
    assert blocks.pop(f"isolated-{lf3}") == {"h5", "h6"}
    rail = fmap.place("r1")
    assert rail is not None and rail.tiers[1].startswith("planes-")
    assert blocks.pop(rail.tiers[1]) == {"r1"}
    assert list(blocks.values()) == [{"h1", "h2", "h3"}]
    check_all(fmap, KEYS)


def test_a_leaf_gone_takes_its_hosts_off_the_map(scenario: Served) -> None:
    fmap = read(scenario, 1)
    assert fmap.place("h4") is None
    assert "lf2" not in described(fmap, 0)
    assert {p.node for p in fmap.places} == set(SCENARIO.hosts) - {"h4"}
    check_all(fmap, KEYS)


def test_the_command_prints_every_output_from_prometheus(
    scenario: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    """The last phase is a minute old: ``fabricscope topology`` reads it at "now" (once as
    a process, the other outputs through the same entry point in this one)."""
    url = ["--prometheus.url", scenario.url]
    done = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "topology", *url, "--output", "labels"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    outs = {"labels": done.stdout}
    for output in ("kueue", "volcano", "slurm", "graph"):
        assert main(["topology", *url, "--output", output]) == 0
        outs[output] = capsys.readouterr().out
    labels = yaml.safe_load(outs["labels"])
    assert set(labels) == set(SCENARIO.hosts) - {"h4"}
    assert labels["h5"]["fabric.topograph.run/tier-1"].startswith("isolated-")
    assert yaml.safe_load(outs["kueue"])["kind"] == "Topology"
    assert len(list(yaml.safe_load_all(outs["volcano"]))) == 3 + 3  # leaf groups + blocks
    assert outs["slurm"].count("SwitchName=") == 6
    assert {n["name"] for n in yaml.safe_load(outs["graph"])["nodes"]} == set(labels)


def test_no_node_placed_is_status_1_and_one_line(
    scenario: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["topology", "--prometheus.url", scenario.url, "--prometheus.selector", 'job="x"']
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "no node placed" in err and len(err.strip().splitlines()) == 1


def test_the_agents_files_give_the_map_prometheus_gives(
    scenario: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--exposition.dir``: each agent's ``--once`` output as NODE.prom, no Prometheus."""
    for phase in (0, 1):
        d = tmp_path / str(phase)
        d.mkdir()
        for host, body in scenario.bodies[phase].items():
            (d / f"{host}.prom").write_bytes(body)
        from_files, rejects = files.read_dir(str(d))
        assert rejects == {}
        assert render.node_labels(from_files, KEYS) == render.node_labels(
            read(scenario, phase), KEYS
        )
        assert from_files.links == read(scenario, phase).links
    assert main(["topology", "--exposition.dir", str(tmp_path / "1"), "--output", "slurm"]) == 0
    assert capsys.readouterr().out.count("SwitchName=") == 6
