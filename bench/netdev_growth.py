"""Does the netdev sampler grow with its passes? Its resident memory over many passes on
real veths, fitted: what ``bench/soak.py`` cannot show, since the soak's tree names netdevs
that do not exist on the machine (each answered "no such device", no ethtool statistic read).

    python bench/netdev_growth.py [--veths 4] [--queues 64] [--passes 20000] [--samples 40]
        [--json FILE]

Root: it makes a namespace with ``--veths`` veth pairs of ``--queues`` queues (each reports
577 ethtool statistics at 64 queues, of which the default include keeps none) and a sysfs
tree naming each as an RDMA device's netdev (``bench_sampler_passes.veth_namespace``),
enters the namespace as the agent with hostNetwork reads the node's, and runs the sampler's
passes back to back: link attributes over rtnetlink, the statistics' names by digest, their
values by ioctl. Not fitted: the first tenth of the passes (pools and caches filling). The
fit is least squares over the samples of the rest; a pass is a pass whatever its interval,
so each sample is placed at its pass number times 15 s, the default interval, and fitted
as the soak fits time (``soak.fit``: the standard error widened for neighbouring samples'
correlation; the verdict against ``--max-slope`` MiB a day, two standard errors). The
process's RSS only: its allocator's pages, not Python's objects alone.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench.jsonout import emit  # noqa: E402

#: the default --sampling.interval, seconds: each pass is placed this long after the last
INTERVAL = 15
#: passes a day at that interval
PASSES_A_DAY = 86400 // INTERVAL


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--veths", type=int, default=4)
    ap.add_argument("--queues", type=int, default=64)
    ap.add_argument("--passes", type=int, default=20000)
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--max-slope", type=float, default=1.0, help="MiB a day at 15 s")
    ap.add_argument("--json", type=Path, default=None)
    ns = ap.parse_args(argv)
    if ns.passes < ns.samples or ns.samples < 10 or ns.veths < 1:
        ap.error("needs --passes >= --samples >= 10 and --veths >= 1")

    from bench_agent import rss_bytes
    from bench_sampler_passes import veth_namespace
    from soak import fit

    from agent.core.sysfs import SysfsReader
    from agent.netdev.netlink import pyroute2_netns
    from agent.netdev.sampler import NetdevSampler

    every = ns.passes // ns.samples
    points: list[tuple[int, int]] = []
    load = [os.getloadavg()[0]]
    t0 = time.monotonic()
    with veth_namespace(ns.veths, ns.queues) as (netns, root):
        pyroute2_netns.setns(netns, flags=0)
        sampler = NetdevSampler(SysfsReader(root))
        snap = sampler.sample()
        read = sum(n.ethtool is not None for n in snap.netdevs)
        c0 = time.process_time()
        for i in range(ns.passes):
            sampler.sample()
            if (i + 1) % every == 0:
                points.append((i + 1, rss_bytes(os.getpid()) // 1024))
        cpu = time.process_time() - c0
        gc.collect()
        after_collect = rss_bytes(os.getpid()) // 1024
    load.append(os.getloadavg()[0])
    fitted = [(float(x * INTERVAL), y * 1024.0) for x, y in points if x > ns.passes // 10]
    growth = fit([fitted])
    result = {
        "machine": f"{os.cpu_count()} CPUs, {platform.platform()}",
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "command": "python bench/netdev_growth.py " + " ".join(argv or sys.argv[1:]),
        "veths": ns.veths,
        "queues": ns.queues,
        "netdevs_sampled": len(snap.netdevs),
        "netdevs_with_ethtool_read": read,
        "passes": ns.passes,
        "wall_seconds": round(time.monotonic() - t0, 1),
        "cpu_ms_per_pass": round(cpu / ns.passes * 1000, 3),
        "load_average_1m": {"start": load[0], "end": load[1]},
        "rss_kib": {"first_sample": points[0][1], "last_sample": points[-1][1]},
        "rss_kib_after_collect": after_collect,
        "fitted_from_pass": int(fitted[0][0] / INTERVAL),
        "passes_fitted_in_days_at_15s": round(
            (ns.passes - fitted[0][0] / INTERVAL) / PASSES_A_DAY, 2
        ),
        "growth_at_15s": growth.as_dict(ns.max_slope),
        "samples": points,
    }
    emit(result, ns.json)
    return 1 if growth.verdict(ns.max_slope) == "above" else 0


if __name__ == "__main__":
    sys.exit(main())
