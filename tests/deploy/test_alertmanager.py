"""The shipped alert routing (deploy/alertmanager/alertmanager.yml and the chart's
AlertmanagerConfig): amtool accepts it and routes every shipped alert by its severity; the
chart renders the same tree, valid against the Prometheus Operator's AlertmanagerConfig CRD
and off by default; a real Alertmanager running it notifies one page or ticket per node and
cause, nothing for info, and keeps symptoms quiet under a down node, port or GPU.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.alert_routing import AM_CONFIG, deliver
from tests.deploy.test_alerts import ALERTS
from tests.helmchart import CHART, run_helm, strict_schema

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "tests" / "fixtures" / "crds" / "0alertmanagerconfigCustomResourceDefinition.yaml"
AMTOOL = shutil.which("amtool") or "/usr/bin/amtool"
RECEIVER = {
    "critical": "fabricscope-page",
    "warning": "fabricscope-ticket",
    "info": "fabricscope-record",
}

Doc = dict[str, Any]


class _CrdLoader(yaml.SafeLoader):
    """YAML 1.1 reads a bare ``=`` (a matchType enum value in the CRD) as the "value" tag."""


def _plain(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> str:
    return str(loader.construct_scalar(node))


_CrdLoader.add_constructor("tag:yaml.org,2002:value", _plain)


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AMTOOL, *args], capture_output=True, text=True, check=False, timeout=60)


def test_amtool_accepts_the_configuration() -> None:
    r = amtool("check-config", str(AM_CONFIG))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "5 inhibit rules" in r.stdout


@pytest.mark.parametrize("alert", ALERTS, ids=lambda a: a.name)
def test_every_shipped_alert_routes_by_its_severity(alert: Any) -> None:
    severity = alert.rule["labels"]["severity"]
    r = amtool(
        "config", "routes", "test", f"--config.file={AM_CONFIG}",
        f"--verify.receivers={RECEIVER[severity]}",
        f"alertname={alert.name}", f"severity={severity}", "instance=node-a",
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr


def test_amtool_fails_a_wrong_route() -> None:
    """The routing test can fail: a page is not a ticket, anything else not ours."""
    r = amtool(
        "config", "routes", "test", f"--config.file={AM_CONFIG}",
        "--verify.receivers=fabricscope-ticket",
        "alertname=FabricscopeGpuLost", "severity=critical",
    )  # fmt: skip
    assert r.returncode != 0
    r = amtool(
        "config", "routes", "test", f"--config.file={AM_CONFIG}",
        "--verify.receivers=default", "alertname=KubePodCrashLooping", "severity=critical",
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr


# --- the chart's AlertmanagerConfig -----------------------------------------------------------


def render(values: list[str]) -> list[Doc]:
    out = run_helm("template", "fabricscope", str(CHART), "--namespace", "fabricscope", *values)
    return [d for d in yaml.safe_load_all(out) if d]


def crd_schema() -> Doc:
    """The CRD's openAPIV3Schema, tightened as the API server's strict field validation is."""
    crd = yaml.load(CRD.read_text(), Loader=_CrdLoader)
    assert crd["spec"]["names"]["kind"] == "AlertmanagerConfig"
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
    return strict_schema(version["schema"]["openAPIV3Schema"])


ENABLED = [
    "--set", "alertmanagerConfig.enabled=true",
    "--set-json", 'alertmanagerConfig.page={"webhookConfigs":[{"url":"http://pager.example/hook"}]}',
    "--set-json", 'alertmanagerConfig.ticket={"webhookConfigs":[{"url":"http://tickets.example/hook"}]}',
]  # fmt: skip


@pytest.fixture(scope="module")
def amc() -> Doc:
    docs = [d for d in render(ENABLED) if d["kind"] == "AlertmanagerConfig"]
    assert len(docs) == 1
    return docs[0]


def test_the_chart_renders_no_alertmanagerconfig_by_default() -> None:
    assert not [d for d in render([]) if d["kind"] == "AlertmanagerConfig"]


def test_the_alertmanagerconfig_validates_against_the_operator_crd(amc: Doc) -> None:
    assert amc["apiVersion"] == "monitoring.coreos.com/v1alpha1"
    assert amc["metadata"]["namespace"] == "fabricscope"
    jsonschema.Draft7Validator(crd_schema()).validate(amc)
    bad = copy.deepcopy(amc)
    bad["spec"]["route"]["group_by"] = ["alertname"]  # the file's spelling, not the CRD's
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(crd_schema()).validate(bad)
    bad = copy.deepcopy(amc)
    bad["spec"]["inhibitRules"][0]["sourceMatch"][0]["matchType"] = "~="
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(crd_schema()).validate(bad)


def _matchers(ms: list[Doc]) -> list[str]:
    return [f'{m["name"]}{m["matchType"]}"{m["value"]}"' for m in ms]


def test_the_alertmanagerconfig_is_the_shipped_file(amc: Doc) -> None:
    """Route, timers, receivers and inhibit rules: the CRD's form of the same tree."""
    shipped = yaml.safe_load(AM_CONFIG.read_text())
    ours = next(r for r in shipped["route"]["routes"] if r["receiver"] == "fabricscope-record")
    route = amc["spec"]["route"]
    assert route["receiver"] == ours["receiver"]
    assert _matchers(route["matchers"]) == ours["matchers"]
    assert route["groupBy"] == ours["group_by"]
    assert (route["groupWait"], route["groupInterval"], route["repeatInterval"]) == (
        ours["group_wait"], ours["group_interval"], ours["repeat_interval"],
    )  # fmt: skip
    assert [
        (r["receiver"], _matchers(r["matchers"]), r["repeatInterval"]) for r in route["routes"]
    ] == [(r["receiver"], r["matchers"], r["repeat_interval"]) for r in ours["routes"]]
    assert [
        (_matchers(i["sourceMatch"]), _matchers(i["targetMatch"]), i["equal"])
        for i in amc["spec"]["inhibitRules"]
    ] == [
        (i["source_matchers"], i["target_matchers"], i["equal"]) for i in shipped["inhibit_rules"]
    ]
    receivers = {r["name"]: r for r in amc["spec"]["receivers"]}
    assert set(receivers) == {"fabricscope-record", "fabricscope-page", "fabricscope-ticket"}
    assert receivers["fabricscope-page"]["webhookConfigs"] == [{"url": "http://pager.example/hook"}]
    assert set(receivers["fabricscope-record"]) == {"name"}


