"""Each supervised child's memory ceiling, and the worst case measured against it: what the
kernel holds each child to (``RLIMIT_DATA``, its share of ``--agent.memory-limit``,
agent/core/ceiling.py) under the chart's limit, and how much memory the worst input built
for that child made it hold. The figures of docs/install.md#security.

One real agent per child, every other sampler off, ``--agent.memory-limit`` at the chart's
limit; every 0.1 s the child's peak resident memory (``VmHWM``) and its memory as the kernel
counts it against the ceiling (``VmData``) are read from /proc, for ``--seconds`` seconds:

- ``nvml``: the stand-in ``libnvidia-ml.so.1`` (tests/nvml_standin, built with gcc) loaded by
  the real pynvml; first healthy, then leaking 64 MiB a pass in 8 MiB blocks (written, kept)
  up to 400 MiB: the child is ended at its ceiling and replaced (``ended`` counts them);
- ``throughput``: a log (``--throughput.file``) written with one 48 MiB line, the
  60,000-digit line, and megabytes of 16 KiB lines of digits, while a good line is appended
  every 0.1 s;
- ``ibpeer``: an ibpeer tool that prints 200 MB and tries to allocate 400 MiB (the tools
  inherit the child's ceiling);
- ``ras``: 16 jobs at once (the most asked in a pass) answering as much as the RAS child
  reads under the limit (``--ras.max-answer-bytes`` brought down to what its share decodes):
  one the worst answer that prices under the decode budget (``1.5,   `` repeated: decoded),
  the others ``{},`` (refused before decoding; their reads share one byte budget).

    PYTHONPATH=$PWD .venv/bin/python bench/bench_ceilings.py [--seconds 20] [--json FILE]

The result (``--json``, default bench/results/ceilings.json) names the machine and the date.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.config import DEFAULT_OFF, SAMPLER_NAMES  # noqa: E402
from agent.core.ceiling import child_ceiling  # noqa: E402
from agent.ras.sampler import CEILING_PER_ANSWER_BYTE, answer_cap  # noqa: E402
from tests.procwatch import children, data_limit, status_bytes  # noqa: E402
from tests.promharness import free_port  # noqa: E402
from tests.ras.rasagent import value  # noqa: E402

MIB = 1 << 20


def chart_limit() -> int:
    """The chart's memory limit (deploy/helm/fabricscope/values.yaml), in bytes."""
    text = (ROOT / "deploy" / "helm" / "fabricscope" / "values.yaml").read_text()
    quantity = str(yaml.safe_load(text)["resources"]["limits"]["memory"])
    return int(quantity[:-2]) * {"Mi": MIB, "Gi": 1 << 30}[quantity[-2:]]


#: the chart's memory limit
POD_LIMIT = chart_limit()
#: --ras.max-answer-bytes (its default), and the answers the RAS child decodes under the limit
RAS_FLAG = 16 * MIB
RAS_CAP = answer_cap(RAS_FLAG, POD_LIMIT)


def others(keep: str) -> list[str]:
    return [f"--no-sampler.{n}" for n in SAMPLER_NAMES if n != keep and n not in DEFAULT_OFF]


def scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return str(r.read().decode())
    except OSError:
        return ""


def counter(body: str, series: str) -> float:
    for line in body.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class Watch:
    """The peaks of an agent's children over a run."""

    def __init__(self, agent: subprocess.Popen[bytes]) -> None:
        self.agent = agent
        self.rss = 0
        self.data = 0
        self.limits: set[int] = set()

    def poll_for(self, seconds: float, every: float = 0.1) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self.agent.poll() is not None:
                raise RuntimeError(f"the agent exited ({self.agent.returncode})")
            for pid in children(self.agent.pid):
                self.rss = max(self.rss, status_bytes(pid, "VmHWM"))
                self.data = max(self.data, status_bytes(pid, "VmData"))
                limit = data_limit(pid)
                if limit is not None:
                    self.limits.add(limit)
            time.sleep(every)


