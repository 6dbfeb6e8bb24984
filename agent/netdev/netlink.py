"""The parts of pyroute2 the netdev sampler uses (the rtnetlink socket, ``setns``, the
ethtool ioctl), loaded without ``pyroute2/__init__.py``: that imports every netlink family
pyroute2 speaks (conntrack, IPVS, WireGuard, nftables, its NDB with SQLite, asyncio-based
sockets of each ...), about 5 MiB of the agent's resident memory for nothing it reads.
Imports pyroute2 and the standard library only.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys


def _pyroute2_without_its_init() -> None:
    """Register the ``pyroute2`` package without running its ``__init__`` (when nothing has
    imported it yet), so that the submodules below load alone. A name asked of the package
    later (by code that wants the whole library) loads the submodule of that name, or else
    runs the ``__init__`` then, once: nothing that uses pyroute2 in full is refused it."""
    if "pyroute2" in sys.modules:
        return
    spec = importlib.util.find_spec("pyroute2")
    if spec is None or spec.loader is None:
        return  # not installed: the imports below say so
    loader = spec.loader
    package = importlib.util.module_from_spec(spec)
    done: list[bool] = []

    def whole(name: str) -> object:  # PEP 562: only names the module does not hold yet
        if name.isidentifier() and not name.startswith("__"):
            try:
                if importlib.util.find_spec(f"pyroute2.{name}") is not None:
                    return importlib.import_module(f"pyroute2.{name}")
            except ImportError:
                pass  # not a submodule (or a broken one): the package's own names below
        if not done:
            done.append(True)
            loader.exec_module(package)
            if name in package.__dict__:
                return package.__dict__[name]
        raise AttributeError(f"module 'pyroute2' has no attribute {name!r}")

    package.__getattr__ = whole  # type: ignore[method-assign]
    sys.modules["pyroute2"] = package


_pyroute2_without_its_init()

import pyroute2.ethtool.ioctl as pyroute2_ethtool  # noqa: E402
import pyroute2.netns as pyroute2_netns  # noqa: E402
from pyroute2.ethtool.ioctl import (  # noqa: E402
    EthtoolError,
    NoSuchDevice,
    NotSupportedError,
)
from pyroute2.iproute.linux import IPRoute  # noqa: E402
from pyroute2.netlink import NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE  # noqa: E402
from pyroute2.netlink.exceptions import NetlinkError  # noqa: E402
from pyroute2.netlink.rtnl import RTM_GETLINK  # noqa: E402
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg  # noqa: E402
from pyroute2.netlink.rtnl.iprsocket import IPRSocket  # noqa: E402

__all__ = [
    "NLMSG_DONE",
    "NLM_F_DUMP",
    "NLM_F_REQUEST",
    "RTM_GETLINK",
    "EthtoolError",
    "IPRSocket",
    "IPRoute",
    "NetlinkError",
    "NoSuchDevice",
    "NotSupportedError",
    "ifinfmsg",
    "pyroute2_ethtool",
    "pyroute2_netns",
]
