"""Proof on a GPU machine: the agent names the rank NCCL's RAS says stopped answering.

Run by ``scripts/gpu_ras_verify.sh OUTDIR`` (read that file's header). Steps, each timed:

1. a real N-rank torchrun job (N = the GPU count, one rank per GPU): a loop of all_reduces
   that prints an llm.c-style step line with its step time;
2. the agent (``python3 -m exporter.cli agent`` on 127.0.0.1, samplers nvml, pci, workload
   and ras only), which finds the job by itself: NVML's compute processes, their environment
   (``RANK``), their network namespace, the job's RAS port on the host loopback;
3. the cost of a query: the agent's CPU per query (its own counter), and the job's side: the
   CPU of every rank's ``NCCL RAS`` thread per query and the job's step time while queried
   back to back, against a quiet window;
4. a short stop: rank N-1 SIGSTOPped until the series name it, then SIGCONT, and whether it
   is named responsive again (compared with RAS's own answer at that time);
5. a long stop of the same rank: seconds until the series name its rank, pid, NVML GPU and
   PCI bus id (checked against ``nvidia-smi``'s view of that pid), the alert expressions of
   deploy/rules/ras.rules.yaml evaluated on the agent's /metrics (no Prometheus there), RAS
   declaring it dead;
6. SIGCONT: the counts move again and the unresponsive alert's expression turns false.

Every RAS answer the script itself asks for is kept as received (``ras_answers.jsonl``, the
shape of tests/fixtures/ras/answers.jsonl) with the NCCL version and date. Writes only to
OUTDIR; prints a summary; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.ras.parse import parse_status  # noqa: E402
from agent.ras.wire import QueryError, query  # noqa: E402

JOB = r"""
import os, time, torch, torch.distributed as dist
rank = int(os.environ["RANK"])
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
x = torch.ones(4 << 20, device="cuda")
step, t = 0, time.time()
while not os.path.exists(os.environ["RAS_PROOF_END"]):
    for _ in range(10):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    step += 1
    if rank == 0 and step % 10 == 0:
        dt = (time.time() - t) / 10 * 1000
        t = time.time()
        tps = 4096 * 8 / dt * 1000
        print(f"step {step:6d}/1000000 | loss 1.000000 | {dt:.2f} ms | {tps:.0f} tok/s", flush=True)
    time.sleep(0.02)
dist.destroy_process_group()
"""
RAS_PORT = 28028
STEP_MS = re.compile(r"^step +(\d+)/\d+ \| loss [0-9.]+ \| ([0-9.]+) ms")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass
class Result:
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    figures: dict[str, object] = field(default_factory=dict)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append((name, ok, detail))
        log(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")
        return ok

    def note(self, name: str, value: object) -> None:
        self.figures[name] = value
        log(f"  {name} = {value}")


def wait_for(what: str, test: Callable[[], object], timeout: float, every: float = 0.5) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = test()
        if got:
            return got
        time.sleep(every)
    raise TimeoutError(f"{what}: not within {timeout:g}s")


# -- the machine -----------------------------------------------------------------------------


def gpu_count() -> int:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
    return out.count("GPU ")


def smi_bus_of_pid() -> dict[int, str]:
    """nvidia-smi's GPU bus id of every compute process, as sysfs writes it (0000:00:09.0)."""
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,gpu_bus_id", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = {}
    for line in out.splitlines():
        pid, _, bus = (p.strip() for p in line.partition(","))
        if pid.isdigit() and bus:
            domain, _, rest = bus.partition(":")
            found[int(pid)] = f"{domain[-4:]}:{rest}".lower()
    return found


def ras_listening() -> bool:
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(path).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[1].endswith(f":{RAS_PORT:04X}") and f[3] == "0A":
                return True
    return False


