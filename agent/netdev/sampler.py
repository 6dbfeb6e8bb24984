"""The netdev sampler: link state, kernel interface counters and driver (ethtool) statistics
of the network interfaces that carry RDMA traffic, plus any the user names.

Which interfaces
    Every netdev associated with an RDMA device in sysfs -- the contents of
    ``class/infiniband/*/ports/*/gid_attrs/ndevs/*`` (RoCE: the netdevs behind the GID table,
    VLAN and bond devices included) and the entries of ``class/infiniband/*/device/net/``
    (the PCI function's own netdevs: RoCE PFs, IPoIB ``ib0``) -- plus every interface whose
    name *fully* matches ``include``. Names are read through the :class:`SysfsReader`, so
    fixture trees and snapshots stand in for the host. An RDMA-associated name that the
    netlink namespace does not hold (an SR-IOV VF moved into a pod, a fixture describing
    another host) is listed in :attr:`NetdevSnapshot.missing`; it is not an error.

Sources, per interface
    * netlink (``RTM_GETLINK``, :mod:`agent.netdev.linkmsg`): operstate, carrier, carrier
      changes, MTU and the 64-bit kernel counters (``IFLA_STATS64``). With ``include``
      unset the sampler asks for each name; with it set it dumps every link once and
      filters.
    * sysfs ``class/net/<if>/speed`` (Mb/s, converted to bytes/s) and the bound driver.
      Read only when ``class/net/<if>/ifindex`` equals the netlink ifindex: a sysfs mounted
      in another network namespace shows other devices under the same names.
    * ethtool ``ETHTOOL_GSTATS`` (:class:`agent.netdev.ethtool.EthtoolStatistics`, pyroute2's
      ioctl structures), filtered by ``ethtool_include`` (:data:`DEFAULT_ETHTOOL_INCLUDE`;
      ``None`` turns ethtool off). The names are matched once per interface and again only
      when the driver's names change: an mlx5 port reports thousands.

      Each interface's statistics are read on its turn, every ``ethtool_rotation`` passes
      (:data:`ETHTOOL_ROTATION`, 2: 30 s at the default interval), interface ``i`` of the
      sorted names when ``(pass - i) % ethtool_rotation == 0``; between its turns its last
      answer stands. An interface read for the first time, one whose ifindex changed (made
      again: counters from zero) and one whose last read failed are read every pass until a
      read answers. Why: the three ioctls cost the driver its whole set each time (the names
      alone 0.17 ms for a veth's 577 on the development machine, linear in the count; mlx5
      also asks the firmware), and every rule and board reads these counters as rates over 5
      minutes or more. The names and values of one read always come from the same call, so a
      rotated read never pairs a value with a stale name (an mlx5 port renames its PFC
      statistics, count unchanged, when the PFC priorities change).

Network namespaces
    ``netns=None`` (production: the agent runs with hostNetwork) reads the agent's own
    namespace. With a name: a netlink socket and an ethtool ioctl act on the namespace of
    the *socket* they go through, so the sampler creates both sockets in a short-lived
    thread that first calls ``setns(2)`` (:func:`agent.netdev.netlink.made_in`;
    ``pyroute2.netns.setns`` with ``flags=0``, which never creates a namespace; Python 3.11
    has no ``os.setns``). ``setns`` moves only the calling thread, which then ends; the
    agent's other threads never change namespace.

Errors
    An interface that vanishes mid-pass (ethtool answers ``ENODEV``) is left out of the
    snapshot with a ``vanished`` issue; ethtool refusing (``EOPNOTSUPP``: ``lo`` and other
    drivers without statistics, ``EPERM``) or a netlink error on one name costs that
    interface's ethtool or link series and records an issue, path
    ``netlink/ethtool/<ifname>`` or ``netlink/link/<ifname>``. A namespace that cannot be
    opened at all raises (the runner records it).
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from agent.config import ETHTOOL_ROTATION
from agent.core.errors import NoData
from agent.core.sysfs import Issues, SysfsReader, classify_os_error
from agent.netdev.ethtool import CountChangedError, EthtoolStatistics, KnownNames
from agent.netdev.netlink import (
    EthtoolError,
    NetlinkError,
    NoSuchDevice,
    NotSupportedError,
    made_in,
)
from agent.netdev.rtnl import LinkSocket
from agent.netdev.stats import (
    DEFAULT_ETHTOOL_INCLUDE,
    EthtoolStats,
    LinkMessage,
    NetdevSample,
    NetdevSnapshot,
    NetlinkLink,
    RdmaPort,
    parse_ethtool_stats,
    parse_ndev,
    parse_speed,
    to_link,
)

#: errnos with which an empty or netdev-less GID table entry answers a read of its ndevs file
_EMPTY_GID_ERRNOS = frozenset({errno.EINVAL, errno.ENODATA, errno.ENODEV})

# -- reading -------------------------------------------------------------------------------


def read_rdma_netdevs(sys: SysfsReader, issues: Issues) -> dict[str, set[RdmaPort]]:
    """Netdev names associated with RDMA devices, each with the RDMA ports it is known to
    belong to (none when only ``device/net`` names it and its port cannot be told)."""
    out: dict[str, set[RdmaPort]] = {}
    try:
        devices = sys.listdir("class/infiniband")
    except FileNotFoundError:
        return out
    except OSError as exc:
        issues.add("class/infiniband", classify_os_error(exc), exc.strerror or str(exc))
        return out
    for dev in devices:
        base = f"class/infiniband/{dev}"
        ports: list[int] = []
        try:
            ports = sorted(int(p) for p in sys.listdir(f"{base}/ports") if p.isdigit())
        except OSError as exc:
            issues.add(f"{base}/ports", classify_os_error(exc), exc.strerror or str(exc))
        for number in ports:
            for name in _read_port_ndevs(sys, issues, f"{base}/ports/{number}"):
                out.setdefault(name, set()).add(RdmaPort(dev, number))
        try:
            names = sys.listdir(f"{base}/device/net")
        except FileNotFoundError:  # no netdev on this function (e.g. IPoIB not loaded)
            names = []
        except OSError as exc:
            issues.add(f"{base}/device/net", classify_os_error(exc), exc.strerror or str(exc))
            names = []
        for name in names:
            found = out.setdefault(name, set())
            port = _device_net_port(sys, issues, f"{base}/device/net/{name}", ports)
            if port is not None:
                found.add(RdmaPort(dev, port))
    return out


def _device_net_port(sys: SysfsReader, issues: Issues, net: str, ports: list[int]) -> int | None:
    """The RDMA port of a PCI function's netdev: ``dev_port`` + 1 (0-based in sysfs), else
    the only port of a single-port device."""
    dev_port = issues.read_optional(f"{net}/dev_port", int)
    if dev_port is not None and dev_port + 1 in ports:
        return dev_port + 1
    return ports[0] if len(ports) == 1 else None


def _read_port_ndevs(sys: SysfsReader, issues: Issues, port_dir: str) -> set[str]:
    names: set[str] = set()
    link_layer = issues.read_optional(f"{port_dir}/link_layer", str.strip)
    if link_layer == "InfiniBand":  # IB GIDs have no netdev: skip reading up to 128 files
        return names
    ndevs = f"{port_dir}/gid_attrs/ndevs"
    try:
        entries = sys.listdir(ndevs)
    except FileNotFoundError:  # kernels before 4.9 have no gid_attrs
        return names
    except OSError as exc:
        issues.add(ndevs, classify_os_error(exc), exc.strerror or str(exc))
        return names
    for entry in entries:
        rel = f"{ndevs}/{entry}"
        try:
            text = sys.read_text(rel)
        except OSError as exc:
            if exc.errno in _EMPTY_GID_ERRNOS:  # empty entry, or one without a netdev
                continue
            issues.add(rel, classify_os_error(exc), exc.strerror or str(exc))
            continue
        try:
            names.add(parse_ndev(text))
        except ValueError as exc:
            issues.add(rel, "parse", str(exc))
    return names


class _Rtnl(Protocol):
    def get_links(self) -> Iterable[LinkMessage]: ...

    def link(self, command: str, *, ifname: str) -> Iterable[LinkMessage]: ...

    def close(self) -> None: ...


def _open_rtnl(netns: str | None) -> _Rtnl:
    return LinkSocket(netns)


def read_links(
    netns: str | None,
    names: Sequence[str] | None,
    issues: Issues,
    open_rtnl: Callable[[str | None], _Rtnl] = _open_rtnl,
) -> tuple[list[NetlinkLink], list[str]]:
    """Links of the namespace: every link when ``names`` is None, else those names.

    Returns the links and the requested names the namespace does not have. Raises when the
    namespace cannot be opened or a dump fails (nothing could be sampled then).
    """
    rtnl = open_rtnl(netns)
    links: list[NetlinkLink] = []
    missing: list[str] = []
    try:
        if names is None:
            try:
                msgs = rtnl.get_links()
            except ValueError as exc:  # an answer that does not parse: no list to trust
                issues.add("netlink/link", "parse", str(exc))
                return links, missing
            for msg in msgs:
                _append_link(links, msg, issues, "netlink/link")
            return links, missing
        for name in names:
            try:
                msgs = list(rtnl.link("get", ifname=name))
            except NetlinkError as exc:
                if exc.code == errno.ENODEV:
                    missing.append(name)
                else:
                    reason = classify_os_error(OSError(exc.code, str(exc)))
                    issues.add(f"netlink/link/{name}", reason, str(exc))
                continue
            except ValueError as exc:
                issues.add(f"netlink/link/{name}", "parse", str(exc))
                continue
            for msg in msgs:
                _append_link(links, msg, issues, f"netlink/link/{name}")
        return links, missing
    finally:
        rtnl.close()


def _append_link(out: list[NetlinkLink], msg: LinkMessage, issues: Issues, path: str) -> None:
    try:
        out.append(to_link(msg))
    except ValueError as exc:
        issues.add(path, "parse", str(exc))


class _EthtoolIoctl(Protocol):
    """What the sampler asks of ethtool (:class:`agent.netdev.ethtool.EthtoolStatistics`)."""

    def statistics(self, ifname: str, include: re.Pattern[str]) -> list[tuple[str, int]]: ...

    def close(self) -> None: ...


def open_ethtool(netns: str | None, names: KnownNames | None = None) -> EthtoolStatistics:
    """An ethtool ioctl socket in ``netns`` (``None``: the caller's namespace), remembering
    each interface's statistics names in ``names`` (kept by the caller across passes).

    For a named namespace the socket is created by a fresh thread that has moved itself
    into it with ``setns(2)`` and then ends; the calling thread never changes namespace.
    """
    return made_in(netns, lambda: EthtoolStatistics(names))


def _read_sysfs_facts(
    sys: SysfsReader, issues: Issues, name: str, ifindex: int
) -> tuple[int | None, str | None]:
    """``(speed in bytes/s, driver)`` from ``class/net/<name>``, when that is the same device
    as the netlink link (same ifindex); ``(None, None)`` otherwise."""
    base = f"class/net/{name}"
    try:
        text = sys.read_text(f"{base}/ifindex")
    except FileNotFoundError:  # not in this sysfs view (another namespace), or just gone
        return None, None
    except OSError as exc:
        issues.add(f"{base}/ifindex", classify_os_error(exc), exc.strerror or str(exc))
        return None, None
    try:
        sys_ifindex = int(text.strip())
    except ValueError as exc:
        issues.add(f"{base}/ifindex", "parse", str(exc))
        return None, None
    if sys_ifindex != ifindex:  # same name, another namespace's device
        return None, None
    speed = None
    try:
        speed = parse_speed(sys.read_text(f"{base}/speed"))
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # EINVAL: link down or speed unknown to the driver
            issues.add(f"{base}/speed", classify_os_error(exc), exc.strerror or str(exc))
    except ValueError as exc:
        issues.add(f"{base}/speed", "parse", str(exc))
    driver = None
    try:
        driver = os.path.basename(sys.readlink(f"{base}/device/driver"))
    except FileNotFoundError:  # virtual devices (veth, bond, vlan) have no bound driver
        pass
    except OSError as exc:
        issues.add(f"{base}/device/driver", classify_os_error(exc), exc.strerror or str(exc))
    return speed, driver


def _sample_ethtool(
    tool: _EthtoolIoctl, name: str, include: re.Pattern[str], issues: Issues
) -> tuple[EthtoolStats | None, bool]:
    """``(statistics, vanished)`` of one interface. Statistics are ``None`` (and an issue is
    recorded) when they cannot be read; ``vanished`` says the interface no longer exists."""
    path = f"netlink/ethtool/{name}"
    try:
        pairs = tool.statistics(name, include)
    except NoSuchDevice:
        issues.add(path, "vanished", "no such device")
        return None, True
    except NotSupportedError:
        issues.add(path, "unsupported", "the driver reports no ethtool statistics")
        return None, False
    except CountChangedError:
        issues.add(path, "io", "the statistics count changed between two ethtool calls")
        return None, False
    except OSError as exc:
        if exc.errno == errno.ENODEV:
            issues.add(path, "vanished", exc.strerror or str(exc))
            return None, True
        issues.add(path, classify_os_error(exc), exc.strerror or str(exc))
        return None, False
    except EthtoolError as exc:
        issues.add(path, "io", repr(exc))
        return None, False
    return parse_ethtool_stats(pairs, include), False


# -- the sampler ---------------------------------------------------------------------------


class NetdevSampler:
    """Samples RDMA-associated netdevs plus those whose name fully matches ``include``.

    ``ethtool_include`` selects ethtool statistics (``None``: no ethtool reads); ``netns``
    names a namespace under ``/var/run/netns`` (or a path to one) to sample instead of the
    agent's own. ``sys`` must show that same namespace for speed and driver to be read.
    ``open_rtnl`` / ``open_ethtool`` open the two kernel interfaces (defaults: pyroute2's
    netlink socket and ethtool ioctl); the scenario lab answers them for nodes it plays.
    """

    name = "netdev"

    def __init__(
        self,
        sys: SysfsReader,
        include: re.Pattern[str] | None = None,
        ethtool_include: re.Pattern[str] | None = DEFAULT_ETHTOOL_INCLUDE,
        netns: str | None = None,
        *,
        open_rtnl: Callable[[str | None], _Rtnl] = _open_rtnl,
        open_ethtool: Callable[[str | None], _EthtoolIoctl] | None = None,
        ethtool_rotation: int = ETHTOOL_ROTATION,
    ) -> None:
        if ethtool_rotation < 1:
            raise ValueError("the ethtool rotation must be >= 1")
        self.sys = sys
        self.include = include
        self.ethtool_include = ethtool_include
        self.netns = netns
        self._open_rtnl = open_rtnl
        #: each interface's ethtool names and which of them are kept, across passes
        self._ethtool_names: KnownNames = {}
        self._open_ethtool = open_ethtool if open_ethtool is not None else self._own_ethtool
        self.ethtool_rotation = ethtool_rotation
        #: each interface's last ethtool answer and the ifindex it came from, between turns
        self._ethtool_last: dict[str, tuple[int, EthtoolStats]] = {}
        self._pass = 0

    def _own_ethtool(self, netns: str | None) -> _EthtoolIoctl:
        return open_ethtool(netns, self._ethtool_names)

    def _ethtool_due(self, k: int, i: int, link: NetlinkLink) -> bool:
        """Whether pass ``k`` reads the ethtool statistics of ``link``, ``i``-th by name: on
        its turn, or when it has no answer from this ifindex to stand."""
        last = self._ethtool_last.get(link.name)
        return last is None or last[0] != link.ifindex or (k - i) % self.ethtool_rotation == 0

    def sample(self) -> NetdevSnapshot:
        issues = Issues(self.sys)
        rdma = read_rdma_netdevs(self.sys, issues)
        if not rdma and self.include is None:
            raise NoData("no netdev is associated with an RDMA device and no include is set")
        wanted = None if self.include is not None else sorted(rdma)
        links, missing = read_links(self.netns, wanted, issues, self._open_rtnl)
        if self.include is not None:
            include = self.include
            present = {link.name for link in links}
            missing = sorted(n for n in rdma if n not in present)
            links = [lk for lk in links if lk.name in rdma or include.fullmatch(lk.name)]
        sampled = {link.name for link in links}
        for gone in self._ethtool_names.keys() - sampled:
            del self._ethtool_names[gone]  # the names of an interface no longer sampled
        for gone in self._ethtool_last.keys() - sampled:
            del self._ethtool_last[gone]
        if not links:
            raise NoData(f"none of the selected netdevs exists here (missing: {missing})")

        k = self._pass
        self._pass += 1
        ordered = sorted(links, key=lambda lk: lk.name)
        wanted_stats = self.ethtool_include
        due = (
            set()
            if wanted_stats is None
            else {lk.name for i, lk in enumerate(ordered) if self._ethtool_due(k, i, lk)}
        )
        tool = None
        if due:
            try:
                tool = self._open_ethtool(self.netns)
            except OSError as exc:
                issues.add("netlink/ethtool", classify_os_error(exc), exc.strerror or str(exc))
        samples = []
        try:
            for link in ordered:
                speed, driver = _read_sysfs_facts(self.sys, issues, link.name, link.ifindex)
                ethtool = None
                if wanted_stats is None:
                    pass
                elif link.name not in due:
                    ethtool = self._ethtool_last[link.name][1]  # between its turns
                elif tool is not None:
                    ethtool, vanished = _sample_ethtool(tool, link.name, wanted_stats, issues)
                    if vanished:  # gone mid-pass: leave it out rather than half-report it
                        self._ethtool_last.pop(link.name, None)
                        continue
                    if ethtool is None:  # failed: read again next pass
                        self._ethtool_last.pop(link.name, None)
                    else:
                        self._ethtool_last[link.name] = (link.ifindex, ethtool)
                samples.append(
                    NetdevSample(
                        name=link.name,
                        ifindex=link.ifindex,
                        operstate=link.operstate,
                        carrier=link.carrier,
                        carrier_changes=link.carrier_changes,
                        mtu_bytes=link.mtu_bytes,
                        speed_bytes_per_second=speed,
                        driver=driver,
                        stats=link.stats,
                        ethtool=ethtool,
                        rdma=tuple(sorted(rdma.get(link.name, ()))),
                    )
                )
        finally:
            if tool is not None:
                tool.close()
        return NetdevSnapshot(
            netdevs=tuple(samples), missing=tuple(missing), issues=issues.freeze()
        )