def run_agent(
    args: Sequence[str],
    env: dict[str, str],
    log: Path,
    during: Callable[[Watch, int], None],
    pod_limit: int = POD_LIMIT,
) -> tuple[Watch, str]:
    port = free_port()
    with log.open("wb") as out:
        agent = subprocess.Popen(
            [
                *(sys.executable, "-m", "exporter.cli", "agent"),
                f"--web.listen-address=127.0.0.1:{port}",
                f"--agent.memory-limit={pod_limit}",
                *args,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**env, "PYTHONUNBUFFERED": "1"},
            cwd=ROOT,
        )
    watch = Watch(agent)
    try:
        deadline = time.monotonic() + 60
        while not scrape(port):
            if time.monotonic() > deadline or agent.poll() is not None:
                raise RuntimeError(log.read_text()[-2000:])
            time.sleep(0.2)
        during(watch, port)
        return watch, scrape(port)
    finally:
        agent.terminate()
        try:
            agent.wait(15)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()


def row(
    child: str, worst: str, watch: Watch, ceiling: int, body: str, **extra: object
) -> dict[str, object]:
    ended = counter(
        body, f'fabricscope_sampler_errors_total{{reason="memory_ceiling",sampler="{child}"}}'
    )
    return {
        "child": child,
        "worst": worst,
        "ceiling_mib": round(ceiling / MIB, 1),
        "held_to_ceiling": watch.limits == {ceiling},
        "peak_rss_mib": round(watch.rss / MIB, 1),
        "peak_counted_mib": round(watch.data / MIB, 1),
        "ended_at_ceiling": int(ended),
        **extra,
    }


def bench_nvml(tmp: Path, seconds: float) -> list[dict[str, object]]:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise SystemExit("gcc is needed to build the stand-in NVML library")
    lib = tmp / "libnvidia-ml.so.1"
    source = ROOT / "tests" / "nvml_standin" / "libnvidia-ml.c"
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(lib), str(source)], check=True)
    trigger = tmp / "trigger"
    trigger.write_text("")
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp), FABRICSCOPE_STANDIN_TRIGGER=str(trigger))
    sysfs = ROOT / "tests" / "fixtures" / "dgx-h100" / "sys"
    ceiling = child_ceiling("nvml", POD_LIMIT)
    rows = []
    for word, worst in (
        ("", "healthy (one GPU)"),
        ("leak", "a library leaking 64 MiB a pass in 8 MiB blocks"),
    ):
        trigger.write_text(word)
        watch, body = run_agent(
            [f"--path.sysfs={sysfs}", *others("nvml"), "--sampling.interval=1"],
            env,
            tmp / f"nvml-{word or 'ok'}.log",
            lambda w, _: w.poll_for(seconds),
        )
        rows.append(row("nvml", worst, watch, ceiling, body))
    return rows


WRITER = r"""
import sys, time
log = sys.argv[1]
with open(log, "a") as f:
    f.write("iter 1: loss x, time " + "9" * (48 << 20) + "\n")  # one line of 48 MiB
    f.write("iter 1: loss x, time " + "1" * 60_000 + "\n")
    f.write(("iter 1: loss x, time " + "7" * 16_000 + "\n") * 64 * 16)  # 16 MiB
    f.flush()
    n = 0
    while True:
        n += 1
        f.write(f"\t Train throughput/tokens_per_sec: {n}.5\n")
        f.flush()
        time.sleep(0.1)
"""


def bench_throughput(tmp: Path, seconds: float) -> dict[str, object]:
    log = tmp / "train.log"
    log.write_text("")
    writer = None

    def during(watch: Watch, _: int) -> None:
        nonlocal writer
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(log)])
        watch.poll_for(seconds)

    try:
        watch, body = run_agent(
            [
                f"--throughput.file={log}=llm",
                f"--path.pod-logs={tmp / 'no-pods'}",
                *others("throughput"),
                "--sampling.interval=1",
            ],
            dict(os.environ),
            tmp / "throughput.log",
            during,
        )
    finally:
        if writer is not None:
            writer.kill()
            writer.wait()
    return row(
        "throughput",
        "a 48 MiB line, the 60,000-digit line, 16 MiB of 16 KiB lines of digits",
        watch,
        child_ceiling("throughput", POD_LIMIT),
        body,
    )


GREEDY = """#!/bin/sh
{python} -c 'b = bytearray(400 << 20)' 2>/dev/null && echo took >> {notes}
head -c 200000000 /dev/zero | tr '\\0' 7
"""


