"""InfiniBand / RoCE sampler: every port of every RDMA device under ``/sys/class/infiniband``.

Reads mlx5, mlx4, irdma/i40iw, bnxt_re, hfi1, EFA and bonded devices alike: device identity
(firmware, board, HCA type, node GUID/type, PCI address, NUMA node), per-port state, rate,
link layer, LIDs and netdev, and every file in ``ports/N/counters``, ``ports/N/hw_counters``
and the legacy ``ports/N/counters_ext``. Nothing is dropped because a list did not know its
name: each counter file becomes a :class:`~agent.infiniband.records.PortCounter`, and the
exporter decides its metric.

The files' text is parsed, and converted to base units, by the pure functions of
:mod:`agent.infiniband.parse`. PMA counters saturate at the maximum of their width instead of
wrapping; each counter carries the width the kernel gives it so a stuck counter can be
flagged, and the sampler remembers since when it has been stuck. The findings over the
ports (down, switched off, counters stuck): :mod:`agent.infiniband.findings`.

One unreadable or malformed file (EACCES, EIO, a file vanishing mid-scan, garbage,
``N/A (no PMA)``) costs that value only and is recorded as a :class:`~agent.core.sysfs.ReadIssue`.
"""

from __future__ import annotations

import dataclasses
import errno
import itertools
import posixpath
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from agent.config import ExpectedRate
from agent.core.errors import NoData
from agent.core.sysfs import Issues, SysfsReader, classify_os_error
from agent.infiniband.capacity import PeakRates, annotate
from agent.infiniband.parse import (
    build_counters,
    data_unit_bytes,
    is_pci_address,
    parse_counter,
    parse_hex_int,
    parse_int,
    parse_lid,
    parse_lifespan_seconds,
    parse_link_rate,
    parse_node_type,
    parse_state,
    parse_text,
    pci_location_from_path,
)
from agent.infiniband.records import IbDevice, IbPort, InfinibandSnapshot, PortState

CLASS_DIR = "class/infiniband"

#: counter directories of a port, in the order they are read (``source`` values)
COUNTER_SOURCES = ("counters", "counters_ext", "hw_counters")

#: errnos with which reading ``gid_attrs/ndevs/0`` says "this GID has no netdev" (an
#: InfiniBand port): expected, not a problem
_NO_NDEV_ERRNOS = (errno.EINVAL, errno.ENODATA)


# -- reading ---------------------------------------------------------------------------


def _link_name(issues: Issues, rel: str) -> str | None:
    """Basename of the symlink ``rel``'s target; ``None`` when ``rel`` is no symlink."""
    try:
        target = issues.reader.readlink(rel)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.EINVAL, errno.ENOTDIR):
            return None  # no such link: a plain directory or a device without a parent
        issues.add(rel, classify_os_error(exc), exc.strerror or str(exc))
        return None
    return posixpath.basename(target.rstrip("/")) or None


def _listdir(issues: Issues, rel: str) -> list[str] | None:
    try:
        return issues.reader.listdir(rel)
    except OSError as exc:
        issues.add(rel, classify_os_error(exc), exc.strerror or str(exc))
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class KnownDevice:
    """A device as a pass read it without an issue, kept for the next passes: its identity
    (firmware, board, HCA type, GUID, node type, PCI address, NUMA node, driver) does not
    change while its ports' link states do not. ``data_unit``: bytes per unit of its PMA
    data counters; ``links``: (port, state, phys_state) of each port then."""

    device: IbDevice
    data_unit: int
    links: tuple[tuple[int, PortState | None, PortState | None], ...]


def _links(ports: Sequence[IbPort]) -> tuple[tuple[int, PortState | None, PortState | None], ...]:
    return tuple((p.port, p.state, p.phys_state) for p in ports)


