"""What the infiniband sampler's PMA step (agent/infiniband/pma.py) costs per pass, on a
simulated fabric: ibsim serving 8 single-port HCAs on one switch (an 8-GPU node's rails),
OpenSM, and the real perfquery through libumad2sim, side by side with the sysfs-only pass in
one run.

Each mode runs the real InfinibandSampler over a sysfs tree of the 8 ports for ``--passes``
passes and records per pass: wall time, the agent's CPU (this process), the CPU of the tool
processes it started (their rusage, the simulator's stand-in library included) and the
perfquery calls made. Modes:

- ``sysfs``: ``--infiniband.perfquery=off`` (the baseline: the pass as before).
- ``extended``: the kernel shows the 32-bit counters/ table, so PortCountersExtended's 64-bit
  data counters are read every pass (one perfquery a port a pass: the most the 64-bit read
  costs; a PMA advertising 64-bit error counters costs the same).
- ``not_advertised``: the kernel already reads 64-bit data counters and the PMA offers
  nothing more (ibsim's CapMask 0x1200): one perfquery a port on the first pass, then none
  until the hourly look (reported: the passes after the first).
- ``reset_idle``: ``--infiniband.reset-saturated``, no counter near its maximum: no call.
- ``reset_clearing``: every port has a counter past OpenSM's threshold every pass: one
  ``perfquery -r`` a port a pass (the most clearing costs; real counters need it rarely).

The simulator's stand-in library dominates the tools' CPU (it writes a fake sysfs tree for
each process), so the tool CPU here is an upper bound. The real-hardware estimate in the JSON
is arithmetic: calls per pass times a public per-call figure (see ``PER_CALL_REAL``).

    python bench/bench_pma.py [--passes 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agent.core.sysfs import SysfsReader  # noqa: E402
from agent.ibpeer.parse import parse_portinfo  # noqa: E402
from agent.infiniband.pma import PmaReader  # noqa: E402
from agent.infiniband.sampler import InfinibandSampler  # noqa: E402
from tests.ib_port_tree import write_ib_port  # noqa: E402
from tests.ibsim_lab import IbsimLab, missing_tools  # noqa: E402

PORTS = 8
#: a public timing of one perfquery on real hardware: `time perfquery -e -x` on a ConnectX
#: node, netdata issue 2620 (2019), 20 ms of CPU (user + sys) for a run that made two queries
PER_CALL_REAL = {"cpu_ms": 20.0, "source": "netdata/netdata issue 2620: `time perfquery -e -x`"}
DEVS = [f"mlx5_{i}" for i in range(PORTS)]
OPTS = "w=8 s=4 e=7"
WRAPPER = """#!/bin/bash
cd "$(dirname "$0")"
args=(); host=""
while [ $# -gt 0 ]; do
  if [ "$1" = "-C" ]; then host="$2"; args+=(-C ibsim0); shift 2; continue; fi
  args+=("$1"); shift
done
SIM_HOST="node1-$host" exec ibsim-run "${args[@]}"
"""
NARROW_DATA = {
    "port_xmit_data": 2**32 - 1,
    "port_rcv_data": 7,
    "port_xmit_packets": 7,
    "port_rcv_packets": 7,
}
WIDE_DATA = {
    **NARROW_DATA,
    "port_xmit_data": 7,
    "unicast_xmit_packets": 7,
    "unicast_rcv_packets": 7,
}
ERRORS = {"symbol_error": 0, "link_downed": 0, "port_rcv_errors": 0, "port_xmit_wait": 5}


def net() -> str:
    lines = ['Switch\t36 "leaf1"']
    lines += [f'[{i + 1}]\t"node1-{d}"[1]\t{OPTS}' for i, d in enumerate(DEVS)]
    for i, d in enumerate(DEVS):
        lines += ["", f'Hca\t1 "node1-{d}"', f'[1]\t"leaf1"[{i + 1}]\t{OPTS}']
    return "\n".join(lines) + "\n"


def tree(root: Path, lids: dict[str, int], counters: dict[str, int]) -> Path:
    for dev, lid in lids.items():
        write_ib_port(root, dev, counters, lid=lid, rate="300 Gb/sec (12X QDR)")
    return root


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def measure(sampler: InfinibandSampler, passes: int) -> list[dict[str, float]]:
    out = []
    for _ in range(passes):
        w0, c0, k0 = time.monotonic(), time.process_time(), children_cpu()
        snap = sampler.sample()
        out.append(
            {
                "wall_ms": (time.monotonic() - w0) * 1000,
                "agent_cpu_ms": (time.process_time() - c0) * 1000,
                "tool_cpu_ms": (children_cpu() - k0) * 1000,
                "calls": float(snap.tool_calls),
            }
        )
    return out


def summary(rows: list[dict[str, float]]) -> dict[str, float]:
    keys = rows[0].keys()
    return {k: round(statistics.median(r[k] for r in rows), 2) for k in keys} | {
        "wall_ms_max": round(max(r["wall_ms"] for r in rows), 2)
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=10)
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    # the clearing mode's static files never show a clear: its warnings are expected here
    logging.getLogger("agent").setLevel(logging.ERROR)
    missing = missing_tools()
    if missing:
        print(f"bench_pma: needs {', '.join(missing)} (ibsim-utils infiniband-diags opensm)")
        return 2
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="fabricscope-bench-pma-") as tmp:
        lab = IbsimLab(Path(tmp), net())
        try:
            os.environ["IBSIM_SOCKNAME"] = lab.sockname
            wrap = Path(tmp) / "wrap"
            wrap.write_text(WRAPPER)
            wrap.chmod(0o755)
            lids = {}
            for dev in DEVS:
                text = lab.tool(
                    f"node1-{dev}",
                    "smpquery",
                    "-C",
                    "ibsim0",
                    "-P",
                    "1",
                    "-D",
                    "portinfo",
                    "0",
                    "1",
                )
                lid = parse_portinfo(text).lid
                assert lid, dev
                lids[dev] = lid
            modes = {
                "sysfs": ({**NARROW_DATA, **ERRORS}, "off", False),
                "extended": ({**NARROW_DATA, **ERRORS}, "on", False),
                "not_advertised": ({**WIDE_DATA, **ERRORS}, "on", False),
                "reset_idle": ({**WIDE_DATA, **ERRORS}, "on", True),
                "reset_clearing": ({**WIDE_DATA, **ERRORS, "symbol_error": 60_000}, "on", True),
            }
            for name, (counters, mode, reset) in modes.items():
                root = tree(Path(tmp) / name / "sys", lids, counters)
                pma = PmaReader(
                    SysfsReader(root),
                    mode=mode,
                    reset=reset,
                    prefix=(str(wrap),),
                    tool_timeout=30,
                    pass_budget=120,
                )
                sampler = InfinibandSampler(SysfsReader(root), pma=pma)
                rows = measure(sampler, args.passes + 1)
                # the first pass learns what each PMA offers; the steady state is what follows
                results[name] = {"first_pass": rows[0], "steady": summary(rows[1:])}
                print(f"{name:15} first {rows[0]}  steady {results[name]['steady']}")  # type: ignore[index]
        finally:
            lab.close()
    steady = {k: v["steady"] for k, v in results.items()}  # type: ignore[index]
    base = steady["sysfs"]
    estimate = {
        mode: {
            "calls_per_pass": s["calls"],
            "tool_cpu_ms_per_pass": round(s["calls"] * PER_CALL_REAL["cpu_ms"], 1),
            "share_of_a_core_at_15s": round(s["calls"] * PER_CALL_REAL["cpu_ms"] / 15_000, 4),
        }
        for mode, s in steady.items()
    }
    doc = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        "simulator": "ibsim 0.10 + libumad2sim, infiniband-diags perfquery, OpenSM",
        "ports": PORTS,
        "passes": args.passes,
        "modes": results,
        "agent_cpu_ratio_to_sysfs": {
            k: round(v["agent_cpu_ms"] / base["agent_cpu_ms"], 2) if base["agent_cpu_ms"] else None
            for k, v in steady.items()
        },
        "real_hardware_estimate": {"per_call": PER_CALL_REAL, "modes": estimate},
    }
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    print(json.dumps(doc["real_hardware_estimate"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
