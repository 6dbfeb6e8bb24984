"""The two-tier scenario the map and the controller are proven on (served once a session by
``conftest.scenario``): spines sp1 and sp2; leaves of 3, 1 and 2 hosts; a host with an HCA
on two leaves; then an uplink down; then a leaf cut off from the spines and a leaf gone."""

from __future__ import annotations

from pathlib import Path

from tests.ibsim_lab import IbsimLab
from tests.topology.lab import port_down
from tests.topology.nets import Tree, port_of

#: the two-tier scenario: spines sp1, sp2; lf1 3 hosts, lf2 1, lf3 2; host r1's mlx5_0 on
#: lf1 and mlx5_1 on lf3
SCENARIO = Tree(
    uplinks={
        "sp1": (),
        "sp2": (),
        "lf1": ("sp1", "sp2"),
        "lf2": ("sp1", "sp2"),
        "lf3": ("sp1", "sp2"),
    },
    hosts={
        **{h: {"mlx5_0": "lf1"} for h in ("h1", "h2", "h3")},
        "h4": {"mlx5_0": "lf2"},
        **{h: {"mlx5_0": "lf3"} for h in ("h5", "h6")},
        "r1": {"mlx5_0": "lf1", "mlx5_1": "lf3"},
    },
)


def _unlink(lab: IbsimLab, switch: str, peer: str) -> None:
    lab.command(f'Unlink "{switch}"[{port_of(SCENARIO, switch, peer)}]')


def uplink_down(lab: IbsimLab, roots: dict[str, Path]) -> None:
    _unlink(lab, "lf1", "sp1")


def leaf_cut_off_and_leaf_gone(lab: IbsimLab, roots: dict[str, Path]) -> None:
    """lf3 loses both uplinks; lf2 dies (every port down, its host's port DOWN)."""
    _unlink(lab, "lf3", "sp1")
    _unlink(lab, "lf3", "sp2")
    for peer in ("h4-mlx5_0", "sp1", "sp2"):
        _unlink(lab, "lf2", peer)
    port_down(roots["h4"], "mlx5_0")


#: the phases: as built, one uplink down, then a leaf cut off and a leaf gone
PHASES = (None, uplink_down, leaf_cut_off_and_leaf_gone)
