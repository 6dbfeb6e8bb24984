"""GPU soak: several agents side by side for a long while at a fast interval, scraped every
second, under glibc's strictest heap checks (``MALLOC_CHECK_=3``) and faulthandler: do the
serving processes survive, do NVML children crash, does memory stay flat (issue 13).

    python bench/gpu_soak.py --out $OUT/soak                   # 3 agents, 660 s
    python bench/gpu_soak.py --out $OUT/soak --duration 60     # a quick smoke run
    setsid python bench/gpu_soak.py --out $OUT/soak > $OUT/soak.log 2>&1 < /dev/null &

Half the agents (0, 2, ...) read every NVLink error counter every pass (rotations 1/1), the
others run the defaults (18/72). The default-rotation agents run ``--sampling.interval`` =
``--sampling.timeout`` = ``--interval`` (0.2 s); the rotation-1/1 agents ``--full-interval``
(5 s), because such a pass is slow, not broken: on a lent 4x H100 a rotation-1/1 pass took
206 ms (median; 259 ms at p95) by ``bench/bench_isolation.py --live --link-error-rotation 1
--slow-error-rotation 1``, just over 0.2 s, so at 0.2 s most passes overran their timeout
and the child was killed as hung: the restarts of the first 4-GPU soak (29 hung passes, no
crash counted). A default-rotation pass (16 ms median there) can still overrun 0.2 s while
another program drives NVML hard beside it (1 of 2,985 passes did, during
``scripts/gpu_verify.sh``'s own NVML recording); the agent's defaults give it 10 s. netdev,
workload and attribution are off. ``--in-process`` adds ``--no-nvml.isolate`` (NVML inside
the serving process).

Written to ``--out`` while it runs: ``progress.json`` (every 10 s), each agent's log
(``agent-N.log``); at the end ``summary.json``, also printed as a table. Per agent: passes
(``fabricscope_sampler_attempts_total{sampler="nvml"}``) and successful ones, NVML errors by
reason, child restarts, "crashed"/"hung" lines and faulthandler reports in its log, RSS of
the agent and of its NVML child at the start (after 10 s) and at the end, scrapes failed,
and whether the serving process died (or exited non-zero on SIGTERM at the end). Exits 1 if
any serving process died, 2 if no agent ever completed an NVML pass with a GPU, 3 if any NVML
child was restarted (a crash or an overrun: the agent survives them, but a healthy GPU node
must cause none); otherwise 0.
Needs only the repository and a GPU machine's Python (any GPU count).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: glibc's heap-check verdicts: "free(): corrupted unsorted chunks", "malloc(): invalid size"
MALLOC_ERROR = re.compile(r"(?:malloc|free|tcache)[^\n]*(?:corrupt|invalid|unaligned)")
SERIES = re.compile(r"^(fabricscope_sampler_[a-z_]+)\{([^}]*)\} (\S+)$", re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def rss_mib(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def children(pid: int) -> list[int]:
    out: list[int] = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return sorted(out)


def nvml_values(body: str) -> dict[str, float]:
    """The nvml sampler's self metrics: attempts, success, hardware, errors by reason."""
    out: dict[str, float] = {}
    for name, labels, value in SERIES.findall(body):
        if 'sampler="nvml"' not in labels:
            continue
        reason = re.search(r'reason="([^"]+)"', labels)
        key = name.removeprefix("fabricscope_sampler_") + (f":{reason.group(1)}" if reason else "")
        out[key] = float(value)
    return out


@dataclass
class AgentRun:
    index: int
    port: int
    rotations: tuple[int, int]
    log: str
    proc: subprocess.Popen[bytes] | None = None
    pid: int = 0
    scrapes: int = 0
    scrapes_failed: int = 0
    nvml_ok_seen: bool = False
    died_at_s: float | None = None
    exit_code: int | None = None
    last: dict[str, float] = field(default_factory=dict)
    rss_agent_start: float | None = None
    rss_agent_end: float | None = None
    rss_child_start: float | None = None
    rss_child_end: float | None = None
    child_pids_seen: list[int] = field(default_factory=list)

    def child_rss(self) -> float | None:
        kids = children(self.pid)
        for kid in kids:
            if kid not in self.child_pids_seen:
                self.child_pids_seen.append(kid)
        return rss_mib(kids[0]) if kids else None

    def log_counts(self) -> dict[str, int]:
        text = Path(self.log).read_text(errors="replace")
        return {
            "crashed_lines": text.count("sampler nvml crashed"),
            "hung_lines": text.count("sampler nvml hung"),
            "fatal_python_errors": text.count("Fatal Python error"),
            "malloc_errors": len(
                re.findall(r"(?:malloc|free|tcache)[^\n]*(?:corrupt|invalid)", text)
            ),
        }

    def row(self) -> dict[str, object]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "proc"}
        d["passes"] = self.last.get("attempts_total", 0)
        d["nvml_errors"] = {k.split(":")[1]: v for k, v in self.last.items() if ":" in k and v}
        d["child_restarts"] = self.last.get("child_restarts_total")
        d.update(self.log_counts())
        return d


