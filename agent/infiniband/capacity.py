"""Ports that stay up but run slower: an ACTIVE port's rate against what it should be.

A link that trains down to fewer lanes or a lower lane speed after a cable or transceiver
fault stays ACTIVE, its error counters may stay flat, and it carries a fraction of its
traffic. ``rate`` (``400 Gb/sec (4X NDR)``) is the only sign. Three comparisons, each named
by a fixed word (the ``comparison`` label of ``fabricscope_infiniband_port_rate_degraded``):

``history``
    the fastest rate the sampler saw this port run at while ACTIVE since the agent started
    (kept per device name, node GUID and port: a replaced HCA starts a new history; a device
    absent from a scan loses its history). Always made for an ACTIVE port with a rate; a
    one-shot read (``--once``, ``fabricscope topo``, a snapshot replay) has no history but
    the rate it reads, so it cannot find a drop.
``peers``
    the ports of the same HCA model (``hca_type`` and ``board_id``, the PSID) and link layer
    on this node, all ACTIVE: the rails of a GPU server are identical. The reference is the
    rate a strict majority of them (this port included) runs at; made only when there are
    at least :data:`MIN_PEERS` such ports and a majority exists (2 of 2, or 4 of 8 at two
    rates, cannot say which side is wrong).
``expected``
    the rate ``--infiniband.expected-rate DEVICE_GLOB[:PORT]=RATE`` names for the port (a
    per-node-class table, as gpud's per-SKU expectation); made only where a pattern matches.

A port is *degraded* by a comparison when its rate is below that comparison's reference.
Only ports that are ACTIVE with a physical state LinkUp are judged: a DOWN port reports a
placeholder rate (real mlx5 captures show ``40 Gb/sec (4X QDR)`` on a port Down/Polling),
which ``port_down`` already covers. Pure, except :class:`PeakRates`, the sampler's memory.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from agent.config import ExpectedRate
from agent.core.findings import Finding
from agent.infiniband.records import IbDevice, IbPort, InfinibandSnapshot, LinkRate

Comparison = Literal["expected", "peers", "history"]
#: the comparisons, strongest claim first (what the alert names when several fire)
COMPARISONS: tuple[Comparison, ...] = ("expected", "peers", "history")
#: ports of one HCA model and link layer needed before they are compared with each other
MIN_PEERS = 3
#: most port histories kept (a node has tens of ports; this bounds a hostile tree)
MAX_HISTORY = 4096


@dataclass(frozen=True, slots=True)
class RateCheck:
    """One comparison made for one ACTIVE port: its rate now, the reference it is held to,
    and whether it runs below it. ``reference`` carries width and speed where known (the
    peak's, or the majority's); ``basis`` says what the reference is, for a person."""

    device: str
    port: int
    comparison: Comparison
    rate: LinkRate
    reference: LinkRate
    basis: str

    @property
    def degraded(self) -> bool:
        return self.rate.bytes_per_second < self.reference.bytes_per_second


def _key(dev: IbDevice, port: IbPort) -> tuple[str, str, int]:
    return (dev.name, dev.node_guid or "", port.port)


class PeakRates:
    """The sampler's memory: per port, the fastest rate seen while ACTIVE since it started."""

    def __init__(self) -> None:
        self._peaks: dict[tuple[str, str, int], LinkRate] = {}

    def update(self, snap: InfinibandSnapshot) -> dict[tuple[str, str, int], LinkRate]:
        """Forget ports no longer present, then raise each ACTIVE port's peak to its rate."""
        present = {_key(dev, port) for dev in snap.devices for port in dev.ports}
        for gone in set(self._peaks) - present:
            del self._peaks[gone]
        for dev in snap.devices:
            for port in dev.ports:
                key = _key(dev, port)
                now = port.link_rate
                if not port.up or now is None:
                    continue
                held = self._peaks.get(key)
                if held is None and len(self._peaks) >= MAX_HISTORY:
                    continue
                if held is None or now.bytes_per_second > held.bytes_per_second:
                    self._peaks[key] = now
        return dict(self._peaks)


def expected_rate(rules: Sequence[ExpectedRate], device: str, port: int) -> int | None:
    """The first rule whose device glob (and port, when it names one) matches, else None."""
    for rule in rules:
        if rule.port is not None and rule.port != port:
            continue
        if fnmatch.fnmatchcase(device, rule.device):
            return rule.bytes_per_second
    return None


