"""`fabricscope probe` and `fabricscope agent --probe` as a user meets them, on CPU with gloo:
an intra-node table, a probe and a GPU-slot matrix against a running agent, the schedule's
plan, and every error as one line with exit status 2."""

from __future__ import annotations

import csv
import os
import re
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from agent.probe.measure.launch import free_port
from agent.probe.render import heatmap
from tests.probe.test_probe_matrix import decode_png, hex_rgb, pixel

ROOT = Path(__file__).resolve().parents[2]
MARK = "FABRICSCOPE_TEST_MARK"
WALL = 120.0


def run(args: Sequence[str], mark: str, timeout: float = WALL) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", **{MARK: mark})
    return subprocess.run(
        [sys.executable, "-m", "exporter.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def marked(mark: str) -> list[int]:
    """Live processes (workers included, whoever their parent is now) carrying ``mark``."""
    out = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARK) == mark and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


@pytest.fixture
def mark() -> Iterator[str]:
    """A marker in the environment of the command and every worker it starts: none may
    survive the command."""
    value = secrets.token_hex(8)
    yield value
    assert marked(value) == []


def one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [
        line for line in proc.stderr.splitlines() if re.match(r"fabricscope( \w+)?: error:", line)
    ]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0]


def secret_file(directory: Path, mode: int = 0o600) -> Path:
    path = directory / f"secret-{mode:o}"
    path.write_text(secrets.token_hex(32) + "\n")
    path.chmod(mode)
    return path


@dataclass(frozen=True)
class Agent:
    probe_port: int
    web_port: int
    secret: Path
    mark: str

    @property
    def where(self) -> str:
        return f"127.0.0.1:{self.probe_port}"

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.web_port}/metrics"
        with urllib.request.urlopen(url, timeout=5.0) as resp:
            body: bytes = resp.read()
        return body.decode()

    def wait_metric(self, line_start: str, ok: object, timeout: float = 10.0) -> str:
        """The first line starting with ``line_start`` once ``ok(value)`` holds."""
        began = time.monotonic()
        while True:
            for line in self.metrics().splitlines():
                if line.startswith(line_start) and ok(float(line.rsplit(" ", 1)[1])):  # type: ignore[operator]
                    return line
            if time.monotonic() - began > timeout:
                raise AssertionError(f"no {line_start} satisfying the check in {timeout:g}s")
            time.sleep(0.2)


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    """A real agent with --probe on loopback: gloo, 2 CPU slots, answering offers only."""
    d = tmp_path_factory.mktemp("agent")
    (d / "sys").mkdir()
    a = Agent(free_port(), free_port(), secret_file(d), secrets.token_hex(8))
    args = [
        "agent",
        f"--path.sysfs={d / 'sys'}",
        "--no-sampler.netdev",
        "--no-sampler.nvml",
        f"--web.listen-address=127.0.0.1:{a.web_port}",
        "--sampling.interval=0.5",
        "--sampling.timeout=0.5",
        "--probe",
        f"--probe.secret-file={a.secret}",
        f"--probe.listen-address={a.where}",
        "--probe.intra-seconds=0",
        "--probe.backend=gloo",
    ]
    log = (d / "agent.log").open("w")
    env = dict(os.environ, **{MARK: a.mark})
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter.cli", *args], cwd=ROOT, env=env, stdout=log, stderr=log
    )
    began = time.monotonic()
    while True:  # the probe port is bound before the web server starts
        assert proc.poll() is None, (d / "agent.log").read_text()
        try:
            if "fabricscope_probe_members" in a.metrics():
                break
        except OSError:
            pass
        assert time.monotonic() - began < 30.0, "the agent did not come up"
        time.sleep(0.1)
    yield a
    proc.terminate()
    assert proc.wait(10.0) == 0, (d / "agent.log").read_text()
    log.close()
    assert marked(a.mark) == []


def table_rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.strip() and not line.startswith("#")]


# --- intra-node -----------------------------------------------------------------------------