# --- a real Alertmanager ---------------------------------------------------------------------


def _a(alertname: str, severity: str, **labels: str) -> dict[str, str]:
    return {"alertname": alertname, "severity": severity, "job": "fabricscope", **labels}


LINK = {"port": "1"}
SCENE = [
    # node-1: a flapping cable on two ports (one notification: same alert, same node) and its
    # symbol errors (suppressed on the flapping port, not on the other)
    _a("FabricscopeInfinibandLinkDowned", "warning", instance="node-1", device="mlx5_0", **LINK),
    _a("FabricscopeInfinibandLinkDowned", "warning", instance="node-1", device="mlx5_3", **LINK),
    _a("FabricscopeInfinibandSymbolErrorsRising", "warning", instance="node-1", device="mlx5_0",
       **LINK),
    _a("FabricscopeInfinibandSymbolErrorsRising", "warning", instance="node-1", device="mlx5_4",
       **LINK),
    # node-2: a port down (a page) and its rate and flap below it (suppressed)
    _a("FabricscopeInfinibandPortDown", "critical", instance="node-2", device="mlx5_5", **LINK),
    _a("FabricscopeInfinibandPortRateDegraded", "warning", instance="node-2", device="mlx5_5",
       comparison="peers", **LINK),
    _a("FabricscopeInfinibandLinkFlapped", "info", instance="node-2", device="mlx5_5", **LINK),
    # node-3: a lost GPU (a page) and its XID and NVLink (suppressed); another GPU's XID is not
    _a("FabricscopeGpuLost", "critical", instance="node-3", gpu="1"),
    _a("FabricscopeGpuXidErrors", "warning", instance="node-3", gpu="1", reason="79"),
    _a("FabricscopeNvlinkDown", "warning", instance="node-3", gpu="1", link="4"),
    _a("FabricscopeGpuXidErrors", "warning", instance="node-3", gpu="5", reason="48"),
    # node-4: down; its PCIe alert is a symptom
    _a("FabricscopeAgentDown", "warning", instance="node-4"),
    _a("FabricscopePcieLinkWidthDegraded", "warning", instance="node-4", pci_bus_id="0000:3c:00.0"),
    # node-5: cordoned for maintenance; nothing about it notifies
    _a("FabricscopeNodeCordoned", "info", instance="node-5"),
    _a("FabricscopeInfinibandLinkDowned", "warning", instance="node-5", device="mlx5_0", **LINK),
    # info: records, no notification
    _a("FabricscopeGpuApplicationXid", "info", instance="node-6", gpu="0", reason="13"),
    _a("FabricscopeInfinibandLinkFlapped", "info", instance="node-7", device="mlx5_9", **LINK),
    # node-8 asks job llm's RAS: a rank it waits on (a page); the job's hang and its stalled
    # throughput on node-9 are the same event (suppressed); another job's stall is not
    _a("FabricscopeNcclRankUnresponsive", "critical", instance="node-8", namespace="ml",
       job_name="llm", rank="3"),
    _a("FabricscopeNcclJobHung", "critical", instance="node-8", namespace="ml", job_name="llm"),
    _a("FabricscopeThroughputStalled", "warning", instance="node-9", namespace="ml",
       job_name="llm"),
    _a("FabricscopeThroughputStalled", "warning", instance="node-9", namespace="ml",
       job_name="bert"),
    # one fleet-wide decision: one ticket
    {"alertname": "FabricscopeAcsP2pRedirectFleetwide", "severity": "warning",
     "vendor": "0x1000", "model": "0xc030"},
]  # fmt: skip