def read_infiniband(
    sys: SysfsReader,
    known: Mapping[str, KnownDevice] | None = None,
    kept: dict[str, KnownDevice] | None = None,
) -> InfinibandSnapshot:
    """Read every RDMA device below ``class/infiniband``. Raises ``NoData`` when there is
    none; any other problem is recorded in the snapshot's ``issues``. ``known``: devices an
    earlier pass read, whose identity is not read again while their ports' link states are
    the same; ``kept`` receives this pass's (:class:`InfinibandSampler` passes both)."""
    issues = Issues(sys)
    try:
        names = sys.listdir(CLASS_DIR)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise NoData(f"{CLASS_DIR} is absent: no RDMA devices") from exc
        issues.add(CLASS_DIR, classify_os_error(exc), exc.strerror or str(exc))
        return InfinibandSnapshot(devices=(), issues=issues.freeze())
    if not names:
        raise NoData(f"{CLASS_DIR} is empty: no RDMA devices")
    devices = []
    for name in names:
        was = None if known is None else known.get(name)
        dev = None if was is None else _read_known(sys, issues, was, kept)
        if dev is None:
            dev = read_device(sys, issues, name, kept)
        if dev is not None:
            devices.append(dev)
    return InfinibandSnapshot(devices=tuple(devices), issues=issues.freeze())


def _read_known(
    sys: SysfsReader, issues: Issues, was: KnownDevice, kept: dict[str, KnownDevice] | None
) -> IbDevice | None:
    """A known device's ports, with the identity kept; ``None`` when its node GUID (read
    every pass: another card under the same name) or a port's link state changed (the
    device is read whole again: a firmware reset or a driver reload bounces its links) or
    it vanished."""
    name = was.device.name
    mark = len(issues.items)
    guid = issues.read_optional(f"{CLASS_DIR}/{name}/node_guid", parse_text)
    ports = _read_ports(sys, issues, name, was.data_unit)
    if guid != was.device.node_guid or _links(ports) != was.links:
        del issues.items[mark:]
        return None
    if not sys.exists(f"{CLASS_DIR}/{name}"):
        del issues.items[mark:]
        issues.add(f"{CLASS_DIR}/{name}", "vanished", "device disappeared during the scan")
        return None
    if kept is not None:
        kept[name] = was
    return dataclasses.replace(was.device, ports=ports)


def read_device(
    sys: SysfsReader, issues: Issues, name: str, kept: dict[str, KnownDevice] | None = None
) -> IbDevice | None:
    """One device; ``None`` (and one ``vanished`` issue) if it disappeared during the scan.
    Read without an issue, it goes into ``kept``."""
    base = f"{CLASS_DIR}/{name}"
    mark = len(issues.items)

    pci_bus_id, pci_dir = _read_pci_location(sys, issues, base)
    driver = _link_name(issues, f"{base}/device/driver")
    data_unit = data_unit_bytes(driver, name)
    device = IbDevice(
        name=name,
        fw_ver=issues.read_optional(f"{base}/fw_ver", parse_text),
        board_id=issues.read_optional(f"{base}/board_id", parse_text),
        hca_type=issues.read_optional(f"{base}/hca_type", parse_text),
        node_guid=issues.read_optional(f"{base}/node_guid", parse_text),
        node_type=issues.read_optional(f"{base}/node_type", parse_node_type),
        pci_bus_id=pci_bus_id,
        numa_node=(issues.read_optional(f"{pci_dir}/numa_node", parse_int) if pci_dir else None),
        driver=driver,
        ports=_read_ports(sys, issues, name, data_unit),
    )
    if not sys.exists(base):
        # The device went away mid-scan (driver unload, VF removal): what was read is partial
        # and the hardware is gone. One issue for the device instead of one per file.
        del issues.items[mark:]
        issues.add(base, "vanished", "device disappeared during the scan")
        return None
    if kept is not None and len(issues.items) == mark:
        kept[name] = KnownDevice(device, data_unit, _links(device.ports))
    return device


def _read_pci_location(sys: SysfsReader, issues: Issues, base: str) -> tuple[str | None, str]:
    """(PCI address, directory holding the PCI function's attributes) of a device."""
    parent = _link_name(issues, f"{base}/device")
    if parent is not None:
        if not is_pci_address(parent):
            # the link's text need not end in the address (``device -> ../..`` is as valid as
            # the kernel's ``../../../0000:1a:00.0``): resolve it
            try:
                parent = posixpath.basename(sys.realpath(f"{base}/device"))
            except OSError as exc:
                issues.add(f"{base}/device", classify_os_error(exc), exc.strerror or str(exc))
                return None, f"{base}/device"
        return (parent if is_pci_address(parent) else None), f"{base}/device"
    try:
        resolved = sys.realpath(base)
    except OSError as exc:
        issues.add(base, classify_os_error(exc), exc.strerror or str(exc))
        return None, ""
    found = pci_location_from_path(resolved)
    if found is None:
        return None, ""
    return found