def test_probe_on_cpu_prints_nccl_tests_tables(mark: str) -> None:
    proc = run(["probe", "--probe.cpu-slots=3", "--iterations=3", "--warmup=1"], mark)
    assert proc.returncode == 0, proc.stderr
    blocks = proc.stdout.split("\n\n")
    assert blocks[0].startswith("# all_reduce on 3 ranks of ")
    assert blocks[1].startswith("# sendrecv on 3 ranks of ")
    assert "(gloo, CPU slots 0 1 2)" in blocks[0]
    assert "size        count   type    time(us)  algbw(GB/s)  busbw(GB/s)  correct" in blocks[0]
    for block, factor in zip(blocks[:2], (4 / 3, 1.0), strict=True):  # 2(n-1)/n; x 1
        rows = table_rows(block)
        assert [r[0] for r in rows] == ["65536", "1048576"]
        for size, count, kind, time_us, alg, bus, correct in rows:
            assert (int(count), kind, correct) == (int(size) // 4, "float", "yes")
            assert float(time_us) > 0
            assert float(bus) == pytest.approx(float(alg) * factor, abs=2e-3)


# --- against a running agent --------------------------------------------------------------


def test_probe_peer_measures_against_a_running_agent(agent: Agent, mark: str) -> None:
    args = ["probe", "--peer", agent.where, "--secret-file", str(agent.secret)]
    proc = run([*args, "--collectives=sendrecv,latency", "--iterations=3"], mark)
    assert proc.returncode == 0, proc.stderr
    sendrecv, latency = proc.stdout.strip().split("\n\n")
    assert sendrecv.startswith("# sendrecv between ")
    assert f"and {agent.where}" in sendrecv.splitlines()[0]
    rows = table_rows(sendrecv)
    assert [r[0] for r in rows] == ["65536", "1048576"]
    assert all(r[-1] == "yes" and float(r[5]) > 0 for r in rows)
    (lat,) = table_rows(latency)
    assert (lat[0], lat[4], lat[5], lat[6]) == ("8", "-", "-", "yes")
    # the agent answered both offers and charged its GPU-time budget; a manual probe is the
    # operator's and is not exported as a result
    agent.wait_metric("fabricscope_probe_rendezvous_accepted_total", lambda v: v >= 2)
    agent.wait_metric("fabricscope_probe_gpu_seconds_total", lambda v: v > 0)
    assert "fabricscope_probe_success{" not in agent.metrics()


def test_probe_matrix_writes_csv_and_png(agent: Agent, mark: str, tmp_path: Path) -> None:
    """4 local slots x 3 of the agent's: rounds of 3 pairs at once from one address, more
    than the 2 pending rendezvous the agent admits per address (the guests ask again)."""
    out_csv, out_png = tmp_path / "m.csv", tmp_path / "m.png"
    proc = run(
        [
            "probe",
            "--matrix",
            "--peer",
            agent.where,
            "--secret-file",
            str(agent.secret),
            "--peer-gpus=3",  # the agent has 2 slots: the third column fails
            "--probe.cpu-slots=4",
            "--iterations=3",
            f"--csv={out_csv}",
            f"--png={out_png}",
        ],
        mark,
    )
    assert proc.returncode == 1, proc.stderr  # some pairs failed
    progress = [line for line in proc.stderr.splitlines() if line.startswith("pair ")]
    assert [p.split(":")[0] for p in progress] == [f"pair {k}/12" for k in range(1, 13)]
    assert sum("FAILED (init_failure" in p for p in progress) == 4
    assert not any("too many pending" in p for p in progress)
    rows = list(csv.DictReader(out_csv.open()))
    assert [(r["local_gpu"], r["remote_gpu"]) for r in rows] == [
        (i, j) for i in "0123" for j in "012"
    ]
    for r in rows:
        assert r["size_bytes"] == "1048576"
        if r["remote_gpu"] == "2":
            assert (r["status"], r["reason"], r["busbw_bytes_per_second"]) == (
                "failed",
                "init_failure",
                "",
            )
        else:
            assert (r["status"], r["reason"]) == ("ok", "")
            assert float(r["busbw_bytes_per_second"]) > 0
    image = decode_png(out_png.read_bytes())
    box = heatmap.layout(4, 3, failures=True)
    assert image.size == box.size_px
    red = hex_rgb(heatmap.FAILURE_FILL)
    for i in range(4):
        for j in range(3):
            colour = pixel(image, box.cell_px(i, j, dy=-0.35))
            assert (colour == red) == (j == 2), (i, j, colour)
    assert "local\\remote" in proc.stdout and "FAIL" in proc.stdout


def test_a_wrong_secret_is_refused_and_counted_by_the_agent(
    agent: Agent, mark: str, tmp_path: Path
) -> None:
    proc = run(["probe", "--peer", agent.where, "--secret-file", str(secret_file(tmp_path))], mark)
    one_line_error(proc, f"authentication with peer {agent.where} failed")
    agent.wait_metric('fabricscope_probe_rendezvous_refused_total{reason="auth_failure"}', bool)


def test_a_taken_probe_port_is_a_clear_error(agent: Agent, mark: str, tmp_path: Path) -> None:
    proc = run(
        [
            "agent",
            f"--path.sysfs={tmp_path}",
            "--no-sampler.netdev",
            f"--web.listen-address=127.0.0.1:{free_port()}",
            "--probe",
            f"--probe.secret-file={agent.secret}",
            f"--probe.listen-address={agent.where}",
        ],
        mark,
    )
    one_line_error(proc, f"probe port {agent.where} is already in use")


# --- errors ---------------------------------------------------------------------------------


def test_an_unreachable_peer_is_one_line(mark: str, tmp_path: Path) -> None:
    where = f"127.0.0.1:{free_port()}"
    proc = run(["probe", "--peer", where, "--secret-file", str(secret_file(tmp_path))], mark)
    one_line_error(proc, f"peer {where} unreachable:", "Connection refused")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["probe", "--peer", "127.0.0.1:1"], "--peer needs --secret-file"),
        (["probe", "--matrix"], "--matrix needs --peer"),
        (["probe", "--peer", "127.0.0.1:1", "--secret-file", "{open}"], "readable by every user"),
        (["probe", "--peer", "127.0.0.1:99999", "--secret-file", "{ok}"], "--peer: "),
        (
            ["agent", "--probe", "--probe.peers-file=/nonexistent"],
            "--probe.secret-file is required with --probe.peers-file",
        ),
    ],
)
def test_usage_errors_are_one_line(args: list[str], needle: str, mark: str, tmp_path: Path) -> None:
    files = {"{open}": str(secret_file(tmp_path, 0o644)), "{ok}": str(secret_file(tmp_path))}
    proc = run([files.get(a, a) for a in args], mark)
    one_line_error(proc, needle)


def test_once_takes_no_probes(mark: str, tmp_path: Path) -> None:
    """--probe with --once would be ignored (probes run on the serving agent's schedule):
    refused in one line instead (issue 22)."""
    proc = run(
        ["agent", "--once", "--no-sampler.netdev", f"--path.sysfs={tmp_path}", "--probe"], mark
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.strip() == (
        "fabricscope agent: error: --probe has no effect with --once: probes run on the serving "
        "agent's schedule (`fabricscope probe` runs one now) (see fabricscope agent --help)"
    )


# --- the plan -------------------------------------------------------------------------------


def test_probe_plan_localises_a_bad_node_among_1024(mark: str) -> None:
    proc = run(["probe", "plan", "--nodes", "1024", "--bad-node", "node0042"], mark)
    assert proc.returncode == 0, proc.stderr
    assert "localised:   round 1 (1 round after the first failure" in proc.stdout
    assert "verdict:     bad node node0042" in proc.stdout
    assert "wrong blame: none" in proc.stdout


def test_probe_plan_help_is_the_plans_own(mark: str) -> None:
    proc = run(["probe", "plan", "--help"], mark)
    assert proc.returncode == 0
    assert proc.stdout.startswith("usage: fabricscope probe plan")