@pytest.fixture(scope="module")
def delivered(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return deliver(SCENE, tmp_path_factory.mktemp("alertmanager"))


def _key(ls: dict[str, str]) -> tuple[str, str]:
    return ls["alertname"], ls.get("instance", "")


def test_one_notification_per_node_and_cause(delivered: Any) -> None:
    groups = Counter(
        (b["receiver"], b["groupLabels"].get("alertname"), b["groupLabels"].get("instance", ""))
        for b in delivered.bodies
    )
    assert all(n == 1 for n in groups.values()), groups
    assert delivered.notifications == Counter({"fabricscope-page": 3, "fabricscope-ticket": 6})
    group = {"alertname": "FabricscopeInfinibandLinkDowned", "instance": "node-1"}
    linkdowned = next(b for b in delivered.bodies if b["groupLabels"] == group)
    assert sorted(a["labels"]["device"] for a in linkdowned["alerts"]) == ["mlx5_0", "mlx5_3"]


def test_symptoms_are_inhibited_under_their_cause(delivered: Any) -> None:
    suppressed = sorted(
        (_key(ls), ls.get("device") or ls.get("gpu") or ls.get("pci_bus_id", ""))
        for ls in delivered.suppressed
    )
    assert suppressed == [
        (("FabricscopeGpuXidErrors", "node-3"), "1"),
        (("FabricscopeInfinibandLinkDowned", "node-5"), "mlx5_0"),
        (("FabricscopeInfinibandLinkFlapped", "node-2"), "mlx5_5"),
        (("FabricscopeInfinibandPortRateDegraded", "node-2"), "mlx5_5"),
        (("FabricscopeInfinibandSymbolErrorsRising", "node-1"), "mlx5_0"),
        (("FabricscopeNcclJobHung", "node-8"), ""),
        (("FabricscopeNvlinkDown", "node-3"), "1"),
        (("FabricscopePcieLinkWidthDegraded", "node-4"), "0000:3c:00.0"),
        (("FabricscopeThroughputStalled", "node-9"), ""),
    ]  # fmt: skip
    notified = {
        (_key(a["labels"]), a["labels"].get("gpu", ""))
        for b in delivered.bodies
        for a in b["alerts"]
    }
    assert (("FabricscopeGpuXidErrors", "node-3"), "5") in notified
    stalled = [a["labels"]["job_name"] for b in delivered.bodies for a in b["alerts"]
               if a["labels"]["alertname"] == "FabricscopeThroughputStalled"]  # fmt: skip
    assert stalled == ["bert"]


def test_info_is_recorded_never_notified(delivered: Any) -> None:
    assert {_key(ls) for ls in delivered.recorded} == {
        ("FabricscopeGpuApplicationXid", "node-6"),
        ("FabricscopeInfinibandLinkFlapped", "node-7"),
        ("FabricscopeNodeCordoned", "node-5"),
    }
    notified = {a["labels"]["severity"] for b in delivered.bodies for a in b["alerts"]}
    assert notified == {"critical", "warning"}
