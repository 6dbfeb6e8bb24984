"""What the Prometheus Operator makes of the chart's ServiceMonitor and PodMonitor: the Prometheus
scrape config its generator writes for them, so a real Prometheus can scrape with exactly the
target labels, relabelings and TLS settings that a cluster's Prometheus would.

Translated from the Operator's config generator (``pkg/prometheus/promcfg.go``) as its own
golden test files record it, not from memory:

- ServiceMonitor: ``pkg/prometheus/testdata/HonorLabelsOverriding.golden`` (commit 08eea10b)
  and ``GenerateRelabelConfig.golden`` (commit 19f9e6b9): job ``serviceMonitor/<ns>/<name>/<i>``,
  role ``endpoints``; relabelings in this order: ``job`` kept in ``__tmp_prometheus_job_name``;
  one ``keep`` per selector label on ``__meta_kubernetes_service_label_<l>`` and
  ``..._labelpresent_<l>`` (regex ``(<value>);true``); ``keep`` on the endpoint's port name;
  ``node`` or ``pod`` from the endpoint address's target; then the four target labels every
  endpoint gets, ``namespace``, ``service``, ``pod`` and ``container``; ``drop`` of Failed and
  Succeeded pods; ``job`` from the Service's name; ``endpoint`` from the port name; the
  endpoint's own ``relabelings``; last the sharding ``hashmod`` and ``keep`` (one shard here:
  ``$(SHARD)`` is 0). ``metricRelabelings`` become ``metric_relabel_configs`` as given.
- PodMonitor: ``EnforcedNamespaceLabelPodMonitor_Expected.golden`` (commit 39bdf1c0): job
  ``podMonitor/<ns>/<name>/<i>``, role ``pod``; ``drop`` of Failed and Succeeded pods first,
  ``keep`` on the container port's name, ``namespace``, ``container`` and ``pod``, ``job``
  ``<ns>/<name>``, ``endpoint``, the endpoint's ``relabelings``, sharding.
- TLS: the Operator copies the Secret keys a ``tlsConfig`` names into the Prometheus pod at
  ``/etc/prometheus/certs/secret_<namespace>_<secret>_<key>`` and writes ``ca_file`` (and
  ``server_name``) pointing there; the ``ca_file``/``server_name`` pair is as in a Prometheus
  configuration the Operator generated, published in a public issue thread. Here the files are
  wherever the test put them (``secret_files``). Basic auth: the Operator reads the two Secret
  keys and writes ``basic_auth`` with their values.

Kubernetes service discovery needs an API server, which does not run here: the targets are
given through ``file_sd_configs`` with the same ``__meta_kubernetes_*`` labels the endpoints
and pod roles attach (:func:`endpoints_target`, :func:`pod_target`), so every relabeling runs
in the real Prometheus on the labels it would see in a cluster.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

Doc = dict[str, Any]

#: the Operator's spelling of a relabel config (camelCase) -> Prometheus's (snake_case)
_RELABEL_KEYS = {
    "sourceLabels": "source_labels",
    "separator": "separator",
    "targetLabel": "target_label",
    "regex": "regex",
    "modulus": "modulus",
    "replacement": "replacement",
    "action": "action",
}


def _label_name(name: str) -> str:
    """How Kubernetes SD turns a Kubernetes label into a meta-label suffix."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def relabel(config: Doc) -> Doc:
    """One relabeling as the Operator writes it into the scrape config (action lowercased)."""
    out = {_RELABEL_KEYS[k]: v for k, v in config.items()}
    if "action" in out:
        out["action"] = str(out["action"]).lower()
    return out


def _sharding() -> list[Doc]:
    return [
        {
            "source_labels": ["__address__"],
            "target_label": "__tmp_hash",
            "modulus": 1,
            "action": "hashmod",
        },
        {"source_labels": ["__tmp_hash"], "regex": "0", "action": "keep"},
    ]