def bench_ibpeer(tmp: Path, seconds: float) -> dict[str, object]:
    port_dir = tmp / "sys/class/infiniband/mlx5_0/ports/1"
    port_dir.mkdir(parents=True)
    (port_dir / "link_layer").write_text("InfiniBand\n")
    (port_dir / "state").write_text("4: ACTIVE\n")
    (port_dir / "phys_state").write_text("5: LinkUp\n")
    notes = tmp / "notes"
    wrapper = tmp / "diags"
    wrapper.write_text(GREEDY.format(python=sys.executable, notes=notes))
    wrapper.chmod(0o755)
    watch, body = run_agent(
        [
            "--sampler.ibpeer",
            f"--path.sysfs={tmp / 'sys'}",
            f"--ibpeer.command-prefix={wrapper}",
            *others("ibpeer"),
            "--sampling.interval=1",
            "--ibpeer.interval=1",
        ],
        dict(os.environ),
        tmp / "ibpeer.log",
        lambda w, _: w.poll_for(seconds),
    )
    return row(
        "ibpeer",
        "a tool printing 200 MB and allocating 400 MiB",
        watch,
        child_ceiling("ibpeer", POD_LIMIT),
        body,
        tool_allocation_refused=not notes.exists(),
    )


#: 16 RAS jobs (argv: the repository, the answer size, ``healthy`` to make one of them a
#: healthy job): one answering floats, the rest objects, each padded to the answer size
SERVERS = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from tests.ras_standin import RasStandIn, job
cap, healthy = int(sys.argv[2]), sys.argv[3] == "healthy"
head = (b'{"nccl_version": "2.28.9", "communicators": [], '
        b'"ras": {"collection_time_sec": 0.1, "timeouts_count": 0}, "x": [')