def annotate(
    snap: InfinibandSnapshot,
    peaks: dict[tuple[str, str, int], LinkRate],
    rules: Sequence[ExpectedRate] = (),
) -> InfinibandSnapshot:
    """The snapshot with each port's peak (from ``peaks``) and configured expectation."""
    devices = []
    for dev in snap.devices:
        ports = tuple(
            dataclasses.replace(
                p,
                peak=peaks.get(_key(dev, p)),
                expected_rate_bytes_per_second=expected_rate(rules, dev.name, p.port),
            )
            for p in dev.ports
        )
        devices.append(dataclasses.replace(dev, ports=ports))
    return dataclasses.replace(snap, devices=tuple(devices))


def _judged(snap: InfinibandSnapshot) -> Iterable[tuple[IbDevice, IbPort, LinkRate]]:
    for dev in snap.devices:
        for port in dev.ports:
            rate = port.link_rate
            if port.up and rate is not None:
                yield dev, port, rate


def _peer_references(snap: InfinibandSnapshot) -> dict[tuple[str, int], tuple[LinkRate, str]]:
    """Per (device, port): the majority rate of its HCA model and link layer, and who."""
    groups: dict[tuple[str, str, str], list[tuple[IbDevice, IbPort, LinkRate]]] = {}
    for dev, port, rate in _judged(snap):
        if dev.hca_type is None or port.link_layer is None:
            continue  # no model to group by: never compared with a guess
        groups.setdefault((dev.hca_type, dev.board_id or "", port.link_layer), []).append(
            (dev, port, rate)
        )
    out: dict[tuple[str, int], tuple[LinkRate, str]] = {}
    for (hca, _board, layer), members in groups.items():
        if len(members) < MIN_PEERS:
            continue
        counts = Counter(r.bytes_per_second for _, _, r in members)
        top, n = counts.most_common(1)[0]
        if 2 * n <= len(members):
            continue  # no majority: which side is wrong cannot be told
        like = next(r for _, _, r in members if r.bytes_per_second == top)
        basis = f"the {like.describe()} of {n} of the {len(members)} {hca} {layer} ports here"
        for dev, port, _ in members:
            out[(dev.name, port.port)] = (like, basis)
    return out


def rate_checks(snap: InfinibandSnapshot) -> tuple[RateCheck, ...]:
    """Every comparison that can be made for every ACTIVE port, sorted."""
    peers = _peer_references(snap)
    out: list[RateCheck] = []
    for dev, port, rate in _judged(snap):
        if port.expected_rate_bytes_per_second is not None:
            ref = LinkRate(port.expected_rate_bytes_per_second)
            basis = f"the expected {ref.describe()} (--infiniband.expected-rate)"
            out.append(RateCheck(dev.name, port.port, "expected", rate, ref, basis))
        peer = peers.get((dev.name, port.port))
        if peer is not None:
            out.append(RateCheck(dev.name, port.port, "peers", rate, peer[0], peer[1]))
        if port.peak is not None:
            basis = f"its own {port.peak.describe()} since the agent started"
            out.append(RateCheck(dev.name, port.port, "history", rate, port.peak, basis))
    return tuple(sorted(out, key=lambda c: (c.device, c.port, COMPARISONS.index(c.comparison))))


def _what_changed(rate: LinkRate, ref: LinkRate) -> str:
    parts = []
    if rate.width is not None and ref.width is not None and rate.width < ref.width:
        parts.append(f"width {ref.width}X -> {rate.width}X")
    if rate.speed is not None and ref.speed is not None and rate.speed != ref.speed:
        parts.append(f"speed {ref.speed} -> {rate.speed}")
    return f" ({', '.join(parts)})" if parts else ""


def findings(snap: InfinibandSnapshot) -> list[Finding]:
    """``port_rate_degraded``: one per ACTIVE port below any of its references, naming each
    comparison that found it. Sorted."""
    by_port: dict[tuple[str, int], list[RateCheck]] = {}
    for check in rate_checks(snap):
        if check.degraded:
            by_port.setdefault((check.device, check.port), []).append(check)
    out = []
    for (device, port), checks in sorted(by_port.items()):
        rate = checks[0].rate
        below = "; ".join(
            f"{c.basis}{_what_changed(rate, c.reference)} [{c.comparison}]" for c in checks
        )
        out.append(
            Finding(
                "port_rate_degraded",
                f"{device}/{port}",
                f"{device} port {port} is ACTIVE at {rate.describe()}, below {below}; the link "
                "trained down (cable, transceiver or port): reseat or replace, then check "
                "the rate again.",
            )
        )
    return out
