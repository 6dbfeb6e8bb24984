"""Peer addresses and probe ids: ``HOST[:PORT]`` as flags and peers files spell them, and the
id an offer carries (``<prefix>-<random>[.g<k>]``, ``.g<k>`` asking the host for its GPU at
position ``k``; ids of ``fabricscope probe`` start with :data:`MANUAL_PREFIX`)."""

from __future__ import annotations

import ipaddress
import secrets

from agent.config import DEFAULT_PROBE_PORT

#: probe ids of manual probes (``fabricscope probe`` against an agent) start with this
MANUAL_PREFIX = "cli-"


def parse_hostport(text: str, default_port: int = DEFAULT_PROBE_PORT) -> tuple[str, int]:
    """``HOST``, ``HOST:PORT``, ``[V6]:PORT`` or a bare IPv6 literal -> (host, port).
    ValueError naming the problem."""
    value = text.strip()
    if not value:
        raise ValueError("empty address")
    port_text = ""
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"{text!r}: expected [IPv6]:PORT")
        port_text = rest[1:]
    elif value.count(":") == 1:
        host, _, port_text = value.partition(":")
    else:
        host = value  # a name, IPv4, or an IPv6 literal without a port
    if not host:
        raise ValueError(f"{text!r}: no host")
    port = default_port
    if port_text:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise ValueError(f"{text!r}: port {port_text!r} is not 1..65535")
        port = int(port_text)
    return host, port


def hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def probe_id(prefix: str, slot: int | None = None) -> str:
    """A fresh probe id; ``.g<k>`` asks the host for the GPU at position ``k``."""
    suffix = f".g{slot}" if slot is not None else ""
    return f"{prefix}-{secrets.token_hex(6)}{suffix}"


def requested_slot(pid: str) -> int | None:
    """The GPU position a probe id asks for (its ``.g<k>`` suffix), or None."""
    _, sep, tail = pid.rpartition(".g")
    if sep and tail.isdigit() and len(tail) <= 4:
        return int(tail)
    return None


def _unspecified(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr.strip("[]")).is_unspecified
    except ValueError:
        return False


def is_unspecified(addr: str) -> bool:
    """Whether ``addr`` is ``0.0.0.0`` or ``::`` (a host listening on every address)."""
    try:
        return ipaddress.ip_address(addr.strip("[]")).is_unspecified
    except ValueError:
        return False