def _read_ports(
    sys: SysfsReader, issues: Issues, device: str, data_unit: int
) -> tuple[IbPort, ...]:
    ports_dir = f"{CLASS_DIR}/{device}/ports"
    entries = _listdir(issues, ports_dir)
    if entries is None:
        return ()
    numbered: list[tuple[int, str]] = []
    for entry in entries:
        if not entry.isdigit():
            issues.add(f"{ports_dir}/{entry}", "parse", "port directory name is not a number")
            continue
        numbered.append((int(entry), entry))
    numbered.sort()
    return tuple(
        read_port(
            sys,
            issues,
            device,
            number=number,
            entry=entry,
            port_count=len(numbered),
            data_unit=data_unit,
        )
        for number, entry in numbered
    )


def read_port(
    sys: SysfsReader,
    issues: Issues,
    device: str,
    *,
    number: int,
    entry: str,
    port_count: int,
    data_unit: int,
) -> IbPort:
    """Port ``number`` (directory ``entry``) of ``device``; ``port_count`` is how many ports
    the device has, ``data_unit`` the bytes per unit of its PMA data counters."""
    p = f"{CLASS_DIR}/{device}/ports/{entry}"
    raw: list[tuple[str, str, int]] = []
    lifespan: float | None = None
    for source in COUNTER_SOURCES:
        directory = f"{p}/{source}"
        try:
            files = sys.listdir_files(directory)
        except (FileNotFoundError, NotADirectoryError):
            continue  # irdma has no counters/, only mlx4 on old kernels has counters_ext/
        except OSError as exc:
            issues.add(directory, classify_os_error(exc), exc.strerror or str(exc))
            continue
        for fname in files:
            rel = f"{directory}/{fname}"
            if source == "hw_counters" and fname == "lifespan":
                lifespan = issues.read(rel, parse_lifespan_seconds)
                continue
            value = issues.read(rel, parse_counter)
            if value is not None:
                raw.append((source, fname, value))
    state = issues.read(f"{p}/state", parse_state)
    phys_state = issues.read(f"{p}/phys_state", parse_state)
    rate = issues.read(f"{p}/rate", parse_link_rate)
    return IbPort(
        device=device,
        port=number,
        state=state,
        phys_state=phys_state,
        rate_bytes_per_second=rate.bytes_per_second if rate is not None else None,
        width=rate.width if rate is not None else None,
        speed=rate.speed if rate is not None else None,
        link_layer=issues.read(f"{p}/link_layer", parse_text),
        lid=issues.read_optional(f"{p}/lid", parse_lid),
        sm_lid=issues.read_optional(f"{p}/sm_lid", parse_lid),
        netdevs=_read_netdevs(sys, issues, device, p=p, number=number, port_count=port_count),
        counters=build_counters(raw, data_unit),
        hw_counters_lifespan_seconds=lifespan,
    )


def _read_netdevs(
    sys: SysfsReader, issues: Issues, device: str, *, p: str, number: int, port_count: int
) -> tuple[str, ...]:
    """The port's netdev: ``gid_attrs/ndevs/0`` (RoCE, bonds), else the PCI device's
    ``net/*`` whose ``dev_port`` (or legacy ``dev_id``) is ``port - 1`` (IPoIB, iWARP)."""
    ndev0 = f"{p}/gid_attrs/ndevs/0"
    if sys.exists(ndev0):
        try:
            name = sys.read_text(ndev0).strip()
        except OSError as exc:
            if exc.errno not in _NO_NDEV_ERRNOS:
                issues.add(ndev0, classify_os_error(exc), exc.strerror or str(exc))
            # else: GID 0 has no netdev (an InfiniBand port); look at the parent device
        else:
            if name:
                return (name,)
    net = f"{CLASS_DIR}/{device}/device/net"
    if not sys.is_dir(net):
        return ()
    names = _listdir(issues, net) or []
    matched: list[str] = []
    for name in names:
        dev_port = issues.read_optional(f"{net}/{name}/dev_port", parse_int)
        if dev_port is None:
            dev_port = issues.read_optional(f"{net}/{name}/dev_id", parse_hex_int)
        if dev_port is None:
            if port_count == 1:
                matched.append(name)
        elif dev_port == number - 1:
            matched.append(name)
    return tuple(matched)


