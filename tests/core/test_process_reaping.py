"""No process or zombie is left behind: real agents, real tools, real signals, a real PID
namespace.

- An ibpeer command prefix whose every call starts ``setsid sleep`` processes, one of them
  double-forked (neither is in the tool's process group): they are killed after each call,
  none accumulates, and none outlives the agent.
- A tool still running when the agent gets SIGTERM goes with the agent.
- An ibpeer tool that prints 200 MB and tries to take 400 MiB: refused by the kernel (the
  ibpeer child's memory ceiling, which its tools inherit), its output cut and counted.
- The agent as PID 1 of its PID namespace (a container's entrypoint without an init):
  orphans re-parented to it are reaped, and SIGTERM still stops it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from agent.config import DEFAULT_OFF, SAMPLER_NAMES
from agent.core.ceiling import child_ceiling
from tests.procwatch import children, data_limit, peak_rss
from tests.promharness import free_port

ROOT = Path(__file__).resolve().parents[2]
OTHERS = [f"--no-sampler.{n}" for n in SAMPLER_NAMES if n != "ibpeer" and n not in DEFAULT_OFF]


def processes(argv: str) -> list[int]:
    """Live (not zombie) processes whose command line is ``argv`` (words separated by NUL)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().rstrip(b"\0").replace(b"\0", b" ")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if cmdline.decode(errors="replace") == argv and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def zombies_of(parent: int) -> int:
    n = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if fields[0] == "Z" and int(fields[1]) == parent:
            n += 1
    return n


def kill_all(argv: str) -> None:
    for pid in processes(argv):
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def ib_tree(root: Path) -> Path:
    port = root / "sys/class/infiniband/mlx5_0/ports/1"
    port.mkdir(parents=True)
    (port / "link_layer").write_text("InfiniBand\n")
    (port / "state").write_text("4: ACTIVE\n")
    (port / "phys_state").write_text("5: LinkUp\n")
    return root / "sys"


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        body: bytes = resp.read()
        return body.decode()


def attempts(port: int, sampler: str) -> int:
    try:
        body = scrape(port)
    except OSError:
        return 0
    for line in body.splitlines():
        if line.startswith(f'fabricscope_sampler_attempts_total{{sampler="{sampler}"}}'):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


@contextmanager
def ibpeer_agent(
    tmp_path: Path, prefix: str, *extra: str
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    wrapper = tmp_path / "diags-wrapper"
    wrapper.write_text(prefix)
    wrapper.chmod(0o755)
    port = free_port()
    log = tmp_path / "agent.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "exporter.cli", "agent", "--sampler.ibpeer"),
                *(f"--path.sysfs={ib_tree(tmp_path)}", f"--ibpeer.command-prefix={wrapper}"),
                *(f"--web.listen-address=127.0.0.1:{port}", *OTHERS, *extra),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            cwd=ROOT,
        )
    try:
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


#: every tool call starts three sleeps out of the tool's process group, then fails as a
#: subnet that does not answer would (not as a node without the umad device, which has no
#: data and would not be asked again for a minute): every pass calls it again
ESCAPING = """#!/bin/sh
setsid sleep 987.6 &
setsid sleep 987.6 &
(setsid sleep 987.6 &)
echo "ibwarn: mad_rpc: _do_madrpc failed; dport (DR path slid 0; dlid 0; 0,1)" >&2
exit 1
"""


