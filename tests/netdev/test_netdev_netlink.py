"""The netdev sampler loads the parts of pyroute2 it uses (the ethtool ioctl's structures, two
error classes) without the packages' __init__ (every netlink family pyroute2 speaks, the
generic-netlink ethtool, the netlink message machinery) and pyroute2.netns only for a named
namespace, and code that wants the whole library still gets it."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import agent.netdev.sampler
lean = sorted(m for m in sys.modules if m.startswith("pyroute2"))
assert "pyroute2.ndb.main" not in sys.modules and "sqlite3" not in sys.modules, lean
assert lean == [
    "pyroute2",
    "pyroute2.ethtool",
    "pyroute2.ethtool.common",
    "pyroute2.ethtool.ioctl",
    "pyroute2.netlink",
    "pyroute2.netlink.exceptions",
], lean
assert "asyncio" not in sys.modules and "multiprocessing" not in sys.modules
from agent.netdev import netlink
assert netlink.pyroute2_netns.setns and "pyroute2.netns" in sys.modules  # on first use
from pyroute2.ethtool import Ethtool  # the packages' own names, on demand
from pyroute2.netlink import nlmsg
assert Ethtool and nlmsg and netlink.NetlinkError is __import__("pyroute2").NetlinkError
from pyroute2.iproute.linux import IPRoute
with IPRoute() as ip:
    assert any(link.get("IFLA_IFNAME") == "lo" for link in ip.get_links())
from pyroute2 import NDB, IPRoute as Whole  # the whole library, on demand
import pyroute2
assert Whole is IPRoute and NDB is pyroute2.NDB and pyroute2.__version__
try:
    pyroute2.no_such_name
except AttributeError:
    pass
else:
    raise AssertionError("an unknown name was answered")
print(len(lean))
"""


def test_the_sampler_loads_pyroute2_without_its_package_init() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == 6  # the full package is over 160 modules
