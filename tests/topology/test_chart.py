"""The chart's topology controller (topology.enabled, off by default): what it renders
validates strictly (kubernetes-validate), its ServiceAccount may get, list and patch nodes
and nothing else, its pod is selected by neither the agents' DaemonSet nor their Service, and
its arguments are ones the real ``fabricscope`` parser accepts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from exporter.cli.argtypes import parse_known
from exporter.cli.main import build_parser
from tests.deploy.test_deploy import kubernetes_validate
from tests.helmchart import helm, render, render_fails, run_helm, template_args

ON: dict[str, Any] = {
    "ibpeer": {"enabled": True},
    "topology": {"enabled": True, "prometheusUrl": "http://prometheus-operated.monitoring:9090"},
}


def kinds(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def test_off_by_default(tmp_path: Path) -> None:
    assert not [d for d in render({}, tmp_path) if "topology" in d["metadata"]["name"]]


def test_the_controller_renders_with_least_privilege(tmp_path: Path) -> None:
    docs = render(ON, tmp_path)
    objs = kinds(docs)
    role = objs[("ClusterRole", "fabricscope-topology")]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]}
    ]
    binding = objs[("ClusterRoleBinding", "fabricscope-topology")]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "fabricscope-topology", "namespace": "fabricscope"}
    ]
    dep = objs[("Deployment", "fabricscope-topology")]
    pod = dep["spec"]["template"]
    assert pod["spec"]["serviceAccountName"] == "fabricscope-topology"
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    ctr = pod["spec"]["containers"][0]
    assert ctr["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert ctr["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    # neither the agents' DaemonSet nor their Service selects the controller's pod
    labels = pod["metadata"]["labels"]
    for kind in ("DaemonSet", "Service"):
        obj = next(d for d in docs if d["kind"] == kind)
        sel = obj["spec"]["selector"]
        sel = sel.get("matchLabels", sel)
        assert not sel.items() <= labels.items(), kind
    # the arguments are the real parser's
    ns = parse_known(build_parser(), ctr["args"])
    assert ns.command == "topology-controller"
    assert ns.hold_down == 600 and ns.interval == 60 and ns.max_removals == 0.1
    assert ns.prom_url == "http://prometheus-operated.monitoring:9090"
    assert ns.label_prefix == "fabric.topograph.run/"
    # the agents' RBAC is unchanged: nothing of theirs touches nodes
    agents = objs[("ClusterRole", "fabricscope")]
    assert all("nodes" not in r["resources"] for r in agents["rules"])
    ours = [d for d in docs if d["metadata"]["name"].endswith("-topology")]
    assert len(ours) == 4
    for version in ("1.29", "1.33"):
        out = kubernetes_validate(ours, version, tmp_path)
        assert out.count(" passed for resource ") == 4 and "WARN" not in out, out


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"topology": {"enabled": True}}, "topology.prometheusUrl"),
        ({"topology": {**ON["topology"]}}, "needs ibpeer.enabled"),
        ({**ON, "topology": {**ON["topology"], "holdDown": "1.5h"}}, "holdDown"),
        ({**ON, "topology": {**ON["topology"], "labelPrefix": "Bad/"}}, "labelPrefix"),
        ({**ON, "topology": {**ON["topology"], "maxRemovals": 2}}, "maxRemovals"),
        ({**ON, "topology": {**ON["topology"], "holddown": "5m"}}, "holddown"),
    ],
)
def test_bad_values_are_refused(values: dict[str, Any], message: str, tmp_path: Path) -> None:
    assert message in render_fails(values, tmp_path)


def test_lint_strict_with_the_controller(tmp_path: Path) -> None:
    helm()
    run_helm("lint", "--strict", *template_args()[2:3], values=ON, tmp=tmp_path)