def padded(filler):
    return head + filler * ((cap - 4096 - len(head)) // len(filler)) + b"0]}"
servers = {"good": RasStandIn([job(4, 100), job(4, 101), job(4, 102)])} if healthy else {}
servers["floats"] = RasStandIn([padded(b"1.5,   ")])
for i in range(15 - healthy):
    servers[f"objects{i}"] = RasStandIn([padded(b"{},")])
print(json.dumps({n: s.port for n, s in servers.items()}), flush=True)
sys.stdin.read()
"""


def bench_ras(tmp: Path, seconds: float) -> dict[str, object]:
    servers = subprocess.Popen(
        [sys.executable, "-c", SERVERS, str(ROOT), str(RAS_CAP), "all-padded"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert servers.stdout is not None and servers.stdin is not None
    try:
        ports = json.loads(servers.stdout.readline())
        watch, body = run_agent(
            [
                *others("ras"),
                f"--path.procfs={tmp}",
                *(f"--ras.endpoint=127.0.0.1:{p}={name}" for name, p in ports.items()),
                *("--ras.interval=2s", "--ras.timeout=1500ms", "--ras.gather-timeout=1"),
                f"--ras.max-answer-bytes={RAS_FLAG}",
            ],
            dict(os.environ),
            tmp / "ras.log",
            lambda w, _: w.poll_for(seconds),
        )
    finally:
        servers.stdin.close()
        servers.wait(10)
    answered = value(body, "fabricscope_nccl_ras_up", "floats")
    return row(
        "ras",
        f"16 jobs answering {RAS_CAP / MIB:.1f} MiB at once: the worst answer decoded, 15 refused",
        watch,
        child_ceiling("ras", POD_LIMIT, extra=CEILING_PER_ANSWER_BYTE * RAS_CAP),
        body,
        worst_answer_decoded=answered == 1,
    )


def tree(pid: int) -> list[int]:
    """Process ``pid`` and all its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children(p)
    return out


def run_together(tmp: Path, seconds: float, pod_limit: int = POD_LIMIT) -> dict[str, object]:
    """Every child attacked at once in one agent under ``pod_limit``: the NVML library leaking
    until its child is ended at its ceiling, the throughput log of huge lines, the ibpeer tool
    allocating 400 MiB, 15 RAS jobs answering the largest answers read (the worst decoded)
    beside a healthy 4-rank job. Every 0.1 s the resident memory of the agent's whole process
    tree is summed (an upper bound of what its memory cgroup is charged for it: shared pages
    counted once per process); from the healthy job's first answer, its series are read in a
    scrape every second for ``seconds``."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise SystemExit("gcc is needed to build the stand-in NVML library")
    lib = tmp / "libnvidia-ml.so.1"
    source = ROOT / "tests" / "nvml_standin" / "libnvidia-ml.c"
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(lib), str(source)], check=True)
    trigger = tmp / "trigger"
    trigger.write_text("leak")
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp), FABRICSCOPE_STANDIN_TRIGGER=str(trigger))
    env = {k: v for k, v in env.items() if "proxy" not in k.lower()}
    notes = tmp / "notes"
    wrapper = tmp / "diags"
    wrapper.write_text(GREEDY.format(python=sys.executable, notes=notes))
    wrapper.chmod(0o755)
    log = tmp / "train.log"
    log.write_text("")
    cap = answer_cap(RAS_FLAG, pod_limit)
    servers = subprocess.Popen(
        [sys.executable, "-c", SERVERS, str(ROOT), str(cap), "healthy"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert servers.stdout is not None and servers.stdin is not None
    writer = None
    peak_sum = 0
    scrapes = healthy = 0

    def during(watch: Watch, port: int) -> None:
        nonlocal writer, peak_sum, scrapes, healthy
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(log)])

        def measure() -> None:
            nonlocal peak_sum
            watch.poll_for(0.1, every=0.1)
            peak_sum = max(peak_sum, sum(status_bytes(p, "VmRSS") for p in tree(watch.agent.pid)))

        # the attack runs from the start; the healthy job is counted from its first answer
        deadline = time.monotonic() + 60
        while value(scrape(port), "fabricscope_nccl_ras_up", "good") != 1:
            if time.monotonic() > deadline:
                raise RuntimeError("the healthy RAS job was never answered")
            measure()
        end = time.monotonic() + seconds
        next_scrape = time.monotonic()
        while time.monotonic() < end:
            measure()
            if time.monotonic() >= next_scrape:
                next_scrape += 1
                scrapes += 1
                healthy += value(scrape(port), "fabricscope_nccl_ras_up", "good") == 1

    try:
        ports = json.loads(servers.stdout.readline())
        sysfs = ROOT / "tests" / "fixtures" / "dgx-h100" / "sys"
        keep = ("nvml", "throughput", "ibpeer", "ras")
        _, body = run_agent(
            [
                f"--path.sysfs={sysfs}",
                f"--path.procfs={tmp}",
                *(f"--no-sampler.{n}" for n in SAMPLER_NAMES if n not in keep),
                "--sampler.ibpeer",
                f"--ibpeer.command-prefix={wrapper}",
                "--ibpeer.interval=1",
                f"--throughput.file={log}=llm",
                f"--path.pod-logs={tmp / 'no-pods'}",
                *(f"--ras.endpoint=127.0.0.1:{p}={name}" for name, p in ports.items()),
                *("--ras.interval=2s", "--ras.timeout=1500ms", "--ras.gather-timeout=1"),
                f"--ras.max-answer-bytes={RAS_FLAG}",
                "--sampling.interval=1",
            ],
            env,
            tmp / "together.log",
            during,
            pod_limit,
        )
    finally:
        servers.stdin.close()
        servers.wait(10)
        if writer is not None:
            writer.kill()
            writer.wait()
    ended = {
        child: int(
            counter(
                body,
                f'fabricscope_sampler_errors_total{{reason="memory_ceiling",sampler="{child}"}}',
            )
        )
        for child in keep
    }
    return {
        "child": "all at once",
        "worst": "each child's worst case above at the same time, beside a healthy RAS job",
        "pod_limit_mib": pod_limit // MIB,
        "peak_tree_rss_mib": round(peak_sum / MIB, 1),
        "ended_at_ceiling": ended,
        "scrapes": scrapes,
        "healthy_job_in_scrapes": healthy,
        "tool_allocation_refused": not notes.exists(),
    }


def bench_together(tmp: Path, seconds: float) -> dict[str, object]:
    return run_together(tmp, seconds)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="per child")
    ap.add_argument("--json", default=str(ROOT / "bench" / "results" / "ceilings.json"))
    args = ap.parse_args(argv)
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as d:
        for name, fn in (
            ("nvml", bench_nvml),
            ("throughput", bench_throughput),
            ("ibpeer", bench_ibpeer),
            ("ras", bench_ras),
            ("together", bench_together),
        ):
            tmp = Path(d) / name
            tmp.mkdir()
            got = fn(tmp, args.seconds)
            for r in got if isinstance(got, list) else [got]:
                print(json.dumps(r), flush=True)
                rows.append(r)
    result = {
        "machine": f"{os.cpu_count()} CPUs, {platform.platform()}",
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "command": "PYTHONPATH=$PWD .venv/bin/python bench/bench_ceilings.py "
        f"--seconds {args.seconds:g}",
        "pod_limit_mib": POD_LIMIT // MIB,
        "ras_answer_cap_bytes": RAS_CAP,
        "children": rows,
    }
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