class CounterReader(Protocol):
    """A step that reads a port's PMA counters another way and returns the snapshot with
    them merged (:class:`agent.infiniband.pma.PmaReader`: perfquery at the port's LID)."""

    def update(self, snap: InfinibandSnapshot) -> InfinibandSnapshot: ...


class SaturationClock:
    """Since when each PMA counter has been found at its maximum: the first pass of the
    current run of passes that found it there (this agent's memory: after a restart, the
    restart's first pass)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._since: dict[tuple[str, int, str, str], float] = {}

    def stamp(self, snap: InfinibandSnapshot) -> InfinibandSnapshot:
        now = self._clock()
        seen: dict[tuple[str, int, str, str], float] = {}
        devices = []
        for dev in snap.devices:
            ports = []
            for port in dev.ports:
                counters = []
                for c in port.counters:
                    if not c.saturated:
                        counters.append(c)
                        continue
                    key = (dev.name, port.port, c.source, c.name)
                    seen[key] = self._since.get(key, now)
                    counters.append(dataclasses.replace(c, saturated_since=seen[key]))
                ports.append(dataclasses.replace(port, counters=tuple(counters)))
            devices.append(dataclasses.replace(dev, ports=tuple(ports)))
        self._since = seen
        return dataclasses.replace(snap, devices=tuple(devices))


class InfinibandSampler:
    """Samples ``/sys/class/infiniband`` through a :class:`~agent.core.sysfs.SysfsReader`.

    Keeps memories between passes: each port's fastest rate seen while ACTIVE, stamped (with
    the configured expectation, ``expected_rates``) on the ports it returns for
    :mod:`agent.infiniband.capacity` to judge, and since when each saturated counter has
    been saturated. ``pma``, when given, reads the InfiniBand ports' PMA counters with
    perfquery after sysfs (64-bit where the HCA keeps them; cleared near their maximum when
    asked) and merges them in.

    Every pass reads every port whole (link state, rate, LIDs, netdev, every counter), each
    device's node GUID, and checks that each device still exists; the rest of a device's
    identity (firmware, board, HCA type, node type, PCI address, NUMA node, driver) is kept
    from the pass that read it without an issue and read again when its node GUID or any of
    its ports' link state changes, and every ``static_refresh_passes`` passes (default 40:
    10 min at the 15 s interval).
    """

    name = "infiniband"

    def __init__(
        self,
        sys: SysfsReader,
        expected_rates: Sequence[ExpectedRate] = (),
        pma: CounterReader | None = None,
        *,
        static_refresh_passes: int = 40,
    ) -> None:
        self.sys = sys
        self.expected_rates = tuple(expected_rates)
        self.pma = pma
        self._peaks = PeakRates()
        self._saturation = SaturationClock()
        if static_refresh_passes < 1:
            raise ValueError(
                f"static_refresh_passes must be at least 1, not {static_refresh_passes}"
            )
        self.static_refresh_passes = static_refresh_passes
        self._passes = itertools.count()
        self._known: dict[str, KnownDevice] = {}

    def sample(self) -> InfinibandSnapshot:
        k = next(self._passes)
        kept: dict[str, KnownDevice] = {}
        known = None if k % self.static_refresh_passes == 0 else self._known
        snap = read_infiniband(self.sys, known, kept)
        self._known = kept
        if self.pma is not None:
            snap = self.pma.update(snap)
        snap = self._saturation.stamp(snap)
        return annotate(snap, self._peaks.update(snap), self.expected_rates)
