"""The two-tier scenario the map and the controller are proven on (served once a session by
``conftest.scenario``): spines sp1 and sp2; leaves of 3, 1 and 2 hosts; a host with an HCA
on two leaves; then, at once, an uplink down, a leaf cut off from the spines and a leaf
gone."""

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


def faults(lab: IbsimLab, roots: dict[str, Path]) -> None:
    """At once: lf1's uplink to sp2 down (lf1 keeps sp1, its block and its name: nothing
    of lf1's hosts may move); lf3 cut off from both spines (its block isolated); lf2 gone
    (every port of it down, its host's port DOWN: the host leaves the map). ibsim numbers
    switch GUIDs in the net file's order, so sp1 is the lowest spine and names the block."""
    _unlink(lab, "lf1", "sp2")
    _unlink(lab, "lf3", "sp1")
    _unlink(lab, "lf3", "sp2")
    for peer in ("h4-mlx5_0", "sp1", "sp2"):
        _unlink(lab, "lf2", peer)
    port_down(roots["h4"], "mlx5_0")


#: the phases: as built; then the faults
PHASES = (None, faults)
