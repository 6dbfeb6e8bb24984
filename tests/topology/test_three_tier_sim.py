"""The core tier against a simulated three-tier fat tree: ibsim serving the net file, OpenSM,
one real agent per host reading its spines' tables (``--ibpeer.spine-links``), a real
Prometheus holding their series; the three tiers the map finds must be the ones the net file
defines, before and after a spine loses its cable to the core.

The fabric: pods A (spines sa1, sa2; leaves la1 of two hosts, la2 of one), B (spine sb1;
leaf lb1 of one host) and C (spine sc1; leaf lc1 of one host); A's and B's spines cabled
to core c1, C's to core c2; c1 and c2 under one more switch no agent reads. So tier 2 puts
A and B together and C apart. Then sb1's cable to c1 goes down: pod B is cut off from the
core, its tier 2 isolated, and nothing of A or C moves.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from exporter.cli.main import main
from exporter.explain.client import ClientSettings, PrometheusClient
from exporter.topology import files, render, source
from exporter.topology.model import FabricMap
from tests.ibsim_lab import IbsimLab
from tests.topology.checks import check_all
from tests.topology.lab import Served, topology_run
from tests.topology.nets import Tree, expected_groups, port_of

KEYS = render.LabelKeys()

THREE_TIER = Tree(
    uplinks={
        "top": (),
        "c1": ("top",),
        "c2": ("top",),
        "sa1": ("c1",),
        "sa2": ("c1",),
        "sb1": ("c1",),
        "sc1": ("c2",),
        "la1": ("sa1", "sa2"),
        "la2": ("sa1", "sa2"),
        "lb1": ("sb1",),
        "lc1": ("sc1",),
    },
    hosts={
        "a1": {"mlx5_0": "la1"},
        "a2": {"mlx5_0": "la1"},
        "a3": {"mlx5_0": "la2"},
        "b1": {"mlx5_0": "lb1"},
        "c1h": {"mlx5_0": "lc1"},
    },
)


def _core_cut(lab: IbsimLab, roots: dict[str, Path]) -> None:
    lab.command(f'Unlink "sb1"[{port_of(THREE_TIER, "sb1", "c1")}]')


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    work = tmp_path_factory.mktemp("three-tier")
    with topology_run(work, THREE_TIER, [None, _core_cut], spine_links=True) as s:
        yield s


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


def test_three_tiers_as_the_net_file_defines(served: Served) -> None:
    fmap = read(served, 0)
    assert fmap.depth == 3
    for tier in (0, 1, 2):
        assert partition(fmap, tier) == expected_groups(THREE_TIER, tier), tier
    assert partition(fmap, 2) == {frozenset({"a1", "a2", "a3", "b1"}), frozenset({"c1h"})}
    # tier 2 is named after the core switch the agents saw above the spines (c1, c2; the
    # switch above them is read by nobody)
    cores = {lk.peer for lk in fmap.core_links}
    assert len(cores) == 2 and set(fmap.groups(2)) == cores
    assert {lk.switch for lk in fmap.core_links}.isdisjoint(cores)
    check_all(fmap, KEYS)


def test_a_spine_cut_off_from_the_core_isolates_its_pod_only(served: Served) -> None:
    before, after = read(served, 0), read(served, 1)
    assert after.depth == 3
    assert partition(after, 1) == partition(before, 1)
    was, now = render.node_labels(before, KEYS), render.node_labels(after, KEYS)
    for host in ("a1", "a2", "a3", "c1h"):
        assert now[host] == was[host], host
    tier2 = KEYS.key(2)
    assert now["b1"][tier2] != was["b1"][tier2]
    assert now["b1"][tier2] == "isolated-" + now["b1"][KEYS.key(1)]
    check_all(after, KEYS)


def test_every_output_has_the_core_tier(served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    url = ["--prometheus.url", served.url]
    outs = {}
    for output in ("kueue", "volcano", "slurm"):
        assert main(["topology", *url, "--output", output]) == 0
        outs[output] = capsys.readouterr().out
    levels = [lv["nodeLabel"] for lv in yaml.safe_load(outs["kueue"])["spec"]["levels"]]
    assert levels == [KEYS.key(2), KEYS.key(1), KEYS.key(0), render.HOSTNAME]
    hypernodes = list(yaml.safe_load_all(outs["volcano"]))
    # 4 leaf groups, 3 blocks, 2 core groups (pod B's isolated, C's)... and A's
    tiers = [hn["spec"]["tier"] for hn in hypernodes]
    assert tiers.count(1) == 4 and tiers.count(2) == 3 and tiers.count(3) == 3
    assert outs["slurm"].count("SwitchName=") == 4 + 3 + 3


def test_the_agents_files_give_the_same_three_tiers(served: Served, tmp_path: Path) -> None:
    for host, body in served.bodies[0].items():
        (tmp_path / f"{host}.prom").write_bytes(body)
    fmap, rejects = files.read_dir(str(tmp_path))
    assert rejects == {}
    assert render.node_labels(fmap, KEYS) == render.node_labels(read(served, 0), KEYS)
