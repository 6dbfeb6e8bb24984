"""The pci sampler: GPUs, RDMA NICs and every bridge between them and their root complex,
with NUMA placement, PCIe link speed/width and ACS state, read from sysfs.

What it reads
    ``bus/pci/devices/*`` (symlinks into ``devices/pci<domain>:<bus>/...``). Each entry's
    ``vendor`` and ``infiniband/`` directory, read through the link, settle most functions;
    only NVIDIA and Mellanox ones have their path resolved and ``class`` read:

    * GPU: NVIDIA (``0x10de``) with class ``0x0300xx`` (VGA) or ``0x0302xx`` (3D controller).
      NVSwitch bridges and audio functions share the vendor but not the class.
    * NIC: a function with an ``infiniband/`` directory (its RDMA device names, ``mlx5_0``),
      or a Mellanox (``0x15b3``) network-class (``0x02xxxx``) function without one (driver
      not bound, RDMA module not loaded).
    * bridge: every PCI device on the resolved sysfs path between a GPU or NIC and its host
      bridge (``devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:19:00.0``:
      root port, switch upstream port, switch downstream port).

    Per device: vendor, device id, class, whether it is an SR-IOV virtual function (a
    ``physfn`` link), ``numa_node`` (``-1`` kept: the platform reports
    none), ``local_cpulist``, current/max link speed (``"32.0 GT/s PCIe"`` -> transfers per
    second) and width, and the bound driver (basename of the ``driver`` link). For bridges,
    the binary ``config`` space gives the PCIe port type (standard capability list) and the
    ACS Control register (extended capability 0x000D). ``devices/system/node/node*/cpulist``
    gives the NUMA nodes.

Config space
    Beyond the first 64 bytes, ``config`` is readable only with CAP_SYS_ADMIN; a shorter
    read is "unknown", never "ACS disabled": the ACS series is absent and a ``permission``
    issue names the file. Reading ``config`` can resume a runtime-suspended device, so it is
    read for bridges only, never for GPUs.

Errors
    One unreadable or malformed file costs that value (``None``) and records an issue; a
    device whose ``vendor`` or ``class`` cannot be read cannot be classified and is left out
    (issue ``vanished`` when it disappeared mid-scan), and so are the bridges that lead only
    to it. ``NoData`` when ``bus/pci/devices`` is absent.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from agent.core.errors import NoData
from agent.core.sysfs import Issues, ReadIssue, SysfsReader, classify_os_error
from agent.pci.static import DeviceFacts, Entry, Role, StaticFacts

PortType = Literal[
    "endpoint",
    "legacy_endpoint",
    "root_port",
    "upstream_port",
    "downstream_port",
    "pcie_to_pci_bridge",
    "pci_to_pcie_bridge",
    "rc_integrated_endpoint",
    "rc_event_collector",
]

VENDOR_NVIDIA = 0x10DE
VENDOR_MELLANOX = 0x15B3
GPU_CLASSES = (0x0300, 0x0302)  # class >> 8: VGA compatible, 3D controller
NETWORK_BASE_CLASS = 0x02  # class >> 16

#: PCIe Capabilities register bits 7:4 (PCIe Base Spec 7.5.3.2)
_PORT_TYPES: dict[int, PortType] = {
    0x0: "endpoint",
    0x1: "legacy_endpoint",
    0x4: "root_port",
    0x5: "upstream_port",
    0x6: "downstream_port",
    0x7: "pcie_to_pci_bridge",
    0x8: "pci_to_pcie_bridge",
    0x9: "rc_integrated_endpoint",
    0xA: "rc_event_collector",
}

_CAP_ID_PCIE = 0x10
_EXT_CAP_ID_ACS = 0x000D
_EXT_CAP_START = 0x100
#: the conventional (non-extended) config space every function has
CONVENTIONAL_CONFIG_BYTES = 256

_BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")
_SPEED = re.compile(r"^([0-9]+(?:\.[0-9]+)?) ?GT/s(?: PCIe)?$")
_NODE_DIR = re.compile(r"^node([0-9]+)$")


# -- samples -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PciLink:
    """A device's PCIe link as sysfs reports it. Speeds in transfers per second.

    For an endpoint or switch upstream port this is its upstream link; for a root port or a
    switch downstream port it is the link below it (the one its child also reports).
    """

    speed_transfers_per_second: int | None = None
    max_speed_transfers_per_second: int | None = None
    width: int | None = None
    max_width: int | None = None


@dataclass(frozen=True, slots=True)
class AcsState:
    """A bridge's Access Control Services state.

    ``offset`` is the ACS extended capability's offset in config space, ``None`` when the
    bridge has no ACS capability (then nothing is redirected and ``control`` is 0).
    ``control`` is the raw 16-bit ACS Control register.
    """

    offset: int | None
    control: int

    @property
    def source_validation(self) -> bool:
        return bool(self.control & 0x01)

    @property
    def p2p_request_redirect(self) -> bool:
        return bool(self.control & 0x04)

    @property
    def p2p_completion_redirect(self) -> bool:
        return bool(self.control & 0x08)

    @property
    def upstream_forwarding(self) -> bool:
        return bool(self.control & 0x10)

    @property
    def p2p_redirect(self) -> bool:
        """Peer-to-peer requests or completions are redirected up to the root complex."""
        return self.p2p_request_redirect or self.p2p_completion_redirect


@dataclass(frozen=True, slots=True)
class PciDevice:
    """One GPU, NIC or bridge.

    ``address`` is ``domain:bus:device.function``. ``host_bridge`` is the root complex's sysfs
    name (``pci0000:15``); ``upstream`` the PCI bridges between it and this device, root port
    first, parent last (empty for a function directly on a root bus). ``port_type`` comes
    from config space when readable (bridges only), else ``None``. ``acs`` is ``None`` when
    unknown or not read (non-bridges). ``cpus`` is ``local_cpulist`` as sorted CPU numbers.
    ``virtfn`` is True for an SR-IOV virtual function (it has a ``physfn`` link): a VF's
    Link Status register is reserved (reads 0), so its link width and speed say nothing.
    Inside a VM a passed-through VF has no ``physfn``; it reads width 0 / speed Unknown.
    """

    address: str
    role: Role
    sysfs_path: str
    host_bridge: str
    upstream: tuple[str, ...]
    vendor: int | None = None
    device: int | None = None
    class_code: int | None = None
    numa_node: int | None = None
    cpus: tuple[int, ...] | None = None
    link: PciLink = PciLink()
    driver: str | None = None
    port_type: PortType | None = None
    acs: AcsState | None = None
    rdma_devices: tuple[str, ...] = ()
    netdevs: tuple[str, ...] = ()
    virtfn: bool = False

    @property
    def parent(self) -> str | None:
        return self.upstream[-1] if self.upstream else None


@dataclass(frozen=True, slots=True)
class NumaNode:
    """One NUMA node; ``cpus`` is ``None`` when its cpulist could not be read."""

    node: int
    cpus: tuple[int, ...] | None


@dataclass(frozen=True, slots=True)
class PciSnapshot:
    """GPUs, NICs and the bridges on their paths (sorted by address), and the NUMA nodes."""

    devices: tuple[PciDevice, ...] = ()
    numa_nodes: tuple[NumaNode, ...] = ()
    issues: tuple[ReadIssue, ...] = ()

    def get(self, address: str) -> PciDevice | None:
        for d in self.devices:
            if d.address == address:
                return d
        return None

    def by_role(self, role: Role) -> tuple[PciDevice, ...]:
        return tuple(d for d in self.devices if d.role == role)


# -- parsers (pure) ----------------------------------------------------------------------


def parse_hex(text: str) -> int:
    """``"0x10de\\n"`` -> 0x10de (vendor, device, class files)."""
    s = text.strip()
    if not s.startswith(("0x", "0X")):
        raise ValueError(f"not a 0x-prefixed hex number: {s!r}")
    return int(s, 16)


def parse_int(text: str) -> int:
    """``"-1\\n"`` -> -1 (numa_node, link width)."""
    s = text.strip()
    if not re.fullmatch(r"-?[0-9]+", s):
        raise ValueError(f"not an integer: {s!r}")
    return int(s)


def parse_link_width(text: str) -> int:
    """``"16\\n"`` -> 16. Kernels print the lane count; ``x16`` is accepted too."""
    s = text.strip().removeprefix("x")
    if not s.isdigit():
        raise ValueError(f"not a link width: {text.strip()!r}")
    return int(s)


def parse_link_speed(text: str) -> int | None:
    """``"16.0 GT/s PCIe"`` -> 16_000_000_000 transfers/second; ``"Unknown"`` -> None.

    Kernels before 5.x print ``"8 GT/s"`` or ``"2.5 GT/s"`` without ``PCIe``; both forms parse.
    Anything else raises ValueError.
    """
    s = text.strip()
    if s == "Unknown":
        return None
    m = _SPEED.match(s)
    if m is None:
        raise ValueError(f"not a PCIe link speed: {s!r}")
    whole, _, frac = m.group(1).partition(".")
    # exact decimal arithmetic: "2.5" GT/s -> 2_500_000_000, no float rounding
    return int(whole) * 1_000_000_000 + int((frac + "000000000")[:9])


def parse_cpulist(text: str) -> tuple[int, ...]:
    """Kernel list format ``"0-3,8,10-11"`` -> (0, 1, 2, 3, 8, 10, 11). Empty -> ()."""
    s = text.strip()
    if not s:
        return ()
    cpus: set[int] = set()
    for part in s.split(","):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"not a cpulist: {s!r}")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"descending range in cpulist: {part!r}")
        cpus.update(range(first, last + 1))
    return tuple(sorted(cpus))


def format_cpulist(cpus: Iterable[int]) -> str:
    """(0, 1, 2, 3, 8) -> ``"0-3,8"``, the kernel's own list format."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def parse_pcie_port_type(config: bytes) -> PortType | None:
    """The Device/Port Type of the PCI Express capability, or None when the capability is
    absent or lies beyond the bytes given (an unprivileged read returns 64 bytes)."""
    if len(config) < 0x40 or not (config[0x06] & 0x10):  # Status: capabilities list
        return None
    ptr = config[0x34] & 0xFC
    for _ in range(48):  # (256 - 64) / 4 entries at most: guards against a looped list
        if ptr < 0x40 or ptr + 4 > len(config):
            return None
        if config[ptr] == _CAP_ID_PCIE:
            return _PORT_TYPES.get((config[ptr + 2] >> 4) & 0xF)
        ptr = config[ptr + 1] & 0xFC
    return None


