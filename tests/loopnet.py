"""A private network namespace for tests that need many client addresses, IPv6 ones
included, or a server on every address: only ``lo``, up (so all of 127.0.0.0/8 is there),
plus the addresses asked for. Nothing in it reaches the host's network, and a server may
listen on every address there. Needs root and ``ip`` (iproute2), as the netdev namespace tests do.

    with private_net(["fd31:0:0:1::2", "fd31:0:0:1::3"]) as ns, inside(ns):
        ...  # sockets made here, and processes started here, live in ``ns``
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from pyroute2.netns import setns


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextmanager
def private_net(addresses: Sequence[str] = ()) -> Iterator[str]:
    """A fresh namespace with ``lo`` up and each of ``addresses`` on it: an IPv6 one as a /64
    (no duplicate address detection, so it is usable at once), an IPv4 one as a /32 (say,
    the node's address beside loopback); deleted on exit. Yields its name."""
    name = f"fs-test-{secrets.token_hex(4)}"
    _ip("netns", "add", name)
    try:
        _ip("-n", name, "link", "set", "lo", "up")
        for address in addresses:
            if ":" in address:
                _ip("-n", name, "addr", "add", f"{address}/64", "dev", "lo", "nodad")
            else:
                _ip("-n", name, "addr", "add", f"{address}/32", "dev", "lo")
        yield name
    finally:
        _ip("netns", "delete", name)


@contextmanager
def inside(name: str) -> Iterator[None]:
    """Run the calling thread in namespace ``name`` (sockets it makes and processes it
    starts belong there; other threads are not moved), then move it back."""
    saved = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        setns(name, flags=0)
        try:
            yield
        finally:
            setns(saved)
    finally:
        os.close(saved)