def _endpoint_settings(
    endpoint: Doc, namespace: str, secret_files: Mapping[tuple[str, str], Path]
) -> Doc:
    out: Doc = {"honor_labels": bool(endpoint.get("honorLabels", False))}
    for key, name in (
        ("interval", "scrape_interval"),
        ("scrapeTimeout", "scrape_timeout"),
        ("path", "metrics_path"),
        ("scheme", "scheme"),
    ):
        if key in endpoint:
            out[name] = endpoint[key]
    tls = endpoint.get("tlsConfig")
    if tls:
        tls_config: Doc = {}
        if "ca" in tls:
            ref = tls["ca"]["secret"]
            tls_config["ca_file"] = str(secret_files[(ref["name"], ref["key"])])
        if "serverName" in tls:
            tls_config["server_name"] = tls["serverName"]
        tls_config["insecure_skip_verify"] = bool(tls.get("insecureSkipVerify", False))
        out["tls_config"] = tls_config
    auth = endpoint.get("basicAuth")
    if auth:
        out["basic_auth"] = {
            "username": secret_files[(auth["username"]["name"], auth["username"]["key"])]
            .read_text()
            .strip(),
            "password": secret_files[(auth["password"]["name"], auth["password"]["key"])]
            .read_text()
            .strip(),
        }
    del namespace  # the Secrets are in the monitor's namespace; the test's files stand for them
    return out


def service_monitor_config(
    monitor: Doc,
    targets_file: Path,
    secret_files: Mapping[tuple[str, str], Path] | None = None,
) -> Doc:
    """The scrape config the Operator generates for ``monitor``'s first endpoint."""
    assert monitor["kind"] == "ServiceMonitor"
    meta, spec = monitor["metadata"], monitor["spec"]
    (endpoint,) = spec["endpoints"]
    relabels: list[Doc] = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
    for key, value in sorted(spec["selector"].get("matchLabels", {}).items()):
        name = _label_name(key)
        relabels.append(
            {
                "action": "keep",
                "source_labels": [
                    f"__meta_kubernetes_service_label_{name}",
                    f"__meta_kubernetes_service_labelpresent_{name}",
                ],
                "regex": f"({value});true",
            }
        )
    relabels += [
        {
            "action": "keep",
            "source_labels": ["__meta_kubernetes_endpoint_port_name"],
            "regex": endpoint["port"],
        },
        {
            "source_labels": [
                "__meta_kubernetes_endpoint_address_target_kind",
                "__meta_kubernetes_endpoint_address_target_name",
            ],
            "separator": ";",
            "regex": "Node;(.*)",
            "replacement": "${1}",
            "target_label": "node",
        },
        {
            "source_labels": [
                "__meta_kubernetes_endpoint_address_target_kind",
                "__meta_kubernetes_endpoint_address_target_name",
            ],
            "separator": ";",
            "regex": "Pod;(.*)",
            "replacement": "${1}",
            "target_label": "pod",
        },
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {
            "action": "drop",
            "source_labels": ["__meta_kubernetes_pod_phase"],
            "regex": "(Failed|Succeeded)",
        },
        {
            "source_labels": ["__meta_kubernetes_service_name"],
            "target_label": "job",
            "replacement": "${1}",
        },
        {"target_label": "endpoint", "replacement": endpoint["port"]},
        *(relabel(r) for r in endpoint.get("relabelings", [])),
        *_sharding(),
    ]
    return {
        "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/0",
        **_endpoint_settings(endpoint, meta["namespace"], secret_files or {}),
        "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "1s"}],
        "relabel_configs": relabels,
        "metric_relabel_configs": [relabel(r) for r in endpoint.get("metricRelabelings", [])],
    }


