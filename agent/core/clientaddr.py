"""The key a per-client limit counts a network peer by, shared by every server the agent
runs (the metrics server, the probe rendezvous): one address is one client for IPv4, and an
IPv6 /64 is one client, because one host typically holds a whole /64 and can connect from
any of its 2^64 addresses."""

from __future__ import annotations

import ipaddress


def client_key(addr: object) -> str:
    """The address a per-client limit counts by: an IPv4 address (IPv4-mapped IPv6 ones
    unmapped), or an IPv6 address's /64 (``2001:db8:1:2::/64``; a zone index is dropped).
    ``addr`` is what ``accept()`` returns as the peer (a tuple) or a bare host; anything
    that is not an IP address is its own key."""
    host = str(addr[0]) if isinstance(addr, tuple) and addr else str(addr)
    try:
        ip = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)
