"""The hold-down: a node's labels change only once the map has wanted the same new labels for
``hold_down`` seconds without a break (pure; time is passed in).

``desired`` is what the map says now (``{}``: the map no longer places the node: its link or
leaf is down, its agent stopped reporting); ``current`` what the node carries under our keys.
A node whose desire returns to what it carries before the hold-down ends changes nothing: a
cable that flaps within the hold-down never moves a placement.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

Labels = Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Change:
    """Labels to set on ``node`` (``labels``) and keys to remove (``remove``)."""

    node: str
    labels: dict[str, str]
    remove: tuple[str, ...]
    before: dict[str, str]

    @property
    def removal(self) -> bool:
        """The node leaves the map entirely (all of its labels go)."""
        return not self.labels and bool(self.remove)


@dataclass(slots=True)
class HoldDown:
    hold_down: float
    #: node -> (the labels wanted, since when)
    pending: dict[str, tuple[dict[str, str], float]] = field(default_factory=dict)

    def step(
        self,
        now: float,
        desired: Mapping[str, Labels],
        current: Mapping[str, Labels],
    ) -> list[Change]:
        """The changes due at ``now``. ``current`` covers every node the cluster has (a node
        the map places but the cluster lacks is ignored); ``desired`` the nodes the map
        places."""
        due: list[Change] = []
        for node in sorted(current):
            have = dict(current[node])
            want = dict(desired.get(node, {}))
            if want == have:
                self.pending.pop(node, None)
                continue
            held = self.pending.get(node)
            if held is None or held[0] != want:
                self.pending[node] = (want, now)
                held = self.pending[node]
            if now - held[1] >= self.hold_down:
                due.append(Change(node, want, tuple(sorted(set(have) - set(want))), have))
        for node in set(self.pending) - set(current):
            del self.pending[node]
        return due

    def applied(self, node: str) -> None:
        self.pending.pop(node, None)