def start(run: AgentRun, interval: float, in_process: bool, full_interval: float = 5.0) -> None:
    if run.rotations == (1, 1):
        interval = full_interval
    args = [
        sys.executable,
        "-X",
        "faulthandler",
        "-m",
        "exporter.cli",
        "agent",
        f"--web.listen-address=127.0.0.1:{run.port}",
        "--no-sampler.netdev",
        "--no-sampler.workload",
        "--no-sampler.attribution",
        f"--sampling.interval={interval}",
        f"--sampling.timeout={interval}",
        f"--nvml.link-error-rotation={run.rotations[0]}",
        f"--nvml.slow-error-rotation={run.rotations[1]}",
    ]
    if in_process:
        args.append("--no-nvml.isolate")
    env = dict(os.environ, MALLOC_CHECK_="3", PYTHONUNBUFFERED="1")
    with open(run.log, "wb") as log:
        run.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    run.pid = run.proc.pid


def scrape(run: AgentRun) -> None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{run.port}/metrics", timeout=5) as r:
            body = r.read().decode()
    except (OSError, urllib.error.URLError):
        run.scrapes_failed += 1
        return
    run.scrapes += 1
    run.last = nvml_values(body)
    if run.last.get("hardware_present") == 1:
        run.nvml_ok_seen = True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=3)
    ap.add_argument("--duration", type=float, default=660.0, help="seconds (default 660)")
    ap.add_argument("--interval", type=float, default=0.2, help="sampling interval/timeout")
    ap.add_argument(
        "--full-interval",
        type=float,
        default=5.0,
        help="sampling interval/timeout of the agents reading every counter every pass",
    )
    ap.add_argument("--in-process", action="store_true", help="--no-nvml.isolate (the issue's)")
    ap.add_argument("--out", required=True, metavar="DIR")
    ns = ap.parse_args()
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = [
        AgentRun(i, free_port(), (1, 1) if i % 2 == 0 else (18, 72), str(out / f"agent-{i}.log"))
        for i in range(ns.agents)
    ]
    for run in runs:
        start(run, ns.interval, ns.in_process, ns.full_interval)
    t0 = time.monotonic()
    next_progress = t0 + 10
    rss_taken = False

    def summary(final: bool) -> dict[str, object]:
        return {
            "final": final,
            "elapsed_s": round(time.monotonic() - t0, 1),
            "duration_s": ns.duration,
            "interval_s": ns.interval,
            "full_interval_s": ns.full_interval,
            "isolated": not ns.in_process,
            "malloc_check": "3",
            "argv": sys.argv,
            "serving_crashes": sum(1 for r in runs if r.died_at_s is not None),
            "agents": [r.row() for r in runs],
        }

    try:
        while (elapsed := time.monotonic() - t0) < ns.duration:
            tick = time.monotonic()
            for run in runs:
                assert run.proc is not None
                if run.died_at_s is None and run.proc.poll() is not None:
                    run.died_at_s = round(elapsed, 1)
                    run.exit_code = run.proc.returncode
                    print(f"agent {run.index} DIED at {elapsed:.1f}s: {run.exit_code}", flush=True)
                if run.died_at_s is None:
                    scrape(run)
            if not rss_taken and elapsed >= 10:
                for run in runs:
                    run.rss_agent_start = rss_mib(run.pid)
                    run.rss_child_start = run.child_rss()
                rss_taken = True
            if time.monotonic() >= next_progress:
                next_progress += 10
                for run in runs:
                    if run.died_at_s is None:
                        run.child_rss()  # notes child pids (restarts show as new ones)
                (out / "progress.json").write_text(json.dumps(summary(False), indent=1))
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
        for run in runs:
            if run.died_at_s is None:
                run.rss_agent_end = rss_mib(run.pid)
                run.rss_child_end = run.child_rss()
    finally:
        for run in runs:
            if run.proc is not None and run.proc.poll() is None:
                run.proc.send_signal(signal.SIGTERM)
        for run in runs:
            if run.proc is None:
                continue
            try:
                code = run.proc.wait(15)
            except subprocess.TimeoutExpired:
                run.proc.kill()
                code = run.proc.wait()
            if run.died_at_s is None:
                run.exit_code = code
                if code != 0:  # a crash on the way out is a crash of the serving process
                    run.died_at_s = round(time.monotonic() - t0, 1)
    result = summary(True)
    (out / "summary.json").write_text(json.dumps(result, indent=1))
    print(
        f"{'agent':>5} {'rot':>6} {'passes':>7} {'errors':>28} {'restarts':>8} "
        f"{'agent RSS MiB':>14} {'child RSS MiB':>14} {'died':>6}"
    )
    for row in result["agents"]:  # type: ignore[attr-defined]
        rot = "/".join(map(str, row["rotations"]))
        errs = ",".join(f"{k}={int(v)}" for k, v in row["nvml_errors"].items()) or "-"
        print(
            f"{row['index']:>5} {rot:>6} {int(row['passes']):>7} {errs:>28} "
            f"{row['child_restarts'] if row['child_restarts'] is not None else '-':>8} "
            f"{row['rss_agent_start']}->{row['rss_agent_end']:>6} "
            f"{row['rss_child_start']}->{row['rss_child_end']:>6} "
            f"{row['died_at_s'] if row['died_at_s'] is not None else 'no':>6}"
        )
    print(f"serving-process crashes: {result['serving_crashes']}; summary: {out / 'summary.json'}")
    if result["serving_crashes"]:
        return 1
    if not any(r.nvml_ok_seen for r in runs):
        print("no agent ever completed an NVML pass with a GPU", file=sys.stderr)
        return 2
    restarts = sum(int(r.last.get("child_restarts_total") or 0) for r in runs)
    if restarts:
        print(f"NVML children restarted {restarts} time(s)", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
