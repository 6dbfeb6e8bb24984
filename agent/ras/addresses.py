"""This node's own IP addresses, so that a rank's ``host`` in a RAS answer (the address of
the process's bootstrap interface) can be joined to the node that owns it.

Read from the host's network namespace as procfs shows it through the host's init process
(``<procfs>/1/net/``, readable without privileges): IPv4 from ``fib_trie`` (its ``/32 host
LOCAL`` entries) and the interface of each from ``route`` (the connected route whose network
holds it), IPv6 from ``if_inet6`` (global scope only). Kept: addresses of real interfaces;
dropped: loopback, link-local, addresses without a connected route (service VIPs on
``kube-ipvs0``, which every node of a cluster shares) and interfaces of container runtimes
and CNIs (:data:`VIRTUAL_PREFIXES`: their addresses repeat from node to node, ``docker0``'s
172.17.0.1 on every one), at most :data:`MAX_ADDRESSES`.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass

from agent.core.sysfs import SysfsReader

log = logging.getLogger(__name__)

#: interfaces whose addresses say nothing about which node this is
VIRTUAL_PREFIXES = (
    "lo",
    "docker",
    "br-",
    "veth",
    "virbr",
    "cni",
    "cali",
    "flannel",
    "cilium",
    "kube-",
    "tunl",
    "vxlan",
    "weave",
    "genev",
    "nodelocaldns",
)
MAX_ADDRESSES = 32


@dataclass(frozen=True, slots=True, order=True)
class NodeAddress:
    """An address of this node (canonical text) and the interface that holds it."""

    address: str
    netdev: str


def parse_fib_trie(text: str) -> frozenset[str]:
    """The IPv4 addresses ``fib_trie`` lists as ``/32 host LOCAL`` (the node's own)."""
    out: set[str] = set()
    last: str | None = None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("|-- "):
            last = s[4:].strip()
        elif last is not None and s.startswith("/32 host LOCAL"):
            out.add(last)
    return frozenset(out)


def parse_routes(text: str) -> tuple[tuple[str, ipaddress.IPv4Network], ...]:
    """(interface, network) of the connected routes of ``/proc/net/route`` (no gateway, up),
    longest prefix first. Fields are little-endian hex."""
    out = []
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 8:
            continue
        try:
            dest, gateway, flags, mask = (int(f[i], 16) for i in (1, 2, 3, 7))
        except ValueError:
            continue
        if gateway or not flags & 1:
            continue
        net = int.from_bytes(dest.to_bytes(4, "little"), "big")
        bits = bin(mask).count("1")
        try:
            out.append((f[0], ipaddress.IPv4Network((net, bits), strict=False)))
        except ValueError:
            continue
    out.sort(key=lambda r: -r[1].prefixlen)
    return tuple(out)


def parse_if_inet6(text: str) -> tuple[NodeAddress, ...]:
    """Global-scope IPv6 addresses of ``/proc/net/if_inet6`` (``address ifindex prefixlen
    scope flags name``; scope 00 is global)."""
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) != 6 or f[3] != "00" or len(f[0]) != 32:
            continue
        try:
            addr = ipaddress.IPv6Address(bytes.fromhex(f[0]))
        except ValueError:
            continue
        out.append(NodeAddress(str(addr), f[5]))
    return tuple(out)


def _kept(addr: NodeAddress) -> bool:
    ip = ipaddress.ip_address(addr.address)
    if ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_unspecified:
        return False
    return not addr.netdev.startswith(VIRTUAL_PREFIXES)


def read_node_addresses(proc: SysfsReader) -> tuple[NodeAddress, ...]:
    """This node's addresses (see the module docstring), sorted; what cannot be read is left
    out with a debug line (a host without IPv6 has no ``if_inet6``)."""
    found: list[NodeAddress] = []
    try:
        local = parse_fib_trie(proc.read_text("1/net/fib_trie"))
        routes = parse_routes(proc.read_text("1/net/route"))
    except OSError as exc:
        log.debug("ras: no IPv4 addresses: %s", exc)
    else:
        for text in sorted(local):
            try:
                ip = ipaddress.IPv4Address(text)
            except ValueError:
                continue
            dev = next((d for d, net in routes if ip in net), None)
            if dev is not None:
                found.append(NodeAddress(text, dev))
    try:
        found.extend(parse_if_inet6(proc.read_text("1/net/if_inet6")))
    except OSError as exc:
        log.debug("ras: no IPv6 addresses: %s", exc)
    return tuple(sorted({a for a in found if _kept(a)}))[:MAX_ADDRESSES]
