"""A real VictoriaMetrics (Debian's ``victoria-metrics`` with ``vmctl`` and ``vmalert``, 1.79)
for tests and benchmarks: the single-node server on a free 127.0.0.1 port, a Prometheus TSDB
(the lab's promtool-built blocks) imported with ``vmctl prometheus``, and the shipped rules
replayed over the stored history with ``vmalert -replay.*``, which writes recording rules'
series and ``ALERTS`` back into the server.

    with start_victoria_metrics(tmp_path) as vm:
        vm.import_tsdb(tsdb_dir)
        vm.replay_rules(rule_files, start, end)
        vm.url  # a Prometheus-compatible query API (MetricsQL)

The server runs with its rollup cache off (``-search.disableCache``: an import's samples
are older than ``-search.cacheTimestampOffset`` and would poison it) and no latency offset
(the data is history, not a live scrape).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import yaml

from tests.promharness import free_port, wait_until

VICTORIA_METRICS = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"
VMCTL = shutil.which("vmctl") or "/usr/bin/vmctl"
VMALERT = shutil.which("vmalert") or "/usr/bin/vmalert"
SCRIPT = shutil.which("script") or "/usr/bin/script"
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class VictoriaMetrics:
    def __init__(self, process: subprocess.Popen[bytes], port: int, workdir: Path) -> None:
        self.process = process
        self.port = port
        self.workdir = workdir
        self.url = f"http://127.0.0.1:{port}"

    def __enter__(self) -> VictoriaMetrics:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self, timeout: float = 15.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)

    def get(self, path: str) -> bytes:
        with _OPENER.open(f"{self.url}{path}", timeout=60) as r:
            body: bytes = r.read()
        return body

    def series_count(self) -> int:
        return int(json.loads(self.get("/api/v1/series/count"))["data"][0])

    def settle(self, timeout: float = 120.0) -> int:
        """Flush what was written and wait until the series count stops growing (the server
        makes new data searchable in the background); returns it."""
        last = -1

        def stable() -> int | None:
            nonlocal last
            self.get("/internal/force_flush")
            n = self.series_count()
            if n == last and n > 0:
                return n
            last = n
            time.sleep(1.0)
            return None

        return wait_until(stable, timeout=timeout, what="VictoriaMetrics to settle")

    def import_tsdb(self, tsdb: Path, *, raw_only: bool = False, timeout: float = 1800) -> int:
        """Every block of a Prometheus TSDB directory, with ``vmctl prometheus``; returns
        the series count once settled. ``raw_only``: leave out recording rules' series (a
        colon in the name), which vmalert will write. vmctl draws a progress bar on its
        terminal and stops without one: ``script`` gives it a pseudo-terminal."""
        cmd = (
            f"{VMCTL} prometheus -s --vm-disable-progress-bar --prom-snapshot={tsdb} "
            f"--vm-addr={self.url}"
        )
        if raw_only:
            cmd += " --prom-filter-label=__name__ --prom-filter-label-value='[^:]+'"
        log = self.workdir / "vmctl.log"
        with log.open("wb") as out:
            result = subprocess.run(
                [SCRIPT, "-qec", cmd, "/dev/null"],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
        if result.returncode != 0:
            raise RuntimeError(f"vmctl failed ({result.returncode}):\n{log.read_text()[-2000:]}")
        return self.settle()

    def replay_rules(
        self,
        rule_files: Sequence[Path],
        start: float,
        end: float,
        *,
        interval: str = "1m",
        timeout: float = 1800,
    ) -> str:
        """``vmalert`` in replay mode: every rule of ``rule_files`` evaluated every
        ``interval`` over ``[start, end]`` against this server, recording rules' series and
        ``ALERTS``/``ALERTS_FOR_STATE`` written back into it. Returns vmalert's log.

        The rules are replayed without their annotations: replay mode refuses the ``query``
        template function (live vmalert runs it), and annotations change no series.
        :func:`check_rules` validates the files as they are, templates included. Each group
        gets ``interval`` spelled out: vmalert 1.79's replay compares the gap between
        evaluations with the group's own interval, which is 0 when the file leaves it to
        ``-evaluationInterval``, and then never lets an alert with ``for`` leave pending
        (a live vmalert fills it in)."""
        copies = []
        for i, path in enumerate(rule_files):
            doc = yaml.safe_load(path.read_text())
            for group in doc["groups"]:
                group.setdefault("interval", interval)
                for rule in group["rules"]:
                    rule.pop("annotations", None)
            copy = self.workdir / f"replay-{i}-{path.name}"
            copy.write_text(yaml.safe_dump(doc))
            copies.append(copy)
        rule_files = copies
        log = self.workdir / "vmalert.log"
        with log.open("wb") as out:
            result = subprocess.run(
                [
                    VMALERT,
                    *(f"-rule={p}" for p in rule_files),
                    f"-datasource.url={self.url}",
                    f"-remoteWrite.url={self.url}",
                    f"-replay.timeFrom={_rfc3339(start)}",
                    f"-replay.timeTo={_rfc3339(end)}",
                    "-replay.disableProgressBar",
                    "-replay.rulesDelay=0s",
                    f"-evaluationInterval={interval}",
                    # the range queries' step: the evaluation interval, not the 5m default
                    # (which in replay makes an alert's "for" restart every 5 minutes)
                    f"-datasource.queryStep={interval}",
                    "-loggerLevel=WARN",
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
        text = log.read_text(errors="replace")
        if result.returncode != 0:
            raise RuntimeError(f"vmalert replay failed ({result.returncode}):\n{text[-3000:]}")
        self.settle()
        return text


def check_rules(rule_files: Sequence[Path]) -> None:
    """``vmalert -dryRun``: every expression parsed as MetricsQL and every annotation
    template checked, as vmalert does before it runs them; raises with its output."""
    result = subprocess.run(
        [
            VMALERT,
            "-dryRun",
            "-rule.validateExpressions",
            "-rule.validateTemplates",
            *(f"-rule={p}" for p in rule_files),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"vmalert -dryRun failed:\n{(result.stdout + result.stderr)[-3000:]}")


def start_victoria_metrics(workdir: Path, extra_args: Sequence[str] = ()) -> VictoriaMetrics:
    """A fresh single-node VictoriaMetrics in ``workdir`` on a free 127.0.0.1 port, ready; a
    port another process took between ``free_port()`` and the bind is retried (3 attempts)."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    for attempt in range(3):
        port = free_port()
        log_path = workdir / "victoria-metrics.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [
                    VICTORIA_METRICS,
                    f"-storageDataPath={workdir / 'data'}",
                    f"-httpListenAddr=127.0.0.1:{port}",
                    "-retentionPeriod=100y",
                    "-search.disableCache",
                    "-search.latencyOffset=0s",
                    "-loggerLevel=WARN",
                    *extra_args,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        vm = VictoriaMetrics(proc, port, workdir)

        def ready(vm: VictoriaMetrics = vm) -> bool | None:
            if vm.process.poll() is not None:
                return False  # exited: reported below
            try:
                return vm.get("/health").strip() == b"OK" or None
            except OSError:
                time.sleep(0.1)
                return None

        try:
            up = wait_until(ready, timeout=30, what="victoria-metrics to answer /health")
        except BaseException:
            vm.stop()
            raise
        if up:
            return vm
        tail = log_path.read_text(errors="replace")[-2000:]
        if "address already in use" in tail and attempt < 2:
            continue
        raise RuntimeError(f"victoria-metrics exited {proc.returncode}:\n{tail}")
    raise AssertionError("unreachable")
