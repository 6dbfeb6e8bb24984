"""The join rules (deploy/rules/joins.rules.yaml) and the Node board's DCGM panels on a real
Prometheus scraping the other exporters' real output beside the real agent.

One node, ``dgx-01``:

- fabricscope: the real agent (``agent --once``) on a snapshot of the DGX fixture tree with
  the recorded H100 NVML answers, whose four GPUs answer the UUIDs of GPUs in the recorded
  dcgm-exporter output (tests/fixtures/dcgm-exporter: an H100 and an A30 in MIG mode, an
  L40S, a V100) and the PCI addresses of the tree's first four GPUs, as NVML spells them;
- dcgm-exporter: those recordings, served as they are, one target each;
- node_exporter: the real binary on the same tree (infiniband and netclass collectors),
  checked against its recorded output (tests/fixtures/node_exporter).

Prometheus evaluates the join rules; the recorded series must carry fabricscope's labels
and the other exporters' values, and the install guide's example queries and the Node
board's DCGM panels must answer. A second node without dcgm-exporter shows what the board
says then.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.snapshot import NVML_RECORDING, capture
from tests.agentrun import fabricscope
from tests.promharness import Prometheus, start_prometheus

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
DGX = FIXTURES / "dgx-h100" / "sys"
DCGM = FIXTURES / "dcgm-exporter"
NODE_EXPORTER_CAPTURE = FIXTURES / "node_exporter" / "dgx-h100.node_exporter-1.5.0.prom"
RULES = ROOT / "deploy" / "rules" / "joins.rules.yaml"
INSTALL = ROOT / "docs" / "install.md"
sys.path.insert(0, str(ROOT / "dashboards"))
import generate  # noqa: E402

#: NVML index -> (dcgm-exporter recording, its `gpu`): whose UUID the replayed GPU answers,
#: and the DCGM field the join must pick for it
PAIRS = {
    0: ("dcgm-exporter-512.h100-mig.prom", "0", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
    1: ("nvidia-dcgm-226.l40s.prom", "0", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
    2: ("dcgm-exporter-250.v100.prom", "0", "DCGM_FI_DEV_GPU_UTIL"),
    3: ("dcgm-exporter-317.a30-mig.prom", "0", "DCGM_FI_PROF_SM_ACTIVE"),
}
#: the DGX tree's first four GPUs, as NVML spells PCI addresses (upper case, 8-digit domain)
DGX_GPUS = ("00000000:19:00.0", "00000000:3B:00.0", "00000000:4C:00.0", "00000000:5D:00.0")
NODE_EXPORTER_FAMILIES = re.compile(r"^(# (HELP|TYPE) )?node_(infiniband|network)_")


def dcgm_samples(name: str) -> list[tuple[str, dict[str, str], float]]:
    text = (DCGM / name).read_text()
    return [
        (s.name, dict(s.labels), s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    ]


def uuid_of(name: str, gpu: str) -> str:
    return next(lb["UUID"] for _, lb, _ in dcgm_samples(name) if lb["gpu"] == gpu)


def snapshot(tmp: Path) -> Path:
    """The DGX tree and the recorded H100 NVML answers, GPUs 0-3 answering the recorded
    dcgm-exporter output's UUIDs at the tree's GPU addresses."""
    rec = json.loads((FIXTURES / "nvml" / "h100x4.recording.json").read_text())
    for i, (name, gpu, _) in PAIRS.items():
        rec["calls"][f"nvmlDeviceGetUUID({i})"] = {"value": uuid_of(name, gpu)}
        rec["calls"][f"nvmlDeviceGetPciInfo({i})"] = {"value": DGX_GPUS[i]}
    touched = [
        os.path.relpath(os.path.join(d, f), DGX)
        for d, dirs, files in os.walk(DGX)
        for f in [*files, *(x for x in dirs if os.path.islink(os.path.join(d, x)))]
    ]
    out = tmp / "dgx-01.tar.gz"
    capture(str(DGX), touched, str(out), extra={NVML_RECORDING: json.dumps(rec).encode()})
    return out


def agent_metrics(args: list[str], tmp: Path) -> str:
    proc = fabricscope(
        [
            "agent",
            "--once",
            *args,
            "--no-sampler.netdev",
            "--no-sampler.workload",
            "--kubelet.pod-resources-socket=",
            "--kubernetes.node-name=",
            f"--path.pod-logs={tmp / 'no-pod-logs'}",
            "--log.level=error",
        ]
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


class _Pages(http.server.BaseHTTPRequestHandler):
    pages: ClassVar[dict[str, bytes]] = {}

    def do_GET(self) -> None:
        body = self.pages.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, *_: object) -> None:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def node_exporter_on_dgx() -> Iterator[str]:
    """The real node_exporter on the DGX tree: its address."""
    binary = shutil.which("prometheus-node-exporter")
    assert binary, "prometheus-node-exporter missing: scripts/test.sh installs it"
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--path.sysfs={DGX}",
            "--collector.disable-defaults",
            "--collector.infiniband",
            "--collector.netclass",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def node_exporter() -> Iterator[str]:
    with node_exporter_on_dgx() as address:
        yield address


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory, node_exporter: str) -> Iterator[Prometheus]:
    with dgx01(tmp_path_factory.mktemp("joins"), node_exporter) as p:
        yield p


@contextmanager
def dgx01(tmp: Path, node_exporter: str, scrape_interval: str = "1s") -> Iterator[Prometheus]:
    """Prometheus scraping dgx-01's three exporters (and ``bare``: fabricscope alone, no
    dcgm-exporter), evaluating the join rules; ready once every join has answered.
    dashboards/preview.py draws the Node board's ``node-dcgm.png`` from it."""
    with ThreadPoolExecutor(2) as pool:  # two agent runs at once: half the wait
        dgx = pool.submit(agent_metrics, [f"--snapshot={snapshot(tmp)}"], tmp)
        bare = pool.submit(
            agent_metrics, [f"--snapshot={FIXTURES / 'snapshots' / 'h100x4.tar.gz'}"], tmp
        )
        pages = {"/dgx-01": dgx.result().encode(), "/bare": bare.result().encode()}
    for name, _, _ in PAIRS.values():
        pages[f"/dcgm/{name}"] = (DCGM / name).read_bytes()
    handler = type("Pages", (_Pages,), {"pages": pages})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    served = f"127.0.0.1:{server.server_address[1]}"
    node = [{"target_label": "instance", "replacement": "dgx-01"}]
    scrape = [
        # the chart's relabeling: fabricscope's instance is the node's name
        {
            "job_name": "fabricscope",
            "metrics_path": "/dgx-01",
            "static_configs": [{"targets": [served]}],
            "relabel_configs": node,
        },
        {
            "job_name": "fabricscope-bare",
            "metrics_path": "/bare",
            "static_configs": [{"targets": [served]}],
            "relabel_configs": [{"target_label": "instance", "replacement": "bare"}],
        },
        # dcgm-exporter's instance is its pod's address, nothing like the node's name
        {
            "job_name": "nvidia-dcgm-exporter",
            "honor_labels": True,
            "static_configs": [
                {
                    "targets": [served],
                    "labels": {
                        "__metrics_path__": f"/dcgm/{name}",
                        "instance": f"10.0.187.{i}:9400",
                    },
                }
                for i, (name, _, _) in PAIRS.items()
            ],
        },
        # node_exporter: host and port (the join takes the host)
        {
            "job_name": "node-exporter",
            "static_configs": [{"targets": [node_exporter]}],
            "relabel_configs": [{"target_label": "instance", "replacement": "dgx-01:9100"}],
        },
    ]
    try:
        with start_prometheus(
            tmp / "prometheus", scrape, scrape_interval=scrape_interval, rule_files=[RULES]
        ) as p:
            p.wait_for_query(
                "count(fabricscope:gpu_dcgm_activity:ratio) == 4 "
                "and on () count(fabricscope:infiniband_port_netdev_up) > 0"
            )
            yield p
    finally:
        server.shutdown()


