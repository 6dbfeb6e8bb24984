"""A rollout changes no series' identity under the Prometheus Operator; the Prometheus
resource's overrideHonorLabels and enforcedNamespaceLabel do to the labels what install.md says.

The chart is rendered; its ServiceMonitor (or PodMonitor) is translated into the scrape config
the Operator's generator writes for it (:mod:`tests.operatorcfg`, the Operator's own golden
files); a real Prometheus scrapes a real agent on a lab node (sysfs tree, the kubelet's
pod-resources socket, a training job's pod and its log) with that config. Then the DaemonSet
"rolls": the agent is stopped and a new one starts on the same node address (host network), its
pod under a new name, as a rolling update replaces it. Every series the first pod exported
must be the very same series after the roll (no new label set, none left behind), and none
may carry the agent pod's name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.helmchart import NAMESPACE, render
from tests.lab.cluster import Cluster, scratch_dir
from tests.lab.live import OFF, ROOT, Stepper, free_port_on
from tests.lab.node import LabNode
from tests.lab.scenarios import JOB_NAME, SCENARIOS
from tests.operatorcfg import (
    endpoints_target,
    pod_monitor_config,
    pod_target,
    service_monitor_config,
    with_prometheus_settings,
)
from tests.promharness import Prometheus, start_prometheus, wait_until

Doc = dict[str, Any]
HOST = "127.0.0.2"
#: what the agent pod is called before and after the roll (a DaemonSet's generated names)
OLD_POD, NEW_POD = "fabricscope-7xk2p", "fabricscope-q9d4m"
UNRESOLVED = 'fabricscope_pod_rdma_info{device=""}[5m]'


def one(docs: list[Doc], kind: str) -> Doc:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


class Node:
    """One lab node and the agent serving it at ``HOST:port``, restartable in place."""

    def __init__(self, node: LabNode, port: int, logs: Path) -> None:
        self.node, self.port, self.logs = node, port, logs
        self.process: subprocess.Popen[bytes] | None = None
        self.generation = 0

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def start(self) -> None:
        self.stop()  # one agent per node address, as on a node
        self.generation += 1
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        env["PYTHONPATH"] = str(ROOT)
        env["NODE_NAME"] = ""  # no API server here
        log = self.logs / f"agent-{self.generation}.log"
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "exporter.cli",
                    "agent",
                    f"--path.sysfs={self.node.sys}",
                    f"--path.procfs={self.node.proc}",
                    f"--kubelet.pod-resources-socket={self.node.socket}",
                    f"--web.listen-address={self.address}",
                    "--sampling.interval=1",
                    "--sampling.timeout=1",
                    "--log.level=warning",
                    f"--throughput.file={self.node.log_path}={JOB_NAME}",
                    *OFF,
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )

    def log_tail(self) -> str:
        log = self.logs / f"agent-{self.generation}.log"
        return "\n".join(log.read_text(errors="replace").splitlines()[-15:])

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


@pytest.fixture(scope="module")
def lab_node() -> Iterator[Node]:
    with ExitStack() as stack:
        scratch = stack.enter_context(scratch_dir("fs-rollout-"))
        cluster = stack.enter_context(
            Cluster(SCENARIOS["healthy"], scratch, scratch / "cache", only=[0])
        )
        Stepper(cluster, 1.0).step()  # the tree holds one step; its counters stay put
        logs = scratch / "logs"
        logs.mkdir()
        node = Node(cluster.nodes[0], free_port_on(HOST), logs)
        stack.callback(node.stop)
        yield node


def series(prom: Prometheus, since: float) -> set[frozenset[tuple[str, str]]]:
    """Every label set of job fabricscope that held a sample since ``since`` (the series API,
    so a series the roll ended is still listed)."""
    data = prom.api(
        "series",
        {"match[]": '{job="fabricscope"}', "start": f"{since:.3f}", "end": f"{time.time():.3f}"},
    )
    assert isinstance(data, list)
    return {frozenset(d.items()) for d in data}


def settled(prom: Prometheus, since: float) -> set[frozenset[tuple[str, str]]]:
    """:func:`series` once two reads a few scrapes apart agree (a series a later pass adds
    is counted before the comparison, not taken for a rename)."""
    last: list[set[frozenset[tuple[str, str]]]] = []

    def probe() -> set[frozenset[tuple[str, str]]] | None:
        got = series(prom, since)
        if last and got == last[-1]:
            return got
        last.append(got)
        return None

    # reads three scrapes apart at the test's 1 s pace
    return wait_until(probe, timeout=60, what="the series to settle", interval=3.0)


def scraped_by(prom: Prometheus, pod: str, after: float) -> bool | None:
    """The target discovered from ``pod`` is up and was scraped after ``after``."""
    raw = prom.api("targets", {"state": "active"})
    assert isinstance(raw, dict)
    for t in raw["activeTargets"]:
        discovered = t["discoveredLabels"]
        if discovered.get("__meta_kubernetes_pod_name") != pod or t["health"] != "up":
            continue
        last = t["lastScrape"]
        # RFC 3339 with nanoseconds: compare on the seconds
        stamp = time.mktime(time.strptime(last[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
        if stamp > after + 1:
            return True
    return None


@pytest.mark.parametrize("monitor", ["ServiceMonitor", "PodMonitor"])
def test_a_rollout_changes_no_series_identity(monitor: str, lab_node: Node, tmp_path: Path) -> None:
    values: Doc = {"podMonitor": {"enabled": True}} if monitor == "PodMonitor" else {}
    docs = render(values, tmp_path)
    targets = tmp_path / "targets.json"

    def discovered(pod: str) -> list[Doc]:
        if monitor == "ServiceMonitor":
            svc = one(docs, "Service")
            return [
                endpoints_target(
                    lab_node.address,
                    namespace=NAMESPACE,
                    service=svc,
                    pod=pod,
                    node=lab_node.node.name,
                )
            ]
        labels = one(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
        return [
            pod_target(
                lab_node.address,
                namespace=NAMESPACE,
                pod_labels=labels,
                pod=pod,
                node=lab_node.node.name,
            )
        ]

    def publish(pod: str) -> None:
        staged = targets.with_suffix(".tmp")
        staged.write_text(json.dumps(discovered(pod)))
        staged.replace(targets)  # file_sd reads whole files only

    publish(OLD_POD)
    config = (
        service_monitor_config(one(docs, "ServiceMonitor"), targets)
        if monitor == "ServiceMonitor"
        else pod_monitor_config(one(docs, "PodMonitor"), targets)
    )
    config["scrape_interval"] = config["scrape_timeout"] = "1s"  # the test's pace, not 30s
    # the same monitor under the two Prometheus settings install.md describes, each as its
    # own job (the ServiceMonitor's run only: one more scrape of the same agent each)
    variants = {
        f"fabricscope-{name}": with_prometheus_settings(config, **setting)
        for name, setting in (
            ("override", {"override_honor_labels": True}),
            ("enforced", {"enforced_namespace_label": "namespace"}),
        )
        if monitor == "ServiceMonitor"
    }
    for job, variant in variants.items():
        variant["job_name"] = job
        variant["relabel_configs"] = [
            *variant["relabel_configs"],
            {"target_label": "job", "replacement": job},
        ]
    lab_node.start()
    begin = time.time()
    with ExitStack() as stack:
        stack.callback(lab_node.stop)
        prom = stack.enter_context(
            start_prometheus(tmp_path / "prometheus", [config, *variants.values()])
        )
        # the pod's attribution series (the workload's namespace/pod) are there too
        for info in ("fabricscope_pod_gpu_info", "fabricscope_pod_rdma_info"):
            prom.wait_for_query(f'count({info}{{job="fabricscope"}}) > 0', timeout=60)
        before = settled(prom, begin)
        # the roll: the old pod stops, the new one starts on the same node address
        lab_node.stop()
        publish(NEW_POD)
        lab_node.start()
        rolled = time.time()
        wait_until(lambda: scraped_by(prom, NEW_POD, rolled), timeout=60, what="the new pod")
        after = settled(prom, begin)
        renamed = {dict(n)["__name__"] for n in after - before}
        assert after == before, (
            f"new series: {[dict(s) for s in after - before][:3]}; before, of those names: "
            f"{[dict(s) for s in before if dict(s)['__name__'] in renamed][:3]}; the new "
            f"agent's log: {lab_node.log_tail()}; rolled at {rolled}: "
            f"{prom.api('query', {'query': UNRESOLVED})}"
        )
        names = {dict(s)["__name__"] for s in before}
        assert len(before) > 100 and "fabricscope_infiniband_port_up" in names
        for labels in map(dict, before):
            assert labels["job"] == "fabricscope" and labels["instance"] == lab_node.node.name
            assert labels["endpoint"] == "metrics"
            assert "service" not in labels and labels.get("container") != "agent", labels
            assert labels.get("pod") != OLD_POD and labels.get("namespace") != NAMESPACE, labels
        # honorLabels: the workload's own namespace and pod, as the agent exported them
        workload = [dict(s) for s in before if dict(s)["__name__"] == "fabricscope_pod_gpu_info"]
        assert workload and all(w["pod"] == lab_node.node.pod for w in workload), workload
        if not variants:
            return
        # install.md, Series across a rollout: honorLabels forced off renames nothing (the
        # chart dropped the target labels the workload's would clash with); an enforced
        # namespace label overwrites the workload's namespace with the agent's
        theirs = {w["namespace"] for w in workload}
        for job, namespaces in (
            ("fabricscope-override", theirs),
            ("fabricscope-enforced", {NAMESPACE}),
        ):
            prom.wait_for_query(f'count(fabricscope_pod_gpu_info{{job="{job}"}}) > 0', timeout=60)
            got = prom.query(f'fabricscope_pod_gpu_info{{job="{job}"}}')
            assert {s.labels["namespace"] for s in got} == namespaces, (job, got)
            assert {s.labels["pod"] for s in got} == {lab_node.node.pod}, (job, got)
            assert not [k for s in got for k in s.labels if k.startswith("exported_")], got
