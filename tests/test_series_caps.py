"""Every label set a tenant's output or a tool's output can grow is capped, per container (or
port) and per node, and what passes the cap is still counted under one overflow series.

- A real agent reading 30 containers that each print every combination NCCL's own WARN
  format can name (25 completion statuses x 257 vendor errors, 6,425 lines): the IB error
  series stay within 16 per container and 256 per node plus one overflow series each, every
  line is counted, and the agent's memory stays put (the issue this guards against: 190,342
  series, RSS 155 -> 316 MiB).
- The ibpeer sampler running a hostile tool wrapper whose perfquery prints 4,000 invented
  counter fields: 16 kept per answer, the rest counted as dropped.
- The NCCL settings of a container whose processes are each started with another value.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent.throughput.nccl_run import MAX_IB_ERROR_PAIRS, NODE_IB_ERROR_PAIRS
from agent.workload.records import GpuPlacement, NcclSetting, WorkloadProcess, WorkloadSnapshot
from exporter.metrics import workload
from exporter.metrics.spec import Families
from tests.agentrun import fabricscope
from tests.promharness import free_port

ROOT = Path(__file__).resolve().parent.parent
SIM = ROOT / "tests/fixtures/ibpeer/sim"
CONTAINERS = 30
#: statuses 0-24 (rdma-core names 0-23, then one it has no name for) x vendor errors 0-256
STATUSES, VENDORS = 25, 257
IB_ERRORS = "fabricscope_nccl_ib_completion_errors_total"


def warn(status: int, vendor: int) -> str:
    """One NCCL 2.20+ IB completion error line, as NCCL prints it, in the CRI log format."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")
    return (
        f"{stamp}000Z stdout F node-7:2041:2290 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got "
        f"completion from peer 10.0.0.8<33142> with status={status} opcode=129 len=65536 "
        f"vendor err {vendor} (Recv) localGid ::ffff:10.0.0.7 remoteGids::ffff:10.0.0.8\n"
    )


def pod_log(root: Path, i: int) -> Path:
    d = root / f"tenant_flood-{i}_0b8a7c1e-{i:04d}-4c43-8d6c-6a3a8f2f11aa" / "trainer"
    d.mkdir(parents=True, exist_ok=True)
    return d / "0.log"


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        body: bytes = resp.read()
        return body.decode()