def pod_monitor_config(
    monitor: Doc,
    targets_file: Path,
    secret_files: Mapping[tuple[str, str], Path] | None = None,
) -> Doc:
    """The scrape config the Operator generates for ``monitor``'s first endpoint."""
    assert monitor["kind"] == "PodMonitor"
    meta, spec = monitor["metadata"], monitor["spec"]
    (endpoint,) = spec["podMetricsEndpoints"]
    relabels: list[Doc] = [
        {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
        {
            "action": "drop",
            "source_labels": ["__meta_kubernetes_pod_phase"],
            "regex": "(Failed|Succeeded)",
        },
    ]
    for key, value in sorted(spec["selector"].get("matchLabels", {}).items()):
        name = _label_name(key)
        relabels.append(
            {
                "action": "keep",
                "source_labels": [
                    f"__meta_kubernetes_pod_label_{name}",
                    f"__meta_kubernetes_pod_labelpresent_{name}",
                ],
                "regex": f"({value});true",
            }
        )
    relabels += [
        {
            "action": "keep",
            "source_labels": ["__meta_kubernetes_pod_container_port_name"],
            "regex": endpoint["port"],
        },
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"},
        {"target_label": "endpoint", "replacement": endpoint["port"]},
        *(relabel(r) for r in endpoint.get("relabelings", [])),
        *_sharding(),
    ]
    return {
        "job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/0",
        **_endpoint_settings(endpoint, meta["namespace"], secret_files or {}),
        "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "1s"}],
        "relabel_configs": relabels,
        "metric_relabel_configs": [relabel(r) for r in endpoint.get("metricRelabelings", [])],
    }


def with_prometheus_settings(
    config: Doc, *, override_honor_labels: bool = False, enforced_namespace_label: str = ""
) -> Doc:
    """``config`` as the Operator writes it under two settings of the Prometheus resource:
    ``overrideHonorLabels`` forces ``honor_labels`` off (``HonorLabelsOverriding.golden``);
    ``enforcedNamespaceLabel`` sets that label to the monitor's namespace after the monitor's
    own relabelings (before sharding) and again last among ``metric_relabel_configs``
    (``EnforcedNamespaceLabelServiceMonitor_Expected.golden``, commit 6adcebc5)."""
    out = dict(config)
    if override_honor_labels:
        out["honor_labels"] = False
    if enforced_namespace_label:
        namespace = config["job_name"].split("/")[1]
        enforce = {"target_label": enforced_namespace_label, "replacement": namespace}
        relabels = list(config["relabel_configs"])
        sharding = len(_sharding())
        out["relabel_configs"] = [*relabels[:-sharding], enforce, *relabels[-sharding:]]
        out["metric_relabel_configs"] = [*config["metric_relabel_configs"], enforce]
    return out


def endpoints_target(
    address: str, *, namespace: str, service: Doc, pod: str, node: str, container: str = "agent"
) -> Doc:
    """One file_sd entry carrying the meta labels Kubernetes SD's ``endpoints`` role attaches
    to an address of ``service`` backed by ``pod`` (on ``node``), port ``metrics``."""
    labels = {
        "__meta_kubernetes_namespace": namespace,
        "__meta_kubernetes_service_name": service["metadata"]["name"],
        "__meta_kubernetes_endpoint_port_name": "metrics",
        "__meta_kubernetes_endpoint_port_protocol": "TCP",
        "__meta_kubernetes_endpoint_ready": "true",
        "__meta_kubernetes_endpoint_address_target_kind": "Pod",
        "__meta_kubernetes_endpoint_address_target_name": pod,
        "__meta_kubernetes_endpoint_node_name": node,
        "__meta_kubernetes_pod_name": pod,
        "__meta_kubernetes_pod_node_name": node,
        "__meta_kubernetes_pod_container_name": container,
        "__meta_kubernetes_pod_container_port_name": "metrics",
        "__meta_kubernetes_pod_phase": "Running",
        "__meta_kubernetes_pod_ready": "true",
    }
    for key, value in service["metadata"].get("labels", {}).items():
        labels[f"__meta_kubernetes_service_label_{_label_name(key)}"] = value
        labels[f"__meta_kubernetes_service_labelpresent_{_label_name(key)}"] = "true"
    return {"targets": [address], "labels": labels}


def pod_target(
    address: str, *, namespace: str, pod_labels: Mapping[str, str], pod: str, node: str
) -> Doc:
    """One file_sd entry with the meta labels Kubernetes SD's ``pod`` role attaches to the
    container port ``metrics`` of ``pod`` (on ``node``)."""
    labels = {
        "__meta_kubernetes_namespace": namespace,
        "__meta_kubernetes_pod_name": pod,
        "__meta_kubernetes_pod_node_name": node,
        "__meta_kubernetes_pod_container_name": "agent",
        "__meta_kubernetes_pod_container_port_name": "metrics",
        "__meta_kubernetes_pod_container_port_protocol": "TCP",
        "__meta_kubernetes_pod_phase": "Running",
        "__meta_kubernetes_pod_ready": "true",
    }
    for key, value in pod_labels.items():
        labels[f"__meta_kubernetes_pod_label_{_label_name(key)}"] = value
        labels[f"__meta_kubernetes_pod_labelpresent_{_label_name(key)}"] = "true"
    return {"targets": [address], "labels": labels}