def rank_pids(script: Path) -> dict[int, int]:
    """RANK -> pid of the job's worker processes (their environ and command line)."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
            launcher = b"torchrun" in cmd or b"torch.distributed.run" in cmd
            if str(script).encode() not in cmd or launcher:
                continue
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for e in env:
            if e.startswith(b"RANK="):
                out[int(e[5:])] = int(d.name)
    return out


def ras_thread_cpu(pids: list[int]) -> float:
    """CPU seconds of every process's ``NCCL RAS`` thread together."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                if (task / "comm").read_text().strip() != "NCCL RAS":
                    continue
                stat = (task / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(stat[11]) + int(stat[12])
    return total / tick


def step_times(log_path: Path, since_step: int = 0) -> list[tuple[int, float]]:
    out = []
    for line in log_path.read_text(errors="replace").splitlines():
        m = STEP_MS.match(line)
        if m and int(m.group(1)) > since_step:
            out.append((int(m.group(1)), float(m.group(2))))
    return out


# -- RAS, asked directly (recorded as received) ------------------------------------------------


class Recorder:
    """Asks RAS itself (a new connection per query) and keeps every answer as received."""

    def __init__(self, path: Path, t0: float, meta: dict[str, object]) -> None:
        self.fh = path.open("w", buffering=1)
        self.t0 = t0
        self.meta = meta
        self.fh.write(json.dumps({"meta": meta}) + "\n")

    def ask(self, tag: str, cmds: list[str], timeout: float = 8.0) -> dict[str, object]:
        t = time.time()
        rec: dict[str, object] = {"tag": tag, "cmds": cmds, "t_rel": round(t - self.t0, 2)}
        data = b""
        try:
            with socket.create_connection(("127.0.0.1", RAS_PORT), timeout=5) as s:
                s.settimeout(timeout)
                f = s.makefile("rb")
                replies = []
                for c in cmds[:-1]:
                    s.sendall(c.encode() + b"\n")
                    replies.append(f.readline(256).decode(errors="replace"))
                rec["replies"] = replies
                s.sendall(cmds[-1].encode() + b"\n")
                while len(data) < 16 << 20:
                    chunk = f.read1(65536)
                    if not chunk:
                        break
                    data += chunk
        except OSError as exc:
            rec["error"] = str(exc)
        rec["seconds"] = round(time.time() - t, 3)
        rec["answer"] = data.decode(errors="replace")
        rec["bytes"] = len(data)
        self.fh.write(json.dumps(rec) + "\n")
        return rec

    def json_status(self, tag: str) -> dict[str, object]:
        return self.ask(tag, ["CLIENT PROTOCOL 2", "TIMEOUT 5", "SET FORMAT json", "STATUS"])

    def text_status(self, tag: str) -> dict[str, object]:
        return self.ask(tag, ["CLIENT PROTOCOL 2", "TIMEOUT 5", "STATUS"])


def ras_view(rec: dict[str, object]) -> dict[int, str] | None:
    """rank -> responsive/unresponsive/dead in one recorded JSON answer (None: no answer)."""
    if not rec.get("bytes"):
        return None
    try:
        answer = parse_status(str(rec["answer"]).encode())
    except ValueError:
        return None
    view: dict[int, str] = {}
    for c in answer.communicators:
        for r in c.ranks:
            view.setdefault(r.rank, "responsive")
        for m in c.missing:
            view[m.rank] = (
                "dead" if m.considered_dead else "unresponsive" if m.unresponsive else "responsive"
            )
    return view


# -- the agent's /metrics and the alert expressions ---------------------------------------------


Sample = tuple[str, dict[str, str], float]


class Agent:
    def __init__(self, port: int, scrapes: Path) -> None:
        self.port = port
        self.scrapes = scrapes.open("w")
        self.latencies: list[float] = []

    def scrape(self) -> list[Sample]:
        t0 = time.monotonic()
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
        self.latencies.append(time.monotonic() - t0)
        # the RAS and sampler series only: a GPU node's whole /metrics every second would
        # outgrow what a run may bring back
        kept = [
            ln
            for ln in text.splitlines()
            if ln.startswith("fabricscope_nccl_ras_")
            or (ln.startswith("fabricscope_sampler_") and 'sampler="ras"' in ln)
        ]
        self.scrapes.write(f"# scrape at {time.time():.3f}\n" + "\n".join(kept) + "\n")
        return [
            (s.name, dict(s.labels), s.value)
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if s.name.startswith("fabricscope_nccl_ras_")
            or s.name.startswith("fabricscope_sampler")
        ]


def pick(samples: list[Sample], name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    return [
        (lab, v)
        for n, lab, v in samples
        if n == name and all(lab.get(k) == want for k, want in labels.items())
    ]


def value(samples: list[Sample], name: str, **labels: str) -> float | None:
    got = pick(samples, name, **labels)
    return got[0][1] if got else None


def rank_unresponsive_expr(samples: list[Sample]) -> list[dict[str, str]]:
    """deploy/rules/ras.rules.yaml FabricscopeNcclRankUnresponsive's expression (one target)."""
    stalled = {
        lab.get("ras_endpoint")
        for lab, v in pick(samples, "fabricscope_nccl_ras_counts_unchanged_seconds")
        if v >= 60
    }
    return [
        lab
        for lab, _ in pick(samples, "fabricscope_nccl_ras_rank_info")
        if lab.get("state") in ("unresponsive", "dead") and lab.get("ras_endpoint") in stalled
    ]


def job_hung_expr(samples: list[Sample], threshold: float) -> bool:
    """FabricscopeNcclJobHung's expression with its 600 s threshold replaced by ``threshold``."""
    for lab, v in pick(samples, "fabricscope_nccl_ras_counts_unchanged_seconds"):
        ep = lab["ras_endpoint"]
        if v < threshold:
            continue
        diverge = (
            value(samples, "fabricscope_nccl_ras_mismatched_communicators", ras_endpoint=ep) or 0
        ) > 0
        missing = sum(
            v2
            for lab2, v2 in pick(samples, "fabricscope_nccl_ras_ranks", ras_endpoint=ep)
            if lab2.get("state") in ("unresponsive", "dead")
        )
        errors = sum(
            v2 for _, v2 in pick(samples, "fabricscope_nccl_ras_async_error_ranks", ras_endpoint=ep)
        )
        live = (
            value(samples, "fabricscope_nccl_ras_ranks", ras_endpoint=ep, state="responsive") or 0
        )
        if (diverge or missing > 0 or errors > 0) and live > 0:
            return True
    return False


def named(samples: list[Sample], rank: int) -> dict[str, str] | None:
    for lab, _ in pick(samples, "fabricscope_nccl_ras_rank_info", rank=str(rank)):
        if lab.get("state") in ("unresponsive", "dead"):
            return lab
    return None


# -- the run -----------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--ras-interval", type=float, default=10.0)
    args = ap.parse_args()
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    res = Result()
    t0 = time.time()
    n = gpu_count()
    import torch

    nccl = ".".join(map(str, torch.cuda.nccl.version()))
    meta = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpus": n,
        "torch": torch.__version__,
        "nccl": nccl,
        "gpu_name": torch.cuda.get_device_name(0),
    }
    log(f"{n} GPUs ({meta['gpu_name']}), torch {torch.__version__}, NCCL {nccl}")
    if not res.check("at least 2 GPUs", n >= 2, str(n)):
        return 1
    script = out / "ras_job.py"
    end = out / ".ras_job_end"
    end.unlink(missing_ok=True)
    script.write_text(JOB)
    job_log = out / "job.log"
    env = dict(
        os.environ,
        RAS_PROOF_END=str(end),
        NCCL_DEBUG="INFO",
        NCCL_DEBUG_SUBSYS="RAS",
        NCCL_NVLS_ENABLE="0",
        TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
        NVSHMEM_DISABLE_NVLS="1",
    )
    job = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={n}",
            str(script),
        ],
        env=env,
        stdout=job_log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    agent_proc: subprocess.Popen[bytes] | None = None
    ranks: dict[int, int] = {}
    end_written = False
    try:
        wait_for(
            "the job's first step line and its RAS port",
            lambda: ras_listening() and bool(step_times(job_log)),
            120,
        )
        ranks = rank_pids(script)
        res.check("every rank's process found", sorted(ranks) == list(range(n)), str(ranks))
        res.note("job start to first step, s", round(time.time() - t0, 1))
        rec = Recorder(out / "ras_answers.jsonl", t0, meta)
        rec.text_status("healthy-text-status")
        healthy = rec.json_status("healthy-json-status")
        view = ras_view(healthy)
        res.check(
            "RAS answers JSON with every rank responsive",
            view == dict.fromkeys(range(n), "responsive"),
            str(view),
        )

        # -- the agent -------------------------------------------------------------------------
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        agent_log = out / "agent.log"

        def start_agent(*extra: str) -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                [
                    *(sys.executable, "-m", "exporter.cli", "agent"),
                    f"--web.listen-address=127.0.0.1:{port}",
                    *("--no-sampler.infiniband", "--no-sampler.netdev"),
                    *("--no-sampler.attribution", "--no-sampler.throughput"),
                    *("--kubelet.pod-resources-socket=", "--log.level=info"),
                    *("--sampling.interval=5s", "--sampling.timeout=5s"),
                    f"--ras.interval={args.ras_interval:g}s",
                    f"--ras.timeout={args.ras_interval - 1:g}s",
                    *("--ras.gather-timeout=2", "--ras.lag-answers=3", *extra),
                ],
                cwd=ROOT,
                env=dict(
                    os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
                ),
                stdout=agent_log.open("a"),
                stderr=subprocess.STDOUT,
            )

        agent_proc = start_agent()
        agent = Agent(port, out / "scrapes.txt")
        t_agent = time.monotonic()

        def ready() -> list[Sample] | None:
            try:
                s = agent.scrape()
            except OSError:
                return None
            ok = value(s, "fabricscope_nccl_ras_ranks", state="responsive") == n
            return s if ok and value(s, "fabricscope_nccl_ras_up") == 1 else None

        found = "the agent found the job by itself (NVML, environ RANK=0, host loopback)"
        try:
            samples = wait_for("the agent's first RAS answer with every rank", ready, 90, 1.0)
        except TimeoutError as exc:
            # the rest of the proof does not depend on discovery: name the endpoint
            res.check(found, False, f"{exc}; continuing with --ras.endpoint")
            found = ""
            agent_proc.terminate()
            agent_proc.wait(10)
            agent_proc = start_agent(f"--ras.endpoint=127.0.0.1:{RAS_PORT}=ras-proof")
            samples = wait_for("the agent's first RAS answer (named endpoint)", ready, 60, 1.0)
        assert isinstance(samples, list)
        res.note(
            "agent start to its first full RAS answer, s", round(time.monotonic() - t_agent, 1)
        )
        eps = pick(samples, "fabricscope_nccl_ras_endpoint_processes", state="queried")
        if found:
            res.check(
                found,
                len(eps) == 1
                and eps[0][1] == n
                and eps[0][0]["ras_endpoint"] == f"127.0.0.1:{RAS_PORT}",
                str(eps),
            )
        res.note(
            "NCCL version the agent reports",
            [lab["version"] for lab, _ in pick(samples, "fabricscope_nccl_ras_info")],
        )

        # -- cost ------------------------------------------------------------------------------
        pids = [ranks[r] for r in sorted(ranks)]
        quiet_from = step_times(job_log)[-1][0]
        cpu0 = ras_thread_cpu(pids)
        time.sleep(15)
        cpu_quiet = ras_thread_cpu(pids) - cpu0
        quiet = [ms for _, ms in step_times(job_log, quiet_from)]
        busy_from = step_times(job_log)[-1][0]
        cpu1 = ras_thread_cpu(pids)
        # 20 queries a second for 15 s: 600 times the default rate (one per 30 s)
        k, tq, failed_q, deadline = 0, [], 0, time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                a = query("127.0.0.1", RAS_PORT, deadline_seconds=10, max_bytes=16 << 20)
            except QueryError:
                failed_q += 1
                continue
            tq.append(a.seconds)
            k += 1
            time.sleep(max(0.0, 0.05 - a.seconds))
        cpu_busy = ras_thread_cpu(pids) - cpu1
        busy = [ms for _, ms in step_times(job_log, busy_from)]
        res.note("STATUS queries in 15 s (20/s) answered / failed", (k, failed_q))
        res.note(
            "query wall time median / max, ms",
            (round(statistics.median(tq) * 1000, 2), round(max(tq) * 1000, 2)),
        )
        res.note(
            "job's RAS threads CPU per STATUS (all ranks), ms",
            round((cpu_busy - cpu_quiet) / k * 1000, 3) if k else None,
        )
        res.note("job's RAS threads CPU, 15 s quiet, ms", round(cpu_quiet * 1000, 1))
        if quiet and busy:
            res.note(
                "job step time (10 all_reduces of 16 MiB) quiet / queried 20/s, ms (median)",
                (statistics.median(quiet), statistics.median(busy)),
            )
        samples = agent.scrape()
        q = value(samples, "fabricscope_nccl_ras_queries_total") or 0
        cpu = value(samples, "fabricscope_nccl_ras_query_cpu_seconds_total") or 0
        res.note(
            "agent CPU per RAS query (its own counter), ms", round(cpu / q * 1000, 3) if q else None
        )

        victim = n - 1
        vpid = ranks[victim]
        bus = smi_bus_of_pid().get(vpid, "")
        res.note("victim", {"rank": victim, "pid": vpid, "nvidia-smi bus id": bus})

        # -- a short stop ----------------------------------------------------------------------
        os.kill(vpid, signal.SIGSTOP)
        t_stop = time.monotonic()
        wait_for("the short stop named", lambda: named(agent.scrape(), victim), 60, 1.0)
        res.note(
            "short stop: SIGSTOP to the series naming the rank, s",
            round(time.monotonic() - t_stop, 1),
        )
        os.kill(vpid, signal.SIGCONT)
        t_cont = time.monotonic()

        def unnamed() -> bool:
            return named(agent.scrape(), victim) is None

        try:
            wait_for("the resumed rank no longer named", unnamed, 60, 1.0)
            res.check(
                "short stop: after SIGCONT the rank is no longer named",
                True,
                f"{time.monotonic() - t_cont:.1f}s",
            )
        except TimeoutError:
            mine = ras_view(rec.json_status("short-resumed-json-status"))
            still = mine is not None and mine.get(victim) != "responsive"
            res.check(
                "short stop: after SIGCONT the series follow RAS's own answer",
                still,
                f"RAS itself says {mine}",
            )
        rec.json_status("short-resumed-json-status")

        # -- the long stop ---------------------------------------------------------------------
        time.sleep(args.ras_interval)  # a pass with every rank moving again
        os.kill(vpid, signal.SIGSTOP)
        t_stop = time.monotonic()
        lab = wait_for("the long stop named", lambda: named(agent.scrape(), victim), 60, 1.0)
        assert isinstance(lab, dict)
        took = time.monotonic() - t_stop
        res.note("long stop: SIGSTOP to the series naming the rank, s", round(took, 1))
        res.check(
            "the series name the rank's pid, NVML GPU and PCI bus id",
            lab.get("pid") == str(vpid)
            and lab.get("pci_bus_id") == bus
            and lab.get("gpu", "") != "",
            json.dumps(lab),
        )
        res.check(
            "... within RAS's time plus two passes",
            took <= 2 * args.ras_interval + 10,
            f"{took:.1f}s",
        )
        rec.json_status("stopped-json-status")
        rec.text_status("stopped-text-status")
        hit = wait_for(
            "FabricscopeNcclRankUnresponsive's expression",
            lambda: rank_unresponsive_expr(agent.scrape()),
            120,
            2.0,
        )
        res.check(
            "FabricscopeNcclRankUnresponsive's expression is true on /metrics",
            bool(hit),
            f"{time.monotonic() - t_stop:.0f}s after SIGSTOP: {hit}",
        )
        samples = agent.scrape()
        res.check(
            "FabricscopeNcclJobHung's expression (threshold 60s, not 600s) is true",
            job_hung_expr(samples, 60.0),
        )
        try:
            wait_for(
                "RAS declaring it dead",
                lambda: (named(agent.scrape(), victim) or {}).get("state") == "dead",
                60,
                2.0,
            )
            res.note(
                "long stop: SIGSTOP to the series saying dead, s",
                round(time.monotonic() - t_stop, 1),
            )
        except TimeoutError:
            res.note("long stop: dead", "not within 60 s more")
        rec.json_status("stopped-dead-json-status")

        # -- resume ----------------------------------------------------------------------------
        os.kill(vpid, signal.SIGCONT)
        t_cont = time.monotonic()

        def moving() -> bool:
            s = agent.scrape()
            u = value(s, "fabricscope_nccl_ras_counts_unchanged_seconds")
            return u is not None and u < args.ras_interval and not rank_unresponsive_expr(s)

        try:
            wait_for("the counts moving again", moving, 60, 1.0)
            res.check(
                "after SIGCONT the counts move and the alert's expression is false",
                True,
                f"{time.monotonic() - t_cont:.1f}s",
            )
        except TimeoutError:
            res.check("after SIGCONT the counts move and the alert's expression is false", False)
        rec.json_status("resumed-json-status")
        samples = agent.scrape()
        res.note("after resume, the rank as the series name it", named(samples, victim))
        for reason in ("hung", "crashed", "timeout", "exception"):
            v = value(samples, "fabricscope_sampler_errors_total", sampler="ras", reason=reason)
            res.check(f"the ras sampler had no {reason} pass", v == 0, str(v))
        res.note("scrape latency max, ms", round(max(agent.latencies) * 1000, 1))
        res.check("every scrape under 250 ms", max(agent.latencies) < 0.25)
    except TimeoutError as exc:
        res.check("the run went through", False, str(exc))
    finally:
        for pid in ranks.values():
            with contextlib.suppress(OSError):  # a process already gone
                os.kill(pid, signal.SIGCONT)
        end.write_text("1")
        end_written = True
        if agent_proc is not None:
            agent_proc.terminate()
            try:
                agent_proc.wait(10)
            except subprocess.TimeoutExpired:
                agent_proc.kill()
        try:
            job.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    if end_written:
        end.unlink(missing_ok=True)
    failed = [c for c in res.checks if not c[1]]
    summary = {
        "meta": meta,
        "seconds": round(time.time() - t0, 1),
        "checks": [{"check": c, "ok": ok, "detail": d} for c, ok, d in res.checks],
        "figures": res.figures,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print("\n=== summary")
    for c, ok, d in res.checks:
        print(f"{'PASS' if ok else 'FAIL'}  {c}" + (f"  ({d})" if d and not ok else ""))
    for k2, v in res.figures.items():
        print(f"      {k2}: {v}")
    print(
        f"{len(res.checks) - len(failed)}/{len(res.checks)} checks passed in {summary['seconds']} s"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
