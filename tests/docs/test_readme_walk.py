"""The README's commands, in its order, on a fresh copy of the checkout with no virtualenv, the
way a newcomer runs them (issue 22): the install command, the agent, `--version`/`--help`,
`topo`, `snapshot` and its replay, `probe` (without the probe extra: one line naming it),
`probe plan`, `explain` without a Prometheus, the throughput example, `make golden`.

Each command is first found in README.md word for word, so the README cannot drift from what
is tested. The install is pip's (through scripts/run.sh -> scripts/venv.sh, pip's cache and
configured indexes), once; the second start of the agent must not install again.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DGX = "tests/fixtures/dgx-h100/sys"


def readme_says(command: str) -> None:
    assert command in README, f"the README no longer says {command!r}"


def fresh_copy(dest: Path) -> Path:
    """The checkout's files as a clone has them (tracked, and new ones not ignored), no .venv."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in filter(None, listed):
        rel = raw.decode()
        src, dst = ROOT / rel, dest / rel
        if not src.is_symlink() and not src.exists():
            continue  # deleted in the working tree, not yet committed
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(os.readlink(src))
        else:
            shutil.copy2(src, dst)
    assert not (dest / ".venv").exists()
    return dest


def run(
    cmd: list[str], cwd: Path, timeout: float = 120
) -> tuple[subprocess.CompletedProcess[str], float]:
    began = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    return proc, time.monotonic() - began


def one_line(proc: subprocess.CompletedProcess[str], status: int) -> str:
    assert proc.returncode == status, (proc.returncode, proc.stderr[-3000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_a_newcomer_walks_the_readme(tmp_path: Path) -> None:
    repo = fresh_copy(tmp_path / "fabricscope")
    fs = str(repo / ".venv" / "bin" / "fabricscope")

    # 1. "Run the agent on this host": installs into .venv and serves /metrics
    readme_says("bash scripts/run.sh")
    agent = subprocess.Popen(
        ["bash", "scripts/run.sh", "--web.listen-address=127.0.0.1:0", f"--path.sysfs={DGX}"],
        cwd=repo,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert agent.stderr is not None
        deadline = time.monotonic() + 900  # a first install, from pip's cache or an index
        installed = False
        while True:
            line = agent.stderr.readline()
            assert line or agent.poll() is None, "run.sh exited before serving"
            assert time.monotonic() < deadline, "run.sh did not serve within 15 minutes"
            installed |= "installing fabricscope into .venv" in line
            m = re.search(r"listening on 127\.0\.0\.1:(\d+) ", line)
            if m:
                break
        assert installed
        url = f"http://127.0.0.1:{m.group(1)}/metrics"
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    body = r.read().decode()
                if 'fabricscope_sampler_success{sampler="pci"} 1.0' in body:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline + 60
            time.sleep(0.2)
    finally:
        os.killpg(agent.pid, signal.SIGTERM)
        agent.wait(timeout=30)

    # 2. the second start does not install again: seconds, not a pip run
    second, took = run(
        ["bash", "scripts/run.sh", "--once", f"--path.sysfs={DGX}", "--no-sampler.netdev"], repo
    )
    assert second.returncode == 0, second.stderr
    assert "installing" not in second.stderr
    assert 'fabricscope_pci_link_width_degraded{pci_bus_id="0000:38:00.0"} 1.0' in second.stdout
    assert took < 60, took

    # 3. the command line
    version, _ = run([fs, "--version"], repo)
    assert version.returncode == 0 and version.stdout.startswith("fabricscope ")
    usage, _ = run([fs, "--help"], repo)
    assert usage.returncode == 0 and "agent" in usage.stdout and "explain" in usage.stdout
    readme_says("fabricscope agent --once [flags]")
    once, _ = run([fs, "agent", "--once"], repo)  # this host's own /sys
    assert once.returncode == 0, once.stderr
    assert "fabricscope_build_info{" in once.stdout

    # 4. topo on the DGX fixture tree, as the README shows it
    readme_says(f"$ fabricscope topo --path.sysfs {DGX}")
    topo, _ = run([fs, "topo", "--path.sysfs", DGX], repo)
    assert topo.returncode == 0, topo.stderr
    shown = [ln for ln in README.split("\n") if ln.startswith("  warning  ")]
    assert shown, "the README's topo example lost its findings"
    for ln in shown:  # the README cuts long lines with "..."
        for part in filter(None, (p.strip() for p in ln.split("..."))):
            assert part in topo.stdout, (part, ln)

    # 5. snapshot and its replays
    readme_says("fabricscope snapshot -o node.tar.gz")
    snap, _ = run([fs, "snapshot", "-o", "node.tar.gz", f"--path.sysfs={DGX}"], repo)
    assert snap.returncode == 0, snap.stderr
    readme_says("fabricscope agent --once --snapshot node.tar.gz")
    replay, _ = run([fs, "agent", "--once", "--snapshot", "node.tar.gz"], repo)
    assert replay.returncode == 0 and "fabricscope_pci_link_width_degraded" in replay.stdout
    readme_says("fabricscope topo --snapshot node.tar.gz")
    replay_topo, _ = run([fs, "topo", "--snapshot", "node.tar.gz"], repo)
    assert replay_topo.returncode == 0 and "PIX" in replay_topo.stdout

    # 6. the probe without its extra: one line naming it, at once (it crashed every row)
    readme_says("fabricscope probe [--peer HOST | --matrix]")
    probe, took = run([fs, "probe"], repo)
    line = one_line(probe, 2)
    assert "torch" in line and "'.[probe]'" in line, line
    assert took < 30
    readme_says("fabricscope probe plan --nodes 1024 --bad-node node0042")
    plan, _ = run([fs, "probe", "plan", "--nodes", "1024", "--bad-node", "node0042"], repo)
    assert plan.returncode == 0, plan.stderr
    assert "the agent's default --probe.round-seconds" in plan.stdout

    # 7. explain against a Prometheus that is not there: one line, exit 2
    readme_says("fabricscope explain --prometheus.url URL --job NAME")
    explain, _ = run(
        [fs, "explain", "--prometheus.url", "http://127.0.0.1:9", "--job", "llm"], repo
    )
    assert "Prometheus" in one_line(explain, 2)

    # 8. the throughput example, on a real Composer log
    readme_says("fabricscope agent --once --throughput.file 'runs/*.log'")
    runs = repo / "runs"
    runs.mkdir()
    composer = sorted((repo / "tests/fixtures/throughput-logs/composer").iterdir())[0]
    shutil.copy(composer, runs / "train.log")
    tput, _ = run(
        [fs, "agent", "--once", "--throughput.file", "runs/*.log", "--no-sampler.netdev"], repo
    )
    assert tput.returncode == 0, tput.stderr
    assert 'job_name="train"' in tput.stdout

    # 9. make golden after make run: it installs the test tools itself before running pytest
    readme_says("`make golden` (regenerate golden files)")
    makefile = (repo / "Makefile").read_text().split("\ngolden:", 1)[1].split("\n")[1:]
    recipe = [
        ln.strip()
        for ln in makefile[: next(i for i, ln in enumerate(makefile) if not ln.startswith("\t"))]
    ]
    assert recipe[0] == "bash scripts/venv.sh test", recipe
    assert any("-m pytest" in line for line in recipe[1:]), recipe
