"""The InfiniBand source's records: what the sampler reads (frozen, slotted dataclasses) and
what the link-capacity checks (:mod:`agent.infiniband.capacity`) and the exporter read.

A leaf of the package: the sampler (:mod:`agent.infiniband.sampler`) builds these and
imports the capacity checks, which import only these, so the two never import each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from agent.core.sysfs import ReadIssue

#: the port state and physical state numbers of a port that is up: ACTIVE (4) and LinkUp (5),
#: as the kernel prints them (``state_show``, ``phys_state_show`` in
#: drivers/infiniband/core/sysfs.c)
PORT_STATE_ACTIVE = 4
PHYS_STATE_LINK_UP = 5


@dataclass(frozen=True, slots=True)
class PortState:
    """A parsed ``"4: ACTIVE"``: the number the kernel reports and the name beside it."""

    number: int
    name: str


@dataclass(frozen=True, slots=True)
class PortCounter:
    """One counter of a port.

    ``source`` is the directory it came from (``counters``, ``counters_ext``,
    ``hw_counters``) and ``name`` the file name as the kernel spells it; a PMA counter read
    with perfquery instead (:mod:`agent.infiniband.pma`) keeps the ``counters`` source and
    name of the file it stands in for. ``raw`` is the number the hardware gave; ``scale``
    the bytes per unit it counts in (4 or 8 for data counters, else 1), so ``value`` is in
    base units. ``width`` is the PMA field width in bits when one is defined (``None`` for
    hw_counters and files fabricscope does not know). ``cleared`` is what the agent counted
    into this hardware counter and then cleared from it (``--infiniband.reset-saturated``):
    the exported count is ``cleared + raw``. ``saturated_since`` is the Unix time since when
    every pass of this agent found the counter at its maximum (``None``: not saturated, or
    a read without memory).
    """

    source: str
    name: str
    raw: int
    scale: int = 1
    width: int | None = None
    cleared: int = 0
    saturated_since: float | None = None

    @property
    def value(self) -> int:
        """The counter in base units (bytes for data counters), the agent's clears included."""
        return (self.cleared + self.raw) * self.scale

    @property
    def saturated(self) -> bool | None:
        """True when the hardware counter sat exactly at the maximum of its width when read
        (it had stopped counting: what it missed since the previous read is lost);
        ``None`` when its width is unknown."""
        if self.width is None:
            return None
        return self.raw == (1 << self.width) - 1


#: where an InfiniBand port's error counters and PortXmitWait came from (``CounterSource``)
SOURCE_SYSFS = "sysfs"
SOURCE_EXTENDED = "perfquery_extended"
SOURCE_CLEARED = "sysfs_reset"


@dataclass(frozen=True, slots=True)
class CounterSource:
    """Where an InfiniBand port's PMA counters came from in one pass
    (:mod:`agent.infiniband.pma` decides).

    ``source``: ``sysfs`` (the kernel's ``counters/`` files, 4 to 32 bits wide),
    ``perfquery_extended`` (the error counters and PortXmitWait from PortCountersExtended,
    64 bits) or ``sysfs_reset`` (the kernel's files, cleared near their maximum by the agent
    and counted on, ``--infiniband.reset-saturated``). ``reason``: why they are not 64-bit,
    empty when they are (see :data:`agent.infiniband.pma.REASONS`). ``resets_total``: clears
    the agent has sent to this port since it started (``None`` when it clears nothing).
    """

    source: str
    reason: str = ""
    resets_total: int | None = None


@dataclass(frozen=True, slots=True)
class LinkRate:
    """A parsed ``rate`` file: ``"400 Gb/sec (4X NDR)"`` is 50e9 bytes/second over 4 lanes
    of NDR. ``width`` and ``speed`` are ``None`` when the kernel printed none (or a value the
    kernel does not define)."""

    bytes_per_second: int
    width: int | None = None
    speed: str | None = None

    def describe(self) -> str:
        """``"400 Gb/s (4X NDR)"``, as people read it."""
        gbps = Decimal(self.bytes_per_second) / 125_000_000
        lanes = f"{self.width}X" if self.width is not None else ""
        detail = " ".join(x for x in (lanes, self.speed or "") if x)
        return f"{gbps.normalize():f} Gb/s" + (f" ({detail})" if detail else "")


@dataclass(frozen=True, slots=True)
class IbPort:
    """One port of an RDMA device. ``None`` means absent or unreadable, never 0."""

    device: str
    port: int
    state: PortState | None
    phys_state: PortState | None
    rate_bytes_per_second: int | None
    link_layer: str | None
    lid: int | None
    sm_lid: int | None
    #: netdevs of this port, the primary one first (``gid_attrs/ndevs/0``, else the PCI
    #: device's ``net/*`` entries whose ``dev_port`` matches); empty when none
    netdevs: tuple[str, ...]
    counters: tuple[PortCounter, ...]
    #: ``hw_counters/lifespan``: how long the driver caches hw_counters reads, in seconds
    hw_counters_lifespan_seconds: float | None
    #: active link width in lanes and lane speed name, parsed from ``rate`` (``4X NDR``)
    width: int | None = None
    speed: str | None = None
    #: the fastest rate the sampler saw this port run at while ACTIVE (since it started;
    #: see :mod:`agent.infiniband.capacity`); ``None`` for a read without history
    peak: LinkRate | None = None
    #: the rate ``--infiniband.expected-rate`` says this port should run at, if any
    expected_rate_bytes_per_second: int | None = None
    #: where its PMA counters came from; ``None`` where nothing decided (RoCE and iWARP
    #: ports, a read without the PMA step: ``fabricscope topo``, a snapshot replay)
    counter_source: CounterSource | None = None

    @property
    def link_rate(self) -> LinkRate | None:
        if self.rate_bytes_per_second is None:
            return None
        return LinkRate(self.rate_bytes_per_second, self.width, self.speed)

    @property
    def up(self) -> bool | None:
        """State ACTIVE and physical state LinkUp; ``None`` when either is unknown."""
        if self.state is None or self.phys_state is None:
            return None
        return (
            self.state.number == PORT_STATE_ACTIVE and self.phys_state.number == PHYS_STATE_LINK_UP
        )

    @property
    def netdev(self) -> str | None:
        return self.netdevs[0] if self.netdevs else None


@dataclass(frozen=True, slots=True)
class IbDevice:
    """One RDMA device (``/sys/class/infiniband/<name>``)."""

    name: str
    fw_ver: str | None
    board_id: str | None
    hca_type: str | None
    node_guid: str | None
    #: node type name (``CA``, ``switch``, ``router``, ``RNIC``)
    node_type: str | None
    pci_bus_id: str | None
    numa_node: int | None
    #: kernel driver bound to the parent device (``mlx5_core``, ``hfi1``), when linked
    driver: str | None
    ports: tuple[IbPort, ...]


@dataclass(frozen=True, slots=True)
class InfinibandSnapshot:
    devices: tuple[IbDevice, ...] = ()
    issues: tuple[ReadIssue, ...] = ()
    #: perfquery processes the PMA step ran in this pass and the wall time they took
    tool_calls: int = 0
    tool_seconds: float = 0.0
