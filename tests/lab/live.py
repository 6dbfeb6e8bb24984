"""Live mode: real ``fabricscope agent`` processes on 127.0.0.x over lab node trees whose
counters a stepper thread advances in real time, scraped by a real Prometheus with the
shipped alert rules (``deploy/rules/*.rules.yaml``) loaded, alerting through a real
Alertmanager to a webhook receiver in the test.

    with LiveLab(SCENARIOS["healthy"], workdir, nodes=3,
                 rule_for={"FabricscopeInfinibandPortDown": "2s"}) as lab:
        lab.wait_scraped()
        lab.take_down("node-01", "mlx5_4")
        alert = lab.webhook.wait_for(...)

What runs as in production: the agent command (its samplers, runner and HTTP server), the
kubelet's pod-resources gRPC API on a unix socket per node, Prometheus (scrape, rules,
alerting), Alertmanager (routing, grouping, webhook delivery). What the agents read: each
node's sysfs and procfs trees (:mod:`tests.lab.node`), rewritten every ``interval`` seconds
by the stepper, each file replaced atomically as the kernel presents it. The job's
throughput: each agent reads its node's trainer log (Composer lines in CRI format, as the
backfill writes them) through ``--throughput.file LOG=llm``, as on a Slurm node: without an
API server the pod's name and namespace are not known, so the series carry ``job_name`` and
``instance`` only. A port taken down slows the whole job (every node's log) to the lab's bad
tokens/s until it comes back. Not in live mode: NVML (this machine has no driver; the
backfill replays a recording in process), netlink and ethtool (answered in process in
backfill mode; a subprocess reads the real kernel). Those samplers are switched off with
their flags.

``rule_for`` overrides an alert's ``for`` in a copy of the rules, so an alert that waits
5 minutes in production fires within a test's time; every other rule is loaded as shipped.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType

import yaml

from tests.lab.cluster import Cluster, Timeline, scratch_dir
from tests.lab.node import LabNode
from tests.lab.scenarios import (
    BAD_TOKENS_PER_SECOND,
    GOOD_TOKENS_PER_SECOND,
    JOB_NAME,
    SCENARIOS,
    Scenario,
)
from tests.promharness import (
    Alertmanager,
    Prometheus,
    WebhookReceiver,
    start_alertmanager,
    start_prometheus,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "rules"
#: samplers live mode cannot feed from a subprocess (see the module doc)
OFF = ("--no-sampler.nvml", "--no-sampler.netdev")


def host_of(index: int) -> str:
    """Node ``index``'s agent address: 127.0.0.2, 127.0.0.3, ..."""
    return f"127.0.0.{2 + index}"


def free_port_on(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def rules_with_for(out_dir: Path, rule_for: Mapping[str, str]) -> list[Path]:
    """Copies of the shipped rule files into ``out_dir``, with ``for`` of the alerts named
    in ``rule_for`` replaced; raises KeyError when a named alert is not shipped."""
    out_dir.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    paths = []
    for src in sorted(RULES.glob("*.rules.yaml")):
        doc = yaml.safe_load(src.read_text())
        for group in doc["groups"]:
            for rule in group["rules"]:
                name = rule.get("alert")
                if name in rule_for:
                    rule["for"] = rule_for[name]
                    seen.add(name)
        dst = out_dir / src.name
        dst.write_text(yaml.safe_dump(doc, sort_keys=False))
        paths.append(dst)
    missing = set(rule_for) - seen
    if missing:
        raise KeyError(f"no shipped alert named {sorted(missing)}")
    return paths


class Stepper:
    """Advances every node one step of ``interval`` seconds, every ``interval`` seconds, in
    a thread (the lab's clock is the wall clock here)."""

    def __init__(self, cluster: Cluster, interval: float) -> None:
        self._cluster = cluster
        self._interval = interval
        # a timeline whose cause never starts: live faults are applied by the test
        steps = 10**7
        self._tl = Timeline(time.time() + (steps - 1) * interval, interval, steps, steps)
        self._step = 0
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="lab-stepper", daemon=True)

    def step(self) -> None:
        with self._lock:
            self._cluster.advance(self._tl, self._step)
            self._step += 1

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.step()
            except BaseException as exc:  # reported by check(): never a silent stall
                self._error = exc
                return
            next_at += self._interval
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def start(self) -> None:
        self._thread.start()

    def check(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"the lab's stepper failed: {self._error!r}") from self._error

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


class AgentProcess:
    """One ``fabricscope agent`` serving node ``node`` on ``host:port``."""

    def __init__(self, node: LabNode, host: str, interval: float, log_dir: Path) -> None:
        self.node = node
        self.host = host
        self.port = free_port_on(host)
        self.log_path = log_dir / f"agent-{node.name}.log"
        args = [
            sys.executable,
            "-m",
            "exporter.cli",
            "agent",
            f"--path.sysfs={node.sys}",
            f"--path.procfs={node.proc}",
            f"--kubelet.pod-resources-socket={node.socket}",
            f"--path.cdi={node.root / 'cdi'}",
            f"--web.listen-address={host}:{self.port}",
            f"--sampling.interval={interval:g}",
            f"--sampling.timeout={interval:g}",
            "--log.level=warning",
            f"--throughput.file={node.log_path}={JOB_NAME}",
            *OFF,
        ]
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
        env["NODE_NAME"] = ""  # no API-server pod watch: there is no API server here
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
            )

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    def log_tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


