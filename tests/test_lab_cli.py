"""``python -m tests.lab``'s server stops what it started when it is stopped with SIGTERM (as a
service manager or ``timeout`` stops it), not only on Ctrl-C: no Prometheus left running.
``serve`` over an empty TSDB directory runs the same serving code as ``backfill --serve``
without the minute a backfill takes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from tests.promharness import wait_until

ROOT = Path(__file__).resolve().parent.parent


def processes_using(path: Path) -> list[int]:
    """The pids whose command line names ``path``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # the process ended while we looked
            continue
        if str(path).encode() in cmdline:
            found.append(int(entry.name))
    return found


def answers(url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{url}/-/ready", timeout=2):
            return True
    except (urllib.error.URLError, OSError):
        return False


def test_sigterm_stops_the_served_prometheus(tmp_path: Path) -> None:
    out = tmp_path / "tsdb"
    out.mkdir()  # an empty TSDB: Prometheus serves it
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["PYTHONPATH"] = str(ROOT)
    lab = subprocess.Popen(
        [sys.executable, "-m", "tests.lab", "serve", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        assert lab.stdout is not None
        url = ""
        for line in lab.stdout:  # bounded: the process ends, or prints the URL
            if line.startswith("Prometheus serving"):
                url = line.split(" at ", 1)[1].split()[0]
                break
        assert url and answers(url), "the lab never served its Prometheus"
        assert processes_using(out), "no Prometheus holds the TSDB"
        lab.send_signal(signal.SIGTERM)
        assert lab.wait(30) == 0
        wait_until(
            lambda: True if not processes_using(out) else None,
            timeout=20,
            what="the lab's Prometheus to exit",
        )
        assert not answers(url)
    finally:
        if lab.poll() is None:
            lab.kill()
            lab.wait(10)
        for pid in processes_using(out):  # this test's own Prometheus, if the lab left it
            os.kill(pid, signal.SIGKILL)