def parse_acs_control(config: bytes) -> AcsState | None:
    """The ACS state from a config space image, or None when it cannot be told.

    Walks the extended capability list from 0x100 for ID 0x000D and reads ACS Control
    (capability + 6). A 256-byte image is a conventional-PCI function: no extended space,
    so no ACS (``AcsState(None, 0)``). Anything shorter than 256 bytes is a truncated
    (unprivileged) read: None, "unknown".
    """
    if len(config) < CONVENTIONAL_CONFIG_BYTES:
        return None
    if len(config) < _EXT_CAP_START + 4:
        return AcsState(offset=None, control=0)
    offset = _EXT_CAP_START
    for _ in range((4096 - 256) // 8):  # the kernel's own loop bound
        header = int.from_bytes(config[offset : offset + 4], "little")
        if header in (0, 0xFFFFFFFF):
            break
        if header & 0xFFFF == _EXT_CAP_ID_ACS:
            if offset + 8 > len(config):
                return None
            control = int.from_bytes(config[offset + 6 : offset + 8], "little")
            return AcsState(offset=offset, control=control)
        offset = (header >> 20) & 0xFFC
        if offset < _EXT_CAP_START or offset + 4 > len(config):
            break
    return AcsState(offset=None, control=0)


def split_sysfs_path(rel: str) -> tuple[str, tuple[str, ...]] | None:
    """``devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:19:00.0`` ->
    (``pci0000:15``, (``0000:15:01.0``, ``0000:16:00.0``, ``0000:19:00.0``)).

    The last ``pciDDDD:BB`` component is the host bridge (a VMD or Hyper-V path nests one
    under other devices); the PCI functions below it follow. None if there is none.
    """
    parts = rel.split("/")
    host_at = None
    for i, part in enumerate(parts):
        if _HOST_BRIDGE.match(part):
            host_at = i
    if host_at is None:
        return None
    chain = tuple(p for p in parts[host_at + 1 :] if _BDF.match(p))
    if not chain:
        return None
    return parts[host_at], chain


def classify(vendor: int | None, class_code: int | None, has_rdma: bool) -> Role | None:
    """``gpu`` / ``nic`` for the devices fabricscope follows; None for everything else."""
    if vendor == VENDOR_NVIDIA and class_code is not None and class_code >> 8 in GPU_CLASSES:
        return "gpu"
    if has_rdma:
        return "nic"
    is_network = class_code is not None and class_code >> 16 == NETWORK_BASE_CLASS
    if vendor == VENDOR_MELLANOX and is_network:
        return "nic"
    return None


# -- reading -----------------------------------------------------------------------------


class _Pass:
    """One sampling pass: the issues met, the id files already read (``vendor`` and
    ``class`` are read to classify an entry; a bridge or endpoint must not read, and fail
    on, the same file twice) and the static facts it uses and keeps."""

    def __init__(self, sys: SysfsReader, known: StaticFacts) -> None:
        self.issues = Issues(sys)
        self._ids: dict[str, int | None] = {}
        #: what earlier passes kept, and what this pass keeps for the next
        self.known = known
        self.kept = StaticFacts()

    def read_id(self, rel: str, alias: str | None = None) -> int | None:
        """``rel`` parsed as hex, read at most once per pass (also under ``alias``, the
        same file seen through the bus link)."""
        if alias is not None and alias in self._ids:
            return self._ids[alias]
        if rel not in self._ids:
            self._ids[rel] = self.issues.read(rel, parse_hex)
        return self._ids[rel]


class PciSampler:
    """Reads GPUs, RDMA NICs and their upstream bridges below ``sys`` (the sysfs root).

    What a pass reads, and what it keeps
        Every pass lists ``bus/pci/devices`` (a function that appears or falls off the bus
        shows at once), checks each entry's ``infiniband/`` directory (an RDMA driver bound
        since the last pass re-classifies it), and reads of each GPU, NIC and bridge what can
        change while it sits at its address: current link speed and width, the bound driver,
        the RDMA devices and netdevs, and a bridge's config space (port type, ACS). What
        cannot change while a function exists at an address is kept from the pass that read
        it without an issue (:mod:`agent.pci.static`): which entries are none of ours (their
        ``vendor`` not read again), each function's resolved path, vendor, device id, class,
        NUMA node and local CPUs, maximum link speed and width, whether it is a virtual
        function. Those are read again every ``static_refresh_passes`` passes (default 40:
        10 min at the 15 s interval), after any pass that could not read them, and for an
        entry whose RDMA directory came or went. On the DGX tree this reads 171 files a
        steady pass instead of 561.
    """

    name = "pci"

    def __init__(self, sys: SysfsReader, *, static_refresh_passes: int = 40) -> None:
        if static_refresh_passes < 1:
            raise ValueError(
                f"static_refresh_passes must be at least 1, not {static_refresh_passes}"
            )
        self.sys = sys
        self.static_refresh_passes = static_refresh_passes
        self._passes = itertools.count()
        self._known = StaticFacts()

    def sample(self) -> PciSnapshot:
        try:
            entries = self.sys.listdir("bus/pci/devices")
        except FileNotFoundError as exc:
            raise NoData("no bus/pci/devices in sysfs") from exc
        k = next(self._passes)
        known = StaticFacts() if k % self.static_refresh_passes == 0 else self._known
        p = _Pass(self.sys, known)
        found: dict[str, PciDevice] = {}
        bridges: dict[str, tuple[str, str, tuple[str, ...]]] = {}
        for entry in entries:
            dev = self._read_endpoint(entry, p)
            if dev is None:
                continue
            found[dev.address] = dev
            parts = dev.sysfs_path.split("/")
            for i, addr in enumerate(dev.upstream):
                # the bridge's own directory: the endpoint's path cut after that component
                at = len(parts) - 1 - parts[::-1].index(addr)
                path = "/".join(parts[: at + 1])
                bridges.setdefault(addr, (path, dev.host_bridge, dev.upstream[:i]))
        for addr, (path, host, upstream) in sorted(bridges.items()):
            if addr not in found:  # GPUs and NICs are leaves; this guards odd trees
                found[addr] = self._read_device(addr, "bridge", path, host, upstream, p=p)
        self._known = p.kept  # only what this pass listed: a function gone is forgotten
        return PciSnapshot(
            devices=tuple(found[a] for a in sorted(found)),
            numa_nodes=read_numa_nodes(self.sys, p.issues),
            issues=p.issues.freeze(),
        )

    def _read_endpoint(self, entry: str, p: _Pass) -> PciDevice | None:
        link = f"bus/pci/devices/{entry}"
        has_rdma = self.sys.is_dir(f"{link}/infiniband")
        known = p.known.entries.get(entry)
        if known is not None and known.has_rdma == has_rdma and known.place is None:
            p.kept.entries[entry] = known  # none of ours: its vendor is not read again
            return None
        mark = len(p.issues.items)
        # vendor first, through the bus link: it settles most devices without resolving
        # their path; only GPUs and Mellanox functions need the class too. Read for ours
        # on every pass: a function gone mid-scan is left out, as on a first pass
        vendor = p.read_id(f"{link}/vendor")
        if known is not None and known.has_rdma == has_rdma and known.vendor == vendor:
            assert known.place is not None
            p.kept.entries[entry] = known
            at, root, parents, kind = known.place
            return self._read_device(parents[-1], kind, at, root, parents[:-1], p=p)
        if vendor not in (VENDOR_NVIDIA, VENDOR_MELLANOX) and not has_rdma:
            if vendor is not None:
                p.kept.entries[entry] = Entry(has_rdma, vendor, None)
            return None
        try:
            path = self.sys.realpath(link)
        except OSError as exc:
            p.issues.add(link, classify_os_error(exc), exc.strerror or str(exc))
            return None
        split = split_sysfs_path(path)
        if split is None:
            p.issues.add(link, "parse", f"resolves to {path}, not a devices/pci* path")
            return None
        host, chain = split
        role = classify(vendor, p.read_id(f"{path}/class"), has_rdma)
        clean = len(p.issues.items) == mark
        if role is None:
            if clean:
                p.kept.entries[entry] = Entry(has_rdma, vendor, None)
            return None
        if clean:
            p.kept.entries[entry] = Entry(has_rdma, vendor, (path, host, chain, role))
        return self._read_device(chain[-1], role, path, host, chain[:-1], p=p)

    def _read_device(
        self,
        address: str,
        role: Role,
        path: str,
        host: str,
        upstream: tuple[str, ...],
        *,
        p: _Pass,
    ) -> PciDevice:
        read, opt = p.issues.read, p.issues.read_optional
        port_type: PortType | None = None
        acs: AcsState | None = None
        if role == "bridge":
            port_type, acs = self._read_config(path, p.issues)
        facts = p.known.devices.get(path)
        if facts is None:
            mark = len(p.issues.items)
            facts = DeviceFacts(
                vendor=p.read_id(f"{path}/vendor", alias=f"bus/pci/devices/{address}/vendor"),
                device=read(f"{path}/device", parse_hex),
                class_code=p.read_id(f"{path}/class"),
                # numa_node is absent on kernels built without NUMA; local_cpulist on old ones
                numa_node=opt(f"{path}/numa_node", parse_int),
                cpus=opt(f"{path}/local_cpulist", parse_cpulist),
                max_speed=opt(f"{path}/max_link_speed", parse_link_speed),
                max_width=opt(f"{path}/max_link_width", parse_link_width),
                virtfn=self._is_virtfn(path, p.issues),
            )
            if len(p.issues.items) == mark:
                p.kept.devices[path] = facts
        else:
            p.kept.devices[path] = facts
        return PciDevice(
            address=address,
            role=role,
            sysfs_path=path,
            host_bridge=host,
            upstream=upstream,
            vendor=facts.vendor,
            device=facts.device,
            class_code=facts.class_code,
            numa_node=facts.numa_node,
            cpus=facts.cpus,
            link=PciLink(
                speed_transfers_per_second=opt(f"{path}/current_link_speed", parse_link_speed),
                max_speed_transfers_per_second=facts.max_speed,
                width=opt(f"{path}/current_link_width", parse_link_width),
                max_width=facts.max_width,
            ),
            driver=self._read_driver(path, p.issues),
            port_type=port_type,
            acs=acs,
            rdma_devices=self._listdir_optional(f"{path}/infiniband", p.issues),
            netdevs=self._listdir_optional(f"{path}/net", p.issues) if role == "nic" else (),
            virtfn=facts.virtfn,
        )

    def _is_virtfn(self, path: str, issues: Issues) -> bool:
        rel = f"{path}/physfn"
        try:
            self.sys.readlink(rel)
        except FileNotFoundError:
            return False  # a physical function, or a VF seen from inside a VM
        except OSError as exc:
            issues.add(rel, classify_os_error(exc), exc.strerror or str(exc))
            return False
        return True

    def _read_driver(self, path: str, issues: Issues) -> str | None:
        rel = f"{path}/driver"
        try:
            target = self.sys.readlink(rel)
        except FileNotFoundError:
            return None  # no driver bound: a fact, not a read problem
        except OSError as exc:
            issues.add(rel, classify_os_error(exc), exc.strerror or str(exc))
            return None
        return target.rstrip("/").rsplit("/", 1)[-1] or None

    def _listdir_optional(self, rel: str, issues: Issues) -> tuple[str, ...]:
        if not self.sys.is_dir(rel):
            return ()
        try:
            return tuple(self.sys.listdir(rel))
        except OSError as exc:
            issues.add(rel, classify_os_error(exc), exc.strerror or str(exc))
            return ()

    def _read_config(self, path: str, issues: Issues) -> tuple[PortType | None, AcsState | None]:
        rel = f"{path}/config"
        try:
            config = self.sys.read_bytes(rel)
        except OSError as exc:
            issues.add(rel, classify_os_error(exc), exc.strerror or str(exc))
            return None, None
        acs = parse_acs_control(config)
        if acs is None:
            issues.add(
                rel,
                "permission",
                f"config space read returned {len(config)} bytes; ACS lies in the extended "
                "space, readable only with CAP_SYS_ADMIN",
            )
        return parse_pcie_port_type(config), acs


def read_numa_nodes(sys: SysfsReader, issues: Issues) -> tuple[NumaNode, ...]:
    """``devices/system/node/node*/cpulist``; empty when the kernel has no NUMA support."""
    base = "devices/system/node"
    try:
        names = sys.listdir(base)
    except FileNotFoundError:
        return ()
    except OSError as exc:
        issues.add(base, classify_os_error(exc), exc.strerror or str(exc))
        return ()
    nodes = []
    for name in names:
        m = _NODE_DIR.match(name)
        if m:
            cpus = issues.read(f"{base}/{name}/cpulist", parse_cpulist)
            nodes.append(NumaNode(int(m.group(1)), cpus))
    return tuple(sorted(nodes, key=lambda n: n.node))


__all__ = [
    "AcsState",
    "NumaNode",
    "PciDevice",
    "PciLink",
    "PciSampler",
    "PciSnapshot",
    "PortType",
    "Role",
    "classify",
    "format_cpulist",
    "parse_acs_control",
    "parse_cpulist",
    "parse_hex",
    "parse_int",
    "parse_link_speed",
    "parse_link_width",
    "parse_pcie_port_type",
    "read_numa_nodes",
    "split_sysfs_path",
]
