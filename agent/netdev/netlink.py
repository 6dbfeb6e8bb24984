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
from pyroute2.netlink import (  # noqa: E402
    NLM_F_DUMP,
    NLM_F_REQUEST,
    NLMSG_DONE,
    nlmsg_base,
)
from pyroute2.netlink.exceptions import NetlinkError  # noqa: E402
from pyroute2.netlink.rtnl import RTM_GETLINK  # noqa: E402
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg  # noqa: E402
from pyroute2.netlink.rtnl.iprsocket import IPRSocket  # noqa: E402


def release(msg: object) -> None:
    """Break the reference cycles of a pyroute2 message and of every attribute it holds, once
    it has been read: each one keeps itself in its own ``chain`` list, so without this every
    message a pass parses (hundreds of objects for a link dump) is freed by the cycle
    collector some collections later instead of when the pass drops it. Anything that is
    not a pyroute2 message is left alone."""
    stack = [msg]
    while stack:
        m = stack.pop()
        if not isinstance(m, nlmsg_base):
            continue
        chain = getattr(m, "chain", None)
        if isinstance(chain, list):
            chain.clear()
        for value in dict.values(m):  # fields, and the header's (an error's copy of the
            # question is the header's "errmsg")
            if isinstance(value, nlmsg_base):
                stack.append(value)
            elif isinstance(value, dict):
                stack.extend(v for v in value.values() if isinstance(v, nlmsg_base))
        for slot in dict.get(m, "attrs") or ():
            cell = getattr(slot, "cell", None)
            if isinstance(cell, tuple) and len(cell) == 2:
                stack.append(cell[1])


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
    "nlmsg_base",
    "pyroute2_ethtool",
    "pyroute2_netns",
    "release",
]
