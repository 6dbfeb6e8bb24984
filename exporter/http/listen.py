"""The metrics server's listening socket: ``--web.listen-address`` parsing and binding."""

from __future__ import annotations

import errno
import math
import socket

from agent.core.errors import ConfigError

#: Listen queue length (the kernel caps it at net.core.somaxconn, 4096 on current kernels;
#: Go servers such as node_exporter ask for the same). With 128, a client reopening
#: thousands of connections a second filled the queue and a scraper's SYN was dropped and
#: retried 1 s later.
_BACKLOG = socket.SOMAXCONN


def parse_listen_address(address: str) -> tuple[str, int]:
    """``":10118"`` -> ``("", 10118)`` (all interfaces); ``"127.0.0.1:10118"``;
    ``"[::1]:10118"`` -> ``("::1", 10118)``. Raises ``ConfigError`` for anything else."""
    host, sep, port_text = address.rpartition(":")
    hint = "expected [host]:port, e.g. :10118, 127.0.0.1:10118 or [::1]:10118"
    if not sep:
        raise ConfigError(f"invalid listen address {address!r}: {hint}")
    if host.startswith("[") or host.endswith("]"):
        if not (host.startswith("[") and host.endswith("]")) or ":" not in host:
            raise ConfigError(f"invalid listen address {address!r}: {hint}")
        host = host[1:-1]
    elif ":" in host:
        raise ConfigError(
            f"invalid listen address {address!r}: an IPv6 address goes in brackets, "
            "e.g. [::1]:10118"
        )
    if not (port_text.isascii() and port_text.isdigit()) or int(port_text) > 65535:
        raise ConfigError(f"invalid listen address {address!r}: port must be 0-65535")
    return host, int(port_text)


def listen(address: str, *, defer_accept: float = 0.0) -> socket.socket:
    """A non-blocking listening socket on ``address``. ``defer_accept`` (seconds, Linux):
    the kernel hands over a connection only once its first data has arrived, or after
    about that long, so a silent connection costs the process nothing meanwhile and a
    newcomer's request is already readable when it is accepted."""
    host, port = parse_listen_address(address)
    try:
        if host == "":
            if socket.has_dualstack_ipv6():
                sock = socket.create_server(
                    ("", port), family=socket.AF_INET6, backlog=_BACKLOG, dualstack_ipv6=True
                )
            else:
                sock = socket.create_server(("", port), family=socket.AF_INET, backlog=_BACKLOG)
        else:
            try:
                infos = socket.getaddrinfo(
                    host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
                )
            except socket.gaierror as e:
                raise ConfigError(
                    f"cannot listen on {address}: cannot resolve {host}: {e.strerror}"
                ) from None
            family, _, _, _, sockaddr = infos[0]
            sock = socket.create_server(sockaddr[:2], family=family, backlog=_BACKLOG)
    except OSError as e:
        reason = {
            errno.EADDRINUSE: "address already in use",
            errno.EACCES: "permission denied",
            errno.EADDRNOTAVAIL: "address not available on this host",
        }.get(e.errno or 0, (e.strerror or str(e)).lower())
        raise ConfigError(f"cannot listen on {address}: {reason}") from None
    if defer_accept > 0 and hasattr(socket, "TCP_DEFER_ACCEPT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, math.ceil(defer_accept))
    sock.setblocking(False)
    return sock


def peer_name(addr: object) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        host, port = addr[0], addr[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(addr)
