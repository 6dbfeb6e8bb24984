"""CPU and files read per steady pass of the main process's sysfs samplers (InfiniBand, PCI,
and netdev's netlink questions), for two checkouts side by side in one run: each round runs
every checkout's passes in a fresh interpreter, one after the other, so both see the same
load; the figures are medians over the rounds and their ratio is what counts on a shared
machine.

    python bench/bench_sampler_passes.py --before /path/to/old/checkout [--after .]
        [--sysfs tests/fixtures/dgx-h100/sys] [--rounds 7] [--passes 40] [--json FILE]
        [--veths K [--veth-queues Q]]

Each round: one first pass (not counted: it reads everything on any code), then ``--passes``
steady passes timed with ``time.process_time`` (this process's CPU, user + system), the
reader counting what it opens (files read, links read, paths resolved, directories listed,
paths tested). ``--passes`` stays under the samplers' static refresh (40), so the figures
are the steady passes; the refresh pass, once every 40, reads as a first pass does and is
priced apart (``first_pass_ms``).

netdev asks netlink (this machine's, not the tree's) for each netdev the tree's RDMA devices
name, one request each through pyroute2: the 12 names of the DGX tree do not exist here,
so each is answered "no such device" and the pass ends without data. Such an answer costs
less than an answered one (through agent.netdev.rtnl with pyroute2's message classes, before
9d51f5b: 0.12 against 0.37 ms, measured on the development machine for its own netdevs;
through pyroute2's IPRoute about 0.65 ms either way), and no ethtool statistics are read:
``--veths`` measures answered netdevs.

With ``--veths K`` (and ``--veth-queues Q``, default 64) it also times ``netdev_ethtool``:
the netdev sampler over K real veths of Q queues each, in a namespace made for the run (``ip
netns add``; root) that the child enters, sampling its own namespace as the agent with
hostNetwork samples the node's; a sysfs tree names each veth as an RDMA device's netdev, so
the sampler asks netlink for each by name, as on a GPU node. The veths answer netlink and
ethtool as the kernel does: one with 64 queues reports 577 ethtool statistics, of which the
default include keeps none; an mlx5 port reports a set per ring and per priority (thousands
with one ring per CPU), of which it keeps a few dozen. Both checkouts read the same veths.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.jsonout import emit  # noqa: E402

DGX = ROOT / "tests" / "fixtures" / "dgx-h100" / "sys"

#: runs inside the checkout's own interpreter path: prints one JSON line
_CHILD = r"""
import collections, json, sys, time
sys.path.insert(0, sys.argv[1])
from agent.core.sysfs import SysfsReader
from agent.infiniband.sampler import InfinibandSampler
from agent.pci.sampler import PciSampler

class Counting(SysfsReader):
    def __init__(self, root):
        super().__init__(root)
        self.ops = collections.Counter()
    def read_bytes(self, rel):
        self.ops["read"] += 1
        return super().read_bytes(rel)
    def readlink(self, rel):
        self.ops["readlink"] += 1
        return super().readlink(rel)
    def realpath(self, rel):
        self.ops["realpath"] += 1
        return super().realpath(rel)
    def listdir(self, rel):
        self.ops["listdir"] += 1
        return super().listdir(rel)
    def listdir_files(self, rel):
        self.ops["listdir"] += 1
        return super().listdir_files(rel)
    def exists(self, rel):
        self.ops["stat"] += 1
        return super().exists(rel)
    def is_dir(self, rel):
        self.ops["stat"] += 1
        return super().is_dir(rel)

from agent.core.errors import NoData
from agent.netdev.sampler import NetdevSampler

def once(sampler):
    try:
        sampler.sample()
    except NoData:
        pass  # netdev: the tree's netdev names are not this machine's (asked all the same)

out = {}
passes = int(sys.argv[3])
samplers = [("infiniband", InfinibandSampler), ("pci", PciSampler), ("netdev", NetdevSampler)]
if sys.argv[4]:  # the veths of a namespace, named by RDMA devices as the agent finds them
    samplers.append(("netdev_ethtool", NetdevSampler))
for name, cls in samplers:
    if name == "netdev_ethtool":  # moved into the namespace as the agent runs in the host's
        from agent.netdev.netlink import pyroute2_netns
        pyroute2_netns.setns(sys.argv[4], flags=0)
    reader = Counting(sys.argv[2] if name != "netdev_ethtool" else sys.argv[5])
    sampler = cls(reader)
    c0 = time.process_time()
    once(sampler)
    first = time.process_time() - c0
    reader.ops.clear()
    c0 = time.process_time()
    for _ in range(passes):
        once(sampler)
    steady = (time.process_time() - c0) / passes
    out[name] = {
        "first_pass_ms": first * 1000,
        "steady_pass_ms": steady * 1000,
        "ops_per_steady_pass": {k: v / passes for k, v in sorted(reader.ops.items())},
    }