def samples(body: str, name: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for line in body.splitlines():
        if line.startswith(name + "{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
            out.append((labels, float(line.rsplit(" ", 1)[1])))
    return out


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    pods = tmp_path / "pods"
    for i in range(CONTAINERS):
        pod_log(pods, i).write_text(
            "2026-11-25T10:00:00.000000000Z stdout F \t Train throughput/tokens_per_sec: 1.5\n"
        )
    port = free_port()
    log = tmp_path / "agent.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("KUBERNETES_SERVICE_HOST", None)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "exporter.cli", "agent", f"--path.sysfs={tmp_path}"),
                *(f"--path.procfs={tmp_path}", f"--path.pod-logs={pods}"),
                *(f"--web.listen-address=127.0.0.1:{port}", "--sampling.interval=2"),
                *("--sampling.timeout=2", "--throughput.pods=all"),
                *("--no-sampler.nvml", "--no-sampler.netdev", "--no-sampler.workload"),
                *("--no-sampler.infiniband", "--no-sampler.pci", "--no-sampler.attribution"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )
    try:
        yield proc, port, pods
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_thirty_containers_printing_every_nccl_warn_combination(
    agent: tuple[subprocess.Popen[bytes], int, Path],
) -> None:
    proc, port, pods = agent
    deadline = time.monotonic() + 60  # a loaded CI machine: interpreter and child start
    while True:
        assert proc.poll() is None, (pods.parent / "agent.log").read_text()[-3000:]
        try:
            body = scrape(port)
            if len(samples(body, "fabricscope_throughput_tokens_per_second")) == CONTAINERS:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, "the agent never read the 30 logs"
        time.sleep(0.5)
    child = children(proc.pid)
    assert len(child) == 1, child  # the throughput sampler's child
    rss_before = rss_bytes(proc.pid) + rss_bytes(child[0])
    flood = "".join(warn(s, v) for s in range(STATUSES) for v in range(VENDORS))
    for i in range(CONTAINERS):
        with pod_log(pods, i).open("a") as f:
            f.write(flood)
    want = CONTAINERS * STATUSES * VENDORS
    deadline = time.monotonic() + 150
    while True:
        assert proc.poll() is None, "the agent exited"
        body = scrape(port)
        errors = samples(body, IB_ERRORS)
        if sum(v for _, v in errors) == want:
            break
        assert time.monotonic() < deadline, f"counted {sum(v for _, v in errors)} of {want}"
        time.sleep(1)
    rss_after = rss_bytes(proc.pid) + rss_bytes(children(proc.pid)[0])
    per_pod: dict[str, int] = {}
    for labels, _ in errors:
        per_pod[labels["pod"]] = per_pod.get(labels["pod"], 0) + 1
    assert len(per_pod) == CONTAINERS
    assert max(per_pod.values()) <= MAX_IB_ERROR_PAIRS + 1  # its own pairs and the overflow
    assert len(errors) <= NODE_IB_ERROR_PAIRS + CONTAINERS  # the node's cap, an overflow each
    overflow = [v for labels, v in errors if labels["status"] == labels["vendor_error"] == "other"]
    assert len(overflow) == CONTAINERS and min(overflow) > 0  # nothing past a cap was lost
    series = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
    assert series < 3000, series  # was 190,342
    # the parsed flood costs the agent and its child a few MiB, not the 161 MiB it took
    assert rss_after - rss_before < 48 << 20, (rss_before, rss_after)


WRAPPER = """#!{python}
# a hostile --ibpeer.command-prefix: recorded simulator answers for smpquery, and a
# perfquery that invents 4,000 counter fields
import sys
args = sys.argv[1:]
sim = {sim!r}
def show(name):
    with open(sim + "/" + name) as f:
        sys.stdout.write("".join(f.readlines()[1:]))
if args[0] == "perfquery":
    show("perfquery-x-peer.txt" if "-x" in args else "perfquery-peer.txt")
    for i in range(4000):
        print(f"X{{i:04d}}:.{{i}}")  # 36 KB: within the 64 KiB a tool may print
elif "nodeinfo" in args:
    show("smpquery-nodeinfo-peer.txt")
elif "nodedesc" in args:
    show("smpquery-nodedesc-peer.txt")
elif args[-2] == "0":
    show("smpquery-portinfo-local.txt")
elif args[-1] == "0":
    show("smpquery-portinfo-peer-port0.txt")
else:
    show("smpquery-portinfo-peer.txt")
"""


def test_a_tool_inventing_counter_fields_gets_sixteen_series_an_answer(tmp_path: Path) -> None:
    for dev in ("mlx5_0", "mlx5_1"):
        port = tmp_path / "sys/class/infiniband" / dev / "ports/1"
        port.mkdir(parents=True)
        (port / "link_layer").write_text("InfiniBand\n")
        (port / "state").write_text("4: ACTIVE\n")
        (port / "phys_state").write_text("5: LinkUp\n")
    wrapper = tmp_path / "hostile-diags"
    wrapper.write_text(WRAPPER.format(python=sys.executable, sim=str(SIM)))
    wrapper.chmod(0o755)
    others = ("attribution", "infiniband", "netdev", "nvml", "pci", "throughput", "workload")
    done = fabricscope(
        [
            "agent",
            "--once",
            f"--path.sysfs={tmp_path / 'sys'}",
            "--sampler.ibpeer",
            *(f"--no-sampler.{n}" for n in others),
            f"--ibpeer.command-prefix={wrapper}",
            # fields of no known counter are series at full detail only (and -x is read)
            "--collector.detail=full",
        ]
    )
    assert done.returncode == 0, done.stderr
    generic = samples(done.stdout, "fabricscope_infiniband_peer_port_generic_total")
    invented = [labels for labels, _ in generic if labels["counter"].startswith("x")]
    # 16 of perfquery's answer and 16 of perfquery -x's (the same names: one series) a port
    assert len(invented) == 2 * 16, len(invented)
    dropped = samples(done.stdout, "fabricscope_infiniband_peer_fields_dropped_total")
    assert sorted(v for _, v in dropped) == [2 * (4000 - 16)] * 2
    # the known counters are still there, with their recorded values
    symbol = samples(done.stdout, "fabricscope_infiniband_peer_port_symbol_errors_total")
    assert [v for _, v in symbol] == [65535, 65535]
    assert len(done.stdout.splitlines()) < 600


def test_a_containers_processes_with_a_value_each_get_four_series() -> None:
    processes = tuple(
        WorkloadProcess(
            pid=1000 + i,
            gpus=(GpuPlacement(0, "0000:18:00.0", None, 0),),
            allowed_cpus=(0,),
            pinned=False,
            nccl_env=(NcclSetting("NCCL_ALGO", f"Ring{i}"),),
        )
        for i in range(200)
    )
    out = Families("full")
    workload.render(WorkloadSnapshot(processes=processes), out)
    values = [
        labels[-1]
        for spec, rows in out.items()
        if spec is workload.NCCL_ENV_INFO
        for labels, _ in rows
    ]
    assert sorted(values) == ["<other>", "Ring0", "Ring1", "Ring2", "Ring3"]


def test_a_job_annotation_is_a_bounded_label() -> None:
    from agent.kubernetes.podwatch import PodMeta
    from agent.throughput.sources import MAX_JOB_NAME, job_from_pod

    huge = PodMeta("u", "ns", "p", annotations=(("fabricscope.io/job", "j\n" * 100_000),))
    name = job_from_pod(huge)
    assert len(name) == MAX_JOB_NAME and set(name) == {"j", "?"}
    assert job_from_pod(PodMeta("u", "ns", "p", owner="llm-pretrain")) == "llm-pretrain"
