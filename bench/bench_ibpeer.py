"""What the ibpeer sampler costs an 8-port InfiniBand node, measured on a simulated fabric.

The fabric (ibsim, OpenSM, the real infiniband-diags under libumad2sim): a rail-optimised
two-tier fat tree, 8 leaves (one per rail) and 4 spines; 4 hosts, each with the 8 InfiniBand
HCAs of the DGX fixture (``mlx5_0,3,4,5,6,9,10,11``), HCA ``r`` of every host on leaf ``r``;
each leaf has 4 host ports and 4 uplinks (one per spine). The measured host is ``dgx``.

Passes, each timed (wall), its tool processes counted and their CPU read
(``getrusage(RUSAGE_CHILDREN)``: the tools, the ibsim-run wrapper and libumad2sim's stand-in
sysfs), beside the agent's own CPU (``process_time``):

- ``first``: the first pass of a new agent: every port's neighbour, the counters;
- ``table``: a later pass that reads one leaf's table, the far ends of the uplinks it gives
  this node and the counters (8 leaves: 8 such passes);
- ``counters``: an ordinary pass (the median of ``--passes``): counters only;
- ``topology``: the pass every ``--ibpeer.topology-interval``: neighbours, uplinks' far ends,
  counters.

Side by side, in the same run: the previous design's counter read, two ``perfquery`` calls
per watched port (``perfquery LID PORT``, ``perfquery -x LID PORT``), against this one's
``perfquery -l`` call per switch (PortCountersExtended, a second call, only at
``--collector.detail=full``).

    python bench/bench_ibpeer.py [--passes 5] [--json FILE] [--record FILE]

``--record`` writes the command line and output of every tool call one ``--once`` pass of a
new agent makes, at both detail levels' queries (the fixture the series budget replays:
``tests/fixtures/ibpeer-sim-dgx/recording.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agent.core.sysfs import SysfsReader  # noqa: E402
from agent.core.tools import ToolOutput, run_tool  # noqa: E402
from agent.ibpeer.sampler import IbPeerSampler, IbPeerSnapshot  # noqa: E402
from tests.ibsim_fabric import fat_tree, write_host  # noqa: E402
from tests.ibsim_lab import IbsimLab, missing_tools  # noqa: E402

#: the DGX fixture's InfiniBand HCAs (bench/series_budget.py's ``ib`` node)
DEVICES = ("mlx5_0", "mlx5_10", "mlx5_11", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9")
HOSTS = ("dgx", "host2", "host3", "host4")
SPINES = 4


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """A tool runner that runs the real tool and keeps each call's command (less the prefix)
    and output."""

    def __init__(self, prefix_len: int) -> None:
        self.prefix_len = prefix_len
        self.calls: dict[tuple[str, ...], str] = {}

    def __call__(
        self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None
    ) -> ToolOutput:
        out = run_tool(argv, timeout=timeout, env=env)
        self.calls[tuple(argv[self.prefix_len :])] = out.stdout
        return out


def measure(name: str, run: Callable[[], IbPeerSnapshot | int]) -> dict[str, float | str]:
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p0 = time.process_time()
    t0 = time.perf_counter()
    got = run()
    wall = time.perf_counter() - t0
    agent_cpu = time.process_time() - p0
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    tools_cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
    calls = got.tool_calls if isinstance(got, IbPeerSnapshot) else got
    issues = len(got.issues) if isinstance(got, IbPeerSnapshot) else 0
    return {
        "pass": name,
        "tool_calls": calls,
        "wall_seconds": round(wall, 3),
        "tools_cpu_seconds": round(tools_cpu, 3),
        "agent_cpu_seconds": round(agent_cpu, 4),
        "issues": issues,
    }


def per_port_counters(snap: IbPeerSnapshot, prefix: Sequence[str], env: Mapping[str, str]) -> int:
    """The previous design's counter read: two perfquery calls per watched switch port."""
    calls = 0
    targets = [
        (p.device, p.peer_lid, p.peer.local_port)
        for p in snap.ports
        if p.peer is not None and p.peer_lid
    ]
    targets += [(u.via[0], u.switch_lid, u.switch_port) for u in snap.uplinks]
    targets += [(u.via[0], u.peer_lid, u.peer_port) for u in snap.uplinks if u.peer_lid]
    for device, lid, port in targets:
        for extra in ((), ("-x",)):
            argv = [*prefix, "perfquery", "-C", device, "-P", "1", *extra, str(lid), str(port)]
            run_tool(argv, timeout=10, env=env)
            calls += 1
    return calls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=9, help="counter passes (median)")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--record", default=None, help="write the tool calls' outputs here")
    args = ap.parse_args(argv)
    missing = missing_tools()
    if missing:
        print(f"bench_ibpeer: install ibsim-utils infiniband-diags opensm: {missing}")
        return 2
    tree = fat_tree(HOSTS, DEVICES, leaves=len(DEVICES), spines=SPINES, rails=True)
    with tempfile.TemporaryDirectory(prefix="fabricscope-bench-ibpeer-") as tmp:
        work = Path(tmp)
        lab = IbsimLab(work, tree.net)
        try:
            host = write_host(work / "dgx", "dgx", DEVICES)
            prefix = (str(host / "ibsim-wrap"),)
            env = {**os.environ, "IBSIM_SOCKNAME": lab.sockname}
            clock = Clock()
            sampler = IbPeerSampler(
                SysfsReader(str(host / "sys")),
                prefix=prefix,
                env=env,
                clock=clock,
                pass_budget=60.0,
                tool_timeout=10.0,
            )
            rows = [measure("first", sampler.sample)]
            for _ in range(len(DEVICES)):
                clock.now += 60
                rows.append(measure("table", sampler.sample))
            counters = []
            for _ in range(args.passes):
                clock.now += 60
                counters.append(measure("counters", sampler.sample))
            clock.now += 300
            topology = measure("topology", sampler.sample)
            last = sampler.sample()
            # the recording: what one pass of a new agent with --once asks, at every detail
            recorder = Recorder(len(prefix))
            for extended in (False, True):
                IbPeerSampler(
                    SysfsReader(str(host / "sys")),
                    prefix=prefix,
                    env=env,
                    pass_budget=120.0,
                    tool_timeout=10.0,
                    tables_per_pass=64,
                    spread=False,
                    extended=extended,
                    tool=recorder,
                ).sample()
            previous_runs = [
                measure(
                    "previous design: perfquery per port",
                    lambda: per_port_counters(last, prefix, env),
                )
                for _ in range(3)
            ]
        finally:
            lab.close()
    median = {
        k: statistics.median(float(r[k]) for r in counters)
        for k in ("tool_calls", "wall_seconds", "tools_cpu_seconds", "agent_cpu_seconds")
    }
    previous = {
        "pass": "previous design: perfquery per port (median of 3)",
        **{
            k: statistics.median(float(r[k]) for r in previous_runs)
            for k in ("tool_calls", "wall_seconds", "tools_cpu_seconds", "agent_cpu_seconds")
        },
    }
    rows += [{"pass": "counters (median)", **median}, topology, previous]
    tables = [r for r in rows if r["pass"] == "table"]
    hourly = {
        k: 60 * median[k]
        + 12 * float(topology[k])
        + float(rows[0][k])
        + sum(float(r[k]) for r in tables)
        for k in ("tool_calls", "tools_cpu_seconds", "agent_cpu_seconds")
    }
    print("| pass | tool processes | wall s | tools' CPU s | agent CPU s |")
    print("| --- | --- | --- | --- | --- |")
    for r in [rows[0], *tables[:1], rows[-3], topology, previous]:
        print(
            f"| {r['pass']} | {float(r['tool_calls']):g} | {float(r['wall_seconds']):.2f} | "
            f"{float(r['tools_cpu_seconds']):.3f} | {float(r['agent_cpu_seconds']):.4f} |"
        )
    watched = len(last.ports) + 2 * len(last.uplinks)
    print(
        f"watched: {len(last.ports)} local ports' far ends, {len(last.uplinks)} uplinks "
        f"(both ends): {watched} switch ports"
    )
    ratio = float(previous["tools_cpu_seconds"]) / max(median["tools_cpu_seconds"], 1e-9)
    print(
        f"counter read: {median['tool_calls']:g} processes against {previous['tool_calls']} "
        f"per port ({ratio:.1f}x the tools' CPU)"
    )
    print(
        f"per hour at the defaults (1m counters, 5m topology, tables once): "
        f"{hourly['tool_calls']:.0f} processes, {hourly['tools_cpu_seconds']:.1f} s of the "
        f"tools' CPU, {hourly['agent_cpu_seconds']:.2f} s of the agent's"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"rows": rows, "per_hour": hourly, "watched_ports": watched}, indent=2)
            + "\n"
        )
    if args.record:
        calls = [{"argv": list(k), "stdout": v} for k, v in sorted(recorder.calls.items())]
        Path(args.record).write_text(
            json.dumps(
                {
                    "recorded_by": "python bench/bench_ibpeer.py --record FILE",
                    "host": "dgx",
                    "devices": list(DEVICES),
                    "calls": calls,
                },
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