def test_node_exporter_still_writes_the_recorded_output(node_exporter: str) -> None:
    """The recorded capture is what node_exporter writes for the tree (its header aside)."""
    with urllib.request.urlopen(f"http://{node_exporter}/metrics", timeout=10) as r:
        live = [ln for ln in r.read().decode().splitlines() if NODE_EXPORTER_FAMILIES.match(ln)]
    recorded = NODE_EXPORTER_CAPTURE.read_text().splitlines()
    assert recorded[0].startswith("# prometheus-node-exporter --path.sysfs=")
    assert [
        ln for ln in recorded if not ln.startswith("# ") or ln.startswith(("# HELP", "# TYPE"))
    ] == live


def test_each_gpu_gets_the_dcgm_activity_of_its_uuid_in_fabricscopes_labels(
    prom: Prometheus,
) -> None:
    info = {
        s.labels["gpu"]: s.labels for s in prom.query('fabricscope_gpu_info{instance="dgx-01"}')
    }
    got = {s.labels["gpu"]: s for s in prom.query("fabricscope:gpu_dcgm_activity:ratio")}
    assert sorted(got) == ["0", "1", "2", "3"]
    for i, (name, gpu, field) in PAIRS.items():
        s = got[str(i)]
        uuid = uuid_of(name, gpu)
        # fabricscope's identity: its job and instance, gpu, uuid, the sysfs-form address
        assert dict(s.labels) == {
            "__name__": "fabricscope:gpu_dcgm_activity:ratio",
            "job": "fabricscope",
            "instance": "dgx-01",
            "gpu": str(i),
            "uuid": uuid,
            "pci_bus_id": DGX_GPUS[i][4:].lower(),
            "field": field,
        }
        assert info[str(i)]["uuid"] == uuid
        # the value is dcgm-exporter's: the busiest MIG instance, a percentage as a ratio
        values = [v for n, lb, v in dcgm_samples(name) if n == field and lb["UUID"] == uuid]
        want = max(values) / (100 if field == "DCGM_FI_DEV_GPU_UTIL" else 1)
        assert s.value == want