print(json.dumps(out))
"""


def one(
    checkout: Path, sysfs: Path, passes: int, veths: tuple[str, str] = ("", "")
) -> dict[str, dict[str, object]]:
    """One round of ``checkout``'s passes; ``veths``: (namespace, the sysfs root naming
    them) of the netdev_ethtool run, or empty strings."""
    got = subprocess.run(
        [sys.executable, "-c", _CHILD, str(checkout), str(sysfs), str(passes), *veths],
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    result: dict[str, dict[str, object]] = json.loads(got.stdout.splitlines()[-1])
    return result


def load_average() -> float:
    return os.getloadavg()[0]


@contextlib.contextmanager
def veth_namespace(count: int, queues: int) -> Iterator[tuple[str, str]]:
    """A fresh namespace with ``count`` veth pairs of ``queues`` queues, up: (namespace,
    a sysfs root in which RDMA device ``mlx5_<i>`` names veth ``fsbv<i>`` as its netdev,
    as ``class/infiniband/<dev>/device/net`` does: the sampler asks for each by name). Made
    over netlink with pyroute2 (the agent's own library), so a machine without ip(8) (a GPU
    node's bare image) can run it."""
    from pyroute2 import NetNS, netns  # the agent's dependency; imported where it is used

    ns = f"fsbench-{os.getpid()}"
    netns.create(ns)
    try:
        with NetNS(ns) as ipr:
            for i in range(count):
                q = {"num_tx_queues": queues, "num_rx_queues": queues}
                ipr.link(
                    "add", ifname=f"fsbv{i}", kind="veth", peer={"ifname": f"fsbw{i}", **q}, **q
                )
                for name in (f"fsbv{i}", f"fsbw{i}"):
                    ipr.link("set", index=ipr.link_lookup(ifname=name)[0], state="up")
        with tempfile.TemporaryDirectory() as root:
            for i in range(count):
                net = Path(root, "class/infiniband", f"mlx5_{i}", "device/net", f"fsbv{i}")
                net.mkdir(parents=True)
                (net / "dev_port").write_text("0\n")
                Path(root, "class/infiniband", f"mlx5_{i}", "ports/1").mkdir(parents=True)
            yield ns, root
    finally:
        netns.remove(ns)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--before", type=Path, required=True, help="the old checkout")
    ap.add_argument("--after", type=Path, default=ROOT, help="the new checkout")
    ap.add_argument("--sysfs", type=Path, default=DGX)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--passes", type=int, default=39)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--veths", type=int, default=0, help="also netdev over K veths (root)")
    ap.add_argument("--veth-queues", type=int, default=64)
    ns = ap.parse_args(argv)
    runs: dict[str, list[dict[str, dict[str, object]]]] = {"before": [], "after": []}
    loads = [load_average()]
    with contextlib.ExitStack() as stack:
        veths = ("", "")
        if ns.veths:
            veths = stack.enter_context(veth_namespace(ns.veths, ns.veth_queues))
        for _ in range(ns.rounds):
            for label, checkout in (("before", ns.before), ("after", ns.after)):
                runs[label].append(one(checkout.resolve(), ns.sysfs.resolve(), ns.passes, veths))
            loads.append(load_average())
    samplers: dict[str, object] = {}
    names = ("infiniband", "pci", "netdev") + (("netdev_ethtool",) if ns.veths else ())
    for name in names:
        row: dict[str, object] = {}
        for label in ("before", "after"):
            rs = [r[name] for r in runs[label]]
            steady = [float(r["steady_pass_ms"]) for r in rs]  # type: ignore[arg-type]
            first = [float(r["first_pass_ms"]) for r in rs]  # type: ignore[arg-type]
            row[label] = {
                "steady_pass_ms_median": round(statistics.median(steady), 3),
                "steady_pass_ms_all": [round(v, 3) for v in steady],
                "first_pass_ms_median": round(statistics.median(first), 3),
                "ops_per_steady_pass": rs[0]["ops_per_steady_pass"],
            }
        b, a = row["before"], row["after"]
        assert isinstance(b, dict) and isinstance(a, dict)
        row["ratio_steady_cpu"] = round(a["steady_pass_ms_median"] / b["steady_pass_ms_median"], 3)
        samplers[name] = row
    result = {
        "machine": f"{os.cpu_count()} CPUs, {platform.platform()}",
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "sysfs": os.path.relpath(ns.sysfs.resolve(), ROOT),
        "rounds": ns.rounds,
        "steady_passes_per_round": ns.passes,
        "veths": {"count": ns.veths, "queues": ns.veth_queues} if ns.veths else None,
        "load_average_1m": {"min": min(loads), "max": max(loads)},
        "samplers": samplers,
    }
    emit(result, ns.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
