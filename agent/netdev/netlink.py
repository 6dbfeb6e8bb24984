"""The parts of pyroute2 the netdev sampler uses (``setns``, the ethtool ioctl's structures,
the netlink error), loaded without ``pyroute2/__init__.py``: that imports every netlink family
pyroute2 speaks (conntrack, IPVS, WireGuard, nftables, its NDB with SQLite, asyncio-based
sockets of each ...), about 5 MiB of the agent's resident memory for nothing it reads. Not
its rtnetlink socket and message classes either (``IPRSocket``, ``ifinfmsg`` with its
plugins, traffic-control messages and the rest of the route family: 10 MiB more): the route
socket is a plain one (:func:`route_socket`), its questions and answers
:mod:`agent.netdev.linkmsg`. Imports pyroute2 and the standard library only.
"""

from __future__ import annotations

import importlib
import importlib.util
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def _without_its_init(package_name: str) -> None:
    """Register the package ``package_name`` (``pyroute2`` or one of its packages, whose parent
    was registered first) without running its ``__init__`` (when nothing has imported it
    yet), so that the submodules below load alone. A name asked of the package later (by code
    that wants the whole library) loads the submodule of that name, or else runs the
    ``__init__`` then, once: nothing that uses pyroute2 in full is refused it."""
    if package_name in sys.modules:
        return
    spec = importlib.util.find_spec(package_name)
    if spec is None or spec.loader is None:
        return  # not installed: the imports below say so
    loader = spec.loader
    package = importlib.util.module_from_spec(spec)
    done: list[bool] = []

    def whole(name: str) -> object:  # PEP 562: only names the module does not hold yet
        if name.isidentifier() and not name.startswith("__"):
            try:
                if importlib.util.find_spec(f"{package_name}.{name}") is not None:
                    return importlib.import_module(f"{package_name}.{name}")
            except ImportError:
                pass  # not a submodule (or a broken one): the package's own names below
        if not done:
            done.append(True)
            loader.exec_module(package)
            if name in package.__dict__:
                return package.__dict__[name]
        raise AttributeError(f"module {package_name!r} has no attribute {name!r}")

    package.__getattr__ = whole  # type: ignore[method-assign]
    sys.modules[package_name] = package
    parent, _, child = package_name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, package)


# pyroute2/__init__.py imports every family; pyroute2/ethtool/__init__.py its generic-netlink
# ethtool (an asyncio netlink socket); pyroute2/netlink/__init__.py its whole message machinery.
# The sampler needs none of them: the ioctl structures and the two error classes load alone.
for _package in ("pyroute2", "pyroute2.ethtool", "pyroute2.netlink"):
    _without_its_init(_package)

import pyroute2.ethtool.ioctl as pyroute2_ethtool  # noqa: E402
from pyroute2.ethtool.ioctl import (  # noqa: E402
    EthtoolError,
    NoSuchDevice,
    NotSupportedError,
)
from pyroute2.netlink.exceptions import NetlinkError  # noqa: E402

#: ``NETLINK_ROUTE`` (``linux/netlink.h``)
NETLINK_ROUTE = 0


def route_socket() -> socket.socket:
    """A netlink route socket in the calling thread's network namespace, bound to no
    multicast group (it receives only the answers to its own questions)."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
    try:
        sock.bind((0, 0))
    except OSError:
        sock.close()
        raise
    return sock


def made_in(netns: str | None, make: Callable[[], T]) -> T:
    """``make()`` in the network namespace ``netns`` (``None``: the caller's), for a socket,
    which stays in the namespace it was created in: a fresh thread moves itself there with
    ``setns(2)`` (``flags=0``: never creating it), makes it and ends; the calling thread never
    changes namespace. ``pushns``/``popns`` are not used: they keep a process-global stack and
    move the thread that calls them."""
    if netns is None:
        return make()
    made: list[T] = []
    failed: list[BaseException] = []

    def enter_and_make() -> None:
        try:
            _netns().setns(netns, flags=0)
            made.append(make())
        except BaseException as exc:  # handed to the calling thread below
            failed.append(exc)

    worker = threading.Thread(target=enter_and_make, name="netdev-setns", daemon=True)
    worker.start()
    worker.join()
    if failed:
        raise failed[0]
    return made[0]


def _netns() -> Any:
    """``pyroute2.netns``, imported on first use: only a sampler given a named namespace (the
    tests, the lab) needs it, and it brings ``multiprocessing`` (2 MiB)."""
    return importlib.import_module("pyroute2.netns")


def __getattr__(name: str) -> object:  # PEP 562: pyroute2_netns for benchmarks and tests
    if name == "pyroute2_netns":
        return _netns()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "NETLINK_ROUTE",
    "EthtoolError",
    "NetlinkError",
    "NoSuchDevice",
    "NotSupportedError",
    "made_in",
    "pyroute2_ethtool",
    "route_socket",
]