def test_the_pci_address_would_not_join_but_the_uuid_does(prom: Prometheus) -> None:
    """dcgm-exporter's upper-case NVML spelling next to fabricscope's sysfs spelling."""
    dcgm = {s.labels["pci_bus_id"] for s in prom.query("DCGM_FI_PROF_GR_ENGINE_ACTIVE")}
    ours = {s.labels["pci_bus_id"] for s in prom.query("fabricscope_gpu_info")}
    assert "00000000:4E:00.0" in dcgm and not dcgm & ours
    assert len(prom.query("fabricscope:gpu_dcgm_graphics_active:ratio")) == 2


def test_no_recorded_series_keeps_a_foreign_label(prom: Prometheus) -> None:
    foreign = {"UUID", "Hostname", "modelName", "GPU_I_ID", "GPU_I_PROFILE", "node"}
    for name in ("fabricscope:gpu_dcgm_activity:ratio", "fabricscope:infiniband_port_netdev_up"):
        for s in prom.query(name):
            assert not set(s.labels) & foreign, s.labels
            assert "pod" not in s.labels and "namespace" not in s.labels, s.labels


def test_each_rdma_port_gets_node_exporters_view_of_its_interface(prom: Prometheus) -> None:
    ports = {
        (s.labels["device"], s.labels["port"]): s.labels["netdev"]
        for s in prom.query('fabricscope_infiniband_port_info{instance="dgx-01"}')
    }
    up = {s.labels["device"]: s.value for s in prom.query("node_network_up")}
    got = prom.query("fabricscope:infiniband_port_netdev_up")
    assert len(got) == len(ports) == 12
    for s in got:
        key = (s.labels["device"], s.labels["port"])
        assert dict(s.labels) == {
            "__name__": "fabricscope:infiniband_port_netdev_up",
            "job": "fabricscope",
            "instance": "dgx-01",
            "device": key[0],
            "port": key[1],
            "netdev": ports[key],
        }
        assert s.value == up[ports[key]]


def install_examples() -> list[str]:
    """The PromQL blocks of the install guide's section on the other exporters."""
    text = INSTALL.read_text()
    section = text.split("## Beside dcgm-exporter and node_exporter", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```promql\n(.*?)```", section, re.S)


def test_the_install_guides_example_queries_answer(prom: Prometheus) -> None:
    examples = install_examples()
    assert len(examples) >= 3
    for expr in examples:
        assert prom.query(expr.replace("$node", "dgx-01")), expr


def node_board_dcgm_panels() -> list[generate.Panel]:
    board = next(b for b in generate.BOARDS if b.uid == "fabricscope-node")
    return [p for p in board.panels if any("dcgm" in e for e, _ in p.targets)]


def board_query(expr: str, node: str) -> str:
    return expr.replace("$cluster", ".*").replace("$node", node)


def test_the_node_board_shows_dcgm_activity_beside_the_links(prom: Prometheus) -> None:
    panels = node_board_dcgm_panels()
    assert len(panels) == 2
    activity, presence = panels
    (expr, legend), *_ = activity.targets
    assert {s.labels["gpu"] for s in prom.query(board_query(expr, "dgx-01"))} == {
        "0",
        "1",
        "2",
        "3",
    }
    assert "{{field}}" in legend
    seen = [prom.query(board_query(e, "dgx-01")) for e, _ in presence.targets]
    assert [[s.value for s in r] for r in seen] == [[4.0], []]


def test_the_node_board_says_when_dcgm_exporter_is_not_there(prom: Prometheus) -> None:
    activity, presence = node_board_dcgm_panels()
    assert prom.query(board_query(activity.targets[0][0], "bare")) == []
    seen = [prom.query(board_query(e, "bare")) for e, _ in presence.targets]
    assert [[s.value for s in r] for r in seen] == [[], [4.0]]
    assert "not scraped" in presence.targets[1][1]
