"""Findings: conditions an SRE should act on, derived from snapshots by pure functions.

Each area's analysis (``agent.infiniband.findings``, ``agent.topology.findings`` ...) returns
a list of these; ``fabricscope topo`` prints them and tests assert the exact set. Every
finding also has a metric an alert can be built on; the finding is the human sentence.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, order=True)
class Finding:
    """``kind`` is from a fixed vocabulary (``port_down``, ``counter_saturated``,
    ``nic_cross_numa``, ``pci_link_width_degraded``, ``acs_p2p_redirect`` ...); ``subject``
    names the thing concerned (a PCI address, ``mlx5_0/1``, ``mlx5_0/1/port_xmit_wait``);
    ``detail`` is one sentence for a person."""

    kind: str
    subject: str
    detail: str