def test_a_prefix_that_calls_setsid_leaves_nothing_behind(tmp_path: Path) -> None:
    argv = "sleep 987.6"
    try:
        flags = ("--sampling.interval=1", "--ibpeer.interval=2")
        with ibpeer_agent(tmp_path, ESCAPING, *flags) as (agent, port):
            deadline = time.monotonic() + 60
            while attempts(port, "ibpeer") < 4:
                assert agent.poll() is None, (tmp_path / "agent.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the ibpeer sampler never ran four passes"
                time.sleep(0.2)
            # today's code: three more every pass (the issue saw 112 in 8 s)
            assert len(processes(argv)) <= 3  # at most the call in flight's
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(30) == 0
        deadline = time.monotonic() + 5
        while processes(argv):
            assert time.monotonic() < deadline, f"{len(processes(argv))} left after the agent"
            time.sleep(0.1)
    finally:
        kill_all(argv)


#: a tool that never answers (a MAD layer that stopped)
HANGING = """#!/bin/sh
exec sleep 876.5
"""


def test_a_tool_running_at_sigterm_goes_with_the_agent(tmp_path: Path) -> None:
    argv = "sleep 876.5"
    try:
        flags = ("--sampling.interval=60s", "--sampling.timeout=50s", "--ibpeer.tool-timeout=40s")
        with ibpeer_agent(tmp_path, HANGING, *flags) as (agent, _):
            deadline = time.monotonic() + 60
            while not processes(argv):
                assert agent.poll() is None, (tmp_path / "agent.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the tool never started"
                time.sleep(0.1)
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(30) == 0
        deadline = time.monotonic() + 5
        while processes(argv):  # today's code: left running until its 876 s are up
            assert time.monotonic() < deadline, "the tool outlived the agent"
            time.sleep(0.1)
    finally:
        kill_all(argv)


def test_the_agent_as_pid_1_reaps_orphans(tmp_path: Path) -> None:
    unshare, nsenter = shutil.which("unshare"), shutil.which("nsenter")
    assert unshare and nsenter, "util-linux's unshare and nsenter are needed (Debian: util-linux)"
    assert os.geteuid() == 0, "a PID namespace needs root (CI runs as root)"
    port = free_port()
    log = tmp_path / "agent.log"
    with log.open("wb") as out:
        outer = subprocess.Popen(
            [
                *(unshare, "--pid", "--fork", "--mount-proc", "--kill-child"),
                *(sys.executable, "-m", "exporter.cli", "agent", f"--path.sysfs={tmp_path}"),
                *(f"--path.procfs={tmp_path}", f"--web.listen-address=127.0.0.1:{port}"),
                *("--no-sampler.nvml", "--no-sampler.attribution", "--no-sampler.workload"),
                *("--no-sampler.throughput", "--sampling.interval=1"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    try:
        deadline = time.monotonic() + 60
        while attempts(port, "pci") < 1:
            assert outer.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the agent never served"
            time.sleep(0.2)
        init = int(Path(f"/proc/{outer.pid}/task/{outer.pid}/children").read_text().split()[0])
        # 40 orphans born in the agent's namespace: their parent exits at once, so each is
        # re-parented to the namespace's PID 1, which must wait for it when it exits
        subprocess.run(
            [
                nsenter,
                f"--target={init}",
                "--pid",
                "--",
                "sh",
                "-c",
                "for i in $(seq 40); do (sleep 0.05 &); done; sleep 0.2",
            ],
            check=True,
            timeout=60,
        )
        deadline = time.monotonic() + 10
        while zombies_of(init):  # today's code: 40 zombies, for good
            assert time.monotonic() < deadline, f"{zombies_of(init)} zombies under PID 1"
            time.sleep(0.1)
        assert attempts(port, "pci") >= 1  # still serving
        os.kill(init, signal.SIGTERM)  # as the kubelet stops a container: PID 1 gets it
        assert outer.wait(30) == 0, log.read_text()[-3000:]
        assert "received signal 15, shutting down" in log.read_text()
    finally:
        if outer.poll() is None:
            outer.kill()
            outer.wait()


@pytest.fixture(autouse=True)
def _no_stray_sleeps() -> Iterator[None]:
    yield
    kill_all("sleep 987.6")
    kill_all("sleep 876.5")


#: the memory limit the chart gives the agent (deploy/helm/fabricscope/values.yaml)
POD_LIMIT = 512 << 20
#: what the ibpeer child may hold with a greedy tool: its own ~22 MiB resident (VmHWM, Python
#: 3.11 on the development machine) and 10 MiB; the tool's 200 MB and 400 MiB add nothing
CHILD_PEAK = 32 << 20

#: a tool that tries to take 400 MiB (noting whether it could), then prints 200 MB
GREEDY = """#!/bin/sh
if {python} -c 'b = bytearray(400 << 20)' 2>/dev/null; then echo took >> {notes}
else echo refused >> {notes}; fi
head -c 200000000 /dev/zero | tr '\\0' 7
"""


def test_a_greedy_tool_costs_the_ibpeer_child_nothing(tmp_path: Path) -> None:
    """An ibpeer tool that prints 200 MB and tries to allocate 400 MiB, under the chart's
    512 MiB pod limit: the child runs under its memory ceiling (``RLIMIT_DATA``, its share of
    the limit), which the tools it starts inherit, so the tool's allocation is refused by the
    kernel; its output is cut at the tools' cap and counted; the child's resident memory
    stays at its own size, under its ceiling, and it is never replaced; /metrics answers
    throughout."""
    notes = tmp_path / "notes"
    script = GREEDY.format(python=sys.executable, notes=notes)
    ceiling = child_ceiling("ibpeer", POD_LIMIT)
    flags = ("--sampling.interval=1", "--ibpeer.interval=1", f"--agent.memory-limit={POD_LIMIT}")
    with ibpeer_agent(tmp_path, script, *flags) as (agent, port):
        deadline = time.monotonic() + 60
        peak = 0
        while attempts(port, "ibpeer") < 2 or not notes.exists():
            assert agent.poll() is None, (tmp_path / "agent.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the ibpeer sampler never ran two passes"
            peak = max([peak, *(peak_rss(pid) for pid in children(agent.pid))])
            time.sleep(0.2)
        body = scrape(port)
        (child,) = children(agent.pid)  # it answered: its ceiling is set
        assert data_limit(child) == ceiling, "the ibpeer child has no memory ceiling"
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(30) == 0
    assert "took" not in notes.read_text(), "a tool took 400 MiB past the child's ceiling"
    assert 0 < peak < min(CHILD_PEAK, ceiling), f"the ibpeer child peaked at {peak >> 20} MiB"
    assert 'fabricscope_sampler_child_restarts_total{sampler="ibpeer"} 0.0' in body
    assert "printed more than" in (tmp_path / "agent.log").read_text()
