"""CPU and files read per steady pass of the main process's sysfs samplers (InfiniBand, PCI,
and netdev's netlink questions), for two checkouts side by side in one run: each round runs
every checkout's passes in a fresh interpreter, one after the other, so both see the same
load; the figures are medians over the rounds and their ratio is what counts on a shared
machine.

    python bench/bench_sampler_passes.py --before /path/to/old/checkout [--after .]
        [--sysfs tests/fixtures/dgx-h100/sys] [--rounds 7] [--passes 40] [--json FILE]

Each round: one first pass (not counted: it reads everything on any code), then ``--passes``
steady passes timed with ``time.process_time`` (this process's CPU, user + system), the
reader counting what it opens (files read, links read, paths resolved, directories listed,
paths tested). ``--passes`` stays under the samplers' static refresh (40), so the figures
are the steady passes; the refresh pass, once every 40, reads as a first pass does and is
priced apart (``first_pass_ms``).

netdev asks netlink (this machine's, not the tree's) for each netdev the tree's RDMA devices
name, one request each through pyroute2: the 12 names of the DGX tree do not exist here,
so each is answered "no such device" and the pass ends without data; the cost is pyroute2's
per request (about the same for an answered one: 0.64 ms a request, 0.43 ms to open and
close the socket, measured on the development machine for its own netdevs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
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
samplers = (("infiniband", InfinibandSampler), ("pci", PciSampler), ("netdev", NetdevSampler))
for name, cls in samplers:
    reader = Counting(sys.argv[2])
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


def one(checkout: Path, sysfs: Path, passes: int) -> dict[str, dict[str, object]]:
    got = subprocess.run(
        [sys.executable, "-c", _CHILD, str(checkout), str(sysfs), str(passes)],
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--before", type=Path, required=True, help="the old checkout")
    ap.add_argument("--after", type=Path, default=ROOT, help="the new checkout")
    ap.add_argument("--sysfs", type=Path, default=DGX)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--passes", type=int, default=39)
    ap.add_argument("--json", type=Path, default=None)
    ns = ap.parse_args(argv)
    runs: dict[str, list[dict[str, dict[str, object]]]] = {"before": [], "after": []}
    loads = [load_average()]
    for _ in range(ns.rounds):
        for label, checkout in (("before", ns.before), ("after", ns.after)):
            runs[label].append(one(checkout.resolve(), ns.sysfs.resolve(), ns.passes))
        loads.append(load_average())
    samplers: dict[str, object] = {}
    for name in ("infiniband", "pci", "netdev"):
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
        "load_average_1m": {"min": min(loads), "max": max(loads)},
        "samplers": samplers,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if ns.json:
        ns.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
