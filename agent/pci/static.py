"""What the PCI sampler keeps from one pass to the next: the facts of a PCI function that
cannot change while a function sits at its address (its place in the tree, vendor, device
id, class, NUMA node and local CPUs, maximum link speed and width, whether it is a virtual
function), and which ``bus/pci/devices`` entries are none of its business. No file is read
here; :mod:`agent.pci.sampler` reads them and says when they are read again."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

#: what the sampler follows a function as (:mod:`agent.pci.sampler` re-exports it)
Role = Literal["gpu", "nic", "bridge"]


@dataclass(frozen=True, slots=True)
class Entry:
    """One ``bus/pci/devices`` entry as classified: whether it had an ``infiniband/``
    directory then, its vendor, and its place (resolved sysfs path, host bridge, the chain of
    addresses from the root port to itself, role), ``None`` when it is no GPU, NIC or
    bridge the sampler reads."""

    has_rdma: bool
    vendor: int | None
    place: tuple[str, str, tuple[str, ...], Role] | None


@dataclass(frozen=True, slots=True)
class DeviceFacts:
    """What a function's configuration header and firmware say and a pass need not read
    again (``max_speed``: transfers per second; ``None``: absent, as in :class:`PciDevice`)."""

    vendor: int | None
    device: int | None
    class_code: int | None
    numa_node: int | None
    cpus: tuple[int, ...] | None
    max_speed: int | None
    max_width: int | None
    virtfn: bool


@dataclass(slots=True)
class StaticFacts:
    """Entries by name, device facts by resolved sysfs path; only what was read without an
    issue is kept."""

    entries: dict[str, Entry] = field(default_factory=dict)
    devices: dict[str, DeviceFacts] = field(default_factory=dict)