class LiveLab:
    """``nodes`` nodes of ``scenario`` played live; see the module doc. ``interval``:
    seconds between steps, agent passes, scrapes and rule evaluations."""

    def __init__(
        self,
        scenario: Scenario,
        workdir: Path,
        *,
        nodes: int = 3,
        interval: float = 1.0,
        rule_for: Mapping[str, str] | None = None,
    ) -> None:
        self.scenario = scenario
        self.workdir = workdir
        self.interval = interval
        self._indices: Sequence[int] = range(min(nodes, scenario.nodes))
        self._rule_for = dict(rule_for or {})
        self.agents: list[AgentProcess] = []
        self._stack = ExitStack()
        self._cluster: Cluster | None = None
        self._stepper: Stepper | None = None
        self.webhook: WebhookReceiver
        self.alertmanager: Alertmanager
        self.prometheus: Prometheus

    def __enter__(self) -> LiveLab:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        stack = self._stack
        scratch = stack.enter_context(scratch_dir("fslab-live-"))
        cluster = Cluster(self.scenario, scratch, scratch / "cache", only=self._indices)
        self._cluster = stack.enter_context(cluster)
        for node in cluster.nodes:
            node.atomic_writes = True
        self._stepper = Stepper(cluster, self.interval)
        self._stepper.step()  # the trees hold a first step before any agent reads them
        self._stepper.start()
        stack.callback(self._stepper.stop)
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for i, node in zip(self._indices, cluster.nodes, strict=True):
            agent = AgentProcess(node, host_of(i), self.interval, logs)
            stack.callback(agent.stop)
            self.agents.append(agent)
        self.webhook = stack.enter_context(WebhookReceiver())
        am = start_alertmanager(self.workdir / "alertmanager", self.webhook.url)
        self.alertmanager = stack.enter_context(am)
        every = f"{self.interval:g}s"
        scrape = {
            "job_name": "fabricscope",
            "scrape_interval": every,
            "scrape_timeout": every,
            # the ServiceMonitor's relabeling names each target after its node
            "static_configs": [
                {"targets": [a.target], "labels": {"instance": a.node.name}} for a in self.agents
            ],
        }
        prom = start_prometheus(
            self.workdir / "prometheus",
            [scrape],
            scrape_interval=every,
            rule_files=rules_with_for(self.workdir / "rules", self._rule_for),
            alertmanager_url=self.alertmanager.url,
        )
        self.prometheus = stack.enter_context(prom)

    def node(self, name: str) -> LabNode:
        assert self._cluster is not None
        return next(n for n in self._cluster.nodes if n.name == name)

    def wait_scraped(self, timeout: float = 30.0) -> None:
        """Until every agent has been scraped with its InfiniBand ports (the first scrape
        comes ~5 s after Prometheus starts)."""
        want = {a.node.name for a in self.agents}

        def probe() -> bool | None:
            self.check()
            got = self.prometheus.query("count by (instance) (fabricscope_infiniband_port_up)")
            return True if {s.labels["instance"] for s in got} >= want else None

        wait_until(probe, timeout=timeout, what="every lab agent scraped")

    def take_down(self, node: str, device: str) -> None:
        """``device``'s link on ``node`` goes DOWN at the next step and stays down; the job
        (on every node) runs at the lab's bad tokens/s meanwhile."""
        self.node(node).held_down.add(device)
        self._pace_job()

    def bring_up(self, node: str, device: str) -> None:
        self.node(node).held_down.discard(device)
        self._pace_job()

    def drop_rate(self, node: str, device: str) -> None:
        """``device``'s link on ``node`` retrains at ``100 Gb/sec (1X NDR)`` at the next step
        and stays ACTIVE, carrying a quarter of its traffic; the job runs at the
        ``ib_rate_drop`` scenario's share meanwhile."""
        self.node(node).rate_dropped.add(device)
        self._pace_job()

    def slow_nic_pcie(self, node: str, device: str) -> None:
        """The PCIe link of ``device``'s NIC on ``node`` retrains at 8 GT/s at the next step;
        the job runs at the ``pcie_speed_nic`` scenario's share meanwhile."""
        self.node(node).pcie_slowed.add(device)
        self._pace_job()

    def _pace_job(self) -> None:
        assert self._cluster is not None
        ratio = 1.0
        if any(n.held_down for n in self._cluster.nodes):
            ratio = BAD_TOKENS_PER_SECOND / GOOD_TOKENS_PER_SECOND
        if any(n.rate_dropped for n in self._cluster.nodes):
            ratio = min(ratio, SCENARIOS["ib_rate_drop"].throughput_ratio)
        if any(n.pcie_slowed for n in self._cluster.nodes):
            ratio = min(ratio, SCENARIOS["pcie_speed_nic"].throughput_ratio)
        for n in self._cluster.nodes:
            n.job_slowdown = ratio

    def check(self) -> None:
        """Raise with its log if an agent died, or if the stepper failed."""
        if self._stepper is not None:
            self._stepper.check()
        for a in self.agents:
            if a.process.poll() is not None:
                raise RuntimeError(
                    f"agent of {a.node.name} exited with {a.process.returncode}:\n" + a.log_tail()
                )

    def close(self) -> None:
        """Stop everything, in the reverse order it started."""
        self._stack.close()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
