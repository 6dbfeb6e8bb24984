"""The chart's topology controller (topology.enabled, off by default): what it renders
validates strictly (kubernetes-validate), its ServiceAccount may get, list and patch nodes
and nothing else, its pod is selected by neither the agents' DaemonSet nor their Service, and
its arguments are ones the real ``fabricscope`` parser accepts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import celpy
import pytest
from celpy.adapter import json_to_cel

from exporter.cli.argtypes import parse_known
from exporter.cli.main import build_parser
from tests.deploy.test_deploy import kubernetes_validate
from tests.helmchart import helm, render, render_fails, run_helm, template_args
from tests.topology.nodes_api import node

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
    assert ns.label_accelerator == "accelerator.topograph.run/domain"
    # the agents' RBAC is unchanged: nothing of theirs touches nodes
    agents = objs[("ClusterRole", "fabricscope")]
    assert all("nodes" not in r["resources"] for r in agents["rules"])
    ours = [d for d in docs if d["metadata"]["name"].endswith("-topology")]
    assert len(ours) == 4
    for version in ("1.29", "1.33"):
        out = kubernetes_validate(ours, version, tmp_path)
        assert out.count(" passed for resource ") == 4 and "WARN" not in out, out
    policy = [d for d in docs if d["metadata"]["name"].endswith("-topology-labels")]
    assert {d["kind"] for d in policy} == {
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    out = kubernetes_validate(policy, "1.33", tmp_path)
    assert out.count(" passed for resource ") == 2 and "WARN" not in out, out


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"topology": {"enabled": True}}, "topology.prometheusUrl"),
        ({"topology": {**ON["topology"]}}, "needs ibpeer.enabled"),
    ],
)
def test_bad_values_are_refused(values: dict[str, Any], message: str, tmp_path: Path) -> None:
    assert message in render_fails(values, tmp_path)


def test_the_schema_refuses_each_bad_value_by_name(tmp_path: Path) -> None:
    bad = {
        "holdDown": "1.5h",
        "labelPrefix": "Bad/",
        "acceleratorLabel": "no-prefix",
        "maxRemovals": 2,
        "holddown": "5m",
    }
    err = render_fails({**ON, "topology": {**ON["topology"], **bad}}, tmp_path)
    for key in bad:
        assert key in err, (key, err)


# --- the admission policy, evaluated with a CEL implementation (cel-python) ---------------

SA = "system:serviceaccount:fabricscope:fabricscope-topology"
T0 = "fabric.topograph.run/tier-0"


def _node(labels: dict[str, str], **extra: Any) -> dict[str, Any]:
    n = node("h1", labels, 1)
    n["metadata"].update(extra.pop("metadata", {}))
    n.update(extra)
    return n


def admitted(policy: dict[str, Any], old: dict[str, Any], new: dict[str, Any], user: str) -> bool:
    """The policy's verdict on an UPDATE of ``old`` to ``new`` by ``user``, as the API server
    evaluates it: match conditions, then variables, then every validation."""
    env = celpy.Environment()

    def run(expr: str, act: dict[str, Any]) -> Any:
        return env.program(env.compile(expr)).evaluate(act)

    act: dict[str, Any] = {
        "object": json_to_cel(new),
        "oldObject": json_to_cel(old),
        "request": json_to_cel({"userInfo": {"username": user}, "operation": "UPDATE"}),
    }
    spec = policy["spec"]
    if not all(run(c["expression"], act) for c in spec["matchConditions"]):
        return True
    variables: dict[str, Any] = {}
    for v in spec["variables"]:
        variables[v["name"]] = run(v["expression"], {**act, "variables": variables})
    act["variables"] = celpy.celtypes.MapType(
        {celpy.celtypes.StringType(k): v for k, v in variables.items()}
    )
    return all(bool(run(v["expression"], act)) for v in spec["validations"])


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    docs = render(ON, tmp_path_factory.mktemp("vap"))
    return next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy")


BASE = {"kubernetes.io/hostname": "h1", "example.com/rack": "r7"}


@pytest.mark.parametrize(
    ("new", "user", "allowed"),
    [
        (_node({**BASE, T0: "0x1"}), SA, True),  # adds a tier label
        (_node({**BASE, T0: "0x2", "fabric.topograph.run/tier-1": "0x9"}), SA, True),
        (_node(BASE), SA, True),  # removes its labels (the old node has tier-0 below)
        (_node({**BASE, T0: "0x1", "accelerator.topograph.run/domain": "u.1"}), SA, True),
        (_node({**BASE, T0: "0x1", "accelerator.topograph.run/sub-domain": "x"}), SA, False),
        (_node({**BASE, T0: "0x1", "example.com/evil": "1"}), SA, False),
        (_node({**BASE, T0: "0x1", "kubernetes.io/hostname": "h2"}), SA, False),
        (_node({"kubernetes.io/hostname": "h1", T0: "0x1"}), SA, False),  # drops another
        (_node({**BASE, T0: "0x1"}, spec={"unschedulable": True}), SA, False),
        (_node({**BASE, T0: "0x1"}, metadata={"annotations": {"x": "y"}}), SA, False),
        (_node({**BASE, T0: "0x1"}, metadata={"finalizers": ["x/y"]}), SA, False),
        (_node({**BASE, "example.com/evil": "1"}), "system:admin", True),  # not matched
    ],
)
def test_the_admission_policy_lets_the_controller_change_only_its_labels(
    policy: dict[str, Any], new: dict[str, Any], user: str, allowed: bool
) -> None:
    old = _node({**BASE, T0: "0x1"})
    assert admitted(policy, old, new, user) is allowed


def test_lint_strict_with_the_controller(tmp_path: Path) -> None:
    helm()
    run_helm("lint", "--strict", *template_args()[2:3], values=ON, tmp=tmp_path)


def test_spine_links_is_an_agent_flag_the_parser_accepts(tmp_path: Path) -> None:
    on = {**ON, "ibpeer": {"enabled": True, "spineLinks": True}}
    for values, want in ((ON, False), (on, True)):
        ds = next(d for d in render(values, tmp_path) if d["kind"] == "DaemonSet")
        args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
        assert ("--ibpeer.spine-links" in args) is want
    assert parse_known(build_parser(), ["agent", "--ibpeer.spine-links"]).ibpeer_spine_links
