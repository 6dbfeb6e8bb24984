"""Live mode end to end (tests/lab/live.py): three real ``fabricscope agent`` processes on
127.0.0.2-4 over lab node trees that a stepper advances every second, scraped every second
by a real Prometheus with the shipped rules (deploy/rules/*.rules.yaml) loaded, alerting
through a real Alertmanager into a webhook receiver here.

The fault: node-01's rail mlx5_4 goes DOWN (state ``1: DOWN``, phys_state ``2: Polling``,
``link_downed`` +1) and stays down, then comes back. The webhook must receive
``FabricscopeInfinibandPortDown`` for exactly that port (its ``for: 5m`` shortened to 2 s in
the test's copy of the rules, the one change made to them) and
``FabricscopeInfinibandLinkDowned`` (as shipped: no ``for``), then the resolved
PortDown once the link is back; no other node or port alerts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.lab.live import LiveLab
from tests.lab.scenarios import JOB_NAME, NAMESPACE, SCENARIOS

ROOT = Path(__file__).resolve().parent.parent

NODE, DEVICE = "node-01", "mlx5_4"


def _labels(alert: dict[str, object]) -> dict[str, str]:
    labels = alert["labels"]
    assert isinstance(labels, dict)
    return labels


def test_a_port_going_down_reaches_the_webhook_and_resolves(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with LiveLab(
        SCENARIOS["healthy"],
        tmp_path,
        nodes=3,
        rule_for={"FabricscopeInfinibandPortDown": "2s"},
    ) as lab:
        lab.wait_scraped()
        assert lab.prometheus.query('ALERTS{alertstate="firing"}') == []
        assert lab.webhook.alerts() == []
        down_at = time.monotonic()
        lab.take_down(NODE, DEVICE)

        def is_(name: str, status: str) -> object:
            return lambda a: _labels(a)["alertname"] == name and a["status"] == status

        port_down = lab.webhook.wait_for(
            is_("FabricscopeInfinibandPortDown", "firing"), timeout=30, what="PortDown firing"
        )
        fired_in = time.monotonic() - down_at
        labels = _labels(port_down)
        assert (labels["instance"], labels["device"], labels["port"]) == (NODE, DEVICE, "1")
        assert labels["severity"] == "critical"
        annotations = port_down["annotations"]
        assert isinstance(annotations, dict)
        assert annotations["summary"] == f"RDMA port {DEVICE}/1 on {NODE} is down."
        assert annotations["runbook_url"].endswith("#fabricscopeinfinibandportdown")
        downed = lab.webhook.wait_for(
            is_("FabricscopeInfinibandLinkDowned", "firing"), timeout=15, what="LinkDowned"
        )
        assert (_labels(downed)["instance"], _labels(downed)["device"]) == (NODE, DEVICE)

        lab.bring_up(NODE, DEVICE)
        lab.webhook.wait_for(
            is_("FabricscopeInfinibandPortDown", "resolved"), timeout=30, what="PortDown resolved"
        )
        lab.check()
        # the agents read every file the stepper rewrote, with no read error
        errors = lab.prometheus.query(
            'max_over_time(fabricscope_sampler_read_errors{sampler="infiniband"}[1m])'
        )
        assert len(errors) == 3 and all(e.value == 0 for e in errors), errors
        assert not any("Traceback" in a.log_tail(200) for a in lab.agents)
        # nothing else: only the planted port, on the planted node
        for alert in lab.webhook.alerts():
            labels = _labels(alert)
            assert (labels.get("instance"), labels.get("device")) == (NODE, DEVICE), labels
    print(
        f"PortDown at the webhook {fired_in:.1f} s after the link went down; "
        f"whole test {time.monotonic() - t0:.1f} s"
    )
    assert time.monotonic() - t0 < 60


def test_explain_names_the_port_from_the_live_fleet(tmp_path: Path) -> None:
    """``fabricscope explain`` (a real subprocess) against the Prometheus that scraped the
    three real agents for two minutes: node-01's mlx5_4 went DOWN 45 s in. Live mode has no
    throughput (see tests/lab/live.py), so the SRE's ``--change-at`` gives the time; the job
    is found from its pods (attribution through each node's kubelet pod-resources socket),
    and that port ranks first with the link down as evidence; nothing else stands out."""
    with LiveLab(SCENARIOS["healthy"], tmp_path, nodes=3) as lab:
        lab.wait_scraped()
        start = time.time()
        time.sleep(45)
        down_at = time.time()
        lab.take_down(NODE, DEVICE)
        time.sleep(max(0.0, start + 125 - time.time()))
        end = time.time()
        run = subprocess.run(
            [
                *(sys.executable, "-m", "exporter.cli", "explain"),
                *("--prometheus.url", lab.prometheus.url, "--job", JOB_NAME),
                *("--namespace", NAMESPACE, "--since", f"{start:.3f}", "--until", f"{end:.3f}"),
                *("--change-at", f"{down_at:.3f}", "--format", "json"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=ROOT,
        )
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout)
    assert report["footprint"]["instances"] == ["node-00", "node-01", "node-02"]
    top, *rest = report["findings"]
    assert (top["cause"], top["instance"], top["stands_out"]) == ("ib_link", NODE, True), top
    assert top["device"].startswith(f"{NODE} {DEVICE}/1"), top
    evidence = " | ".join(top["evidence"])
    assert "port up (share of time): 1 ->" in evidence and "link down events" in evidence
    assert not any(f["stands_out"] for f in rest), rest[:3]
    print(f"explain against the live fleet: #1 {top['device']} score {top['score']}: {evidence}")
