"""The Helm chart itself (deploy/helm/fabricscope): ``helm lint --strict`` with every values
set, its generated files against their sources, its values schema, and what it renders
against the kustomize manifests it replaced (tests/fixtures/deploy/kustomize/: the chart must
deploy the same agent, object for object, apart from the differences listed here).

The properties of what it renders (RBAC, security context, mounts, flags, schema validation)
are in tests/deploy/test_deploy.py.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.probe.schedule.membership import parse_peers
from tests.helmchart import (
    CHART,
    NAMESPACE,
    PROBE_SECRET,
    RELEASE,
    ROOT,
    VALUES,
    helm,
    render,
    render_fails,
    run_helm,
    template_args,
)

Doc = dict[str, Any]
KUSTOMIZE = Path(__file__).resolve().parents[1] / "fixtures" / "deploy" / "kustomize"

#: labels only one of the two tools adds (helm's release bookkeeping, kustomize's managed-by)
BOOKKEEPING = frozenset(
    {
        "helm.sh/chart",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/version",
        "app.kubernetes.io/managed-by",
    }
)
#: lists whose order carries no meaning (kustomize's strategic merge puts patched items first)
NAMED_LISTS = frozenset({"env", "volumes", "volumeMounts", "ports"})
#: the relabeling the chart adds to every scrape endpoint, so the job label (which the alert
#: rules select) stays "fabricscope" whatever the release is called; kustomize's job was the
#: Service's name, always "fabricscope"
JOB_RELABEL = {"targetLabel": "job", "replacement": "fabricscope", "action": "replace"}
#: and the one that drops the agent pod's own target labels (the Operator's namespace, service,
#: pod, container), which kustomize's monitor kept: a rollout renamed every series
TARGET_LABELS_DROP = {"action": "labeldrop", "regex": "(namespace|service|pod|container)"}


def kustomize_build(name: str) -> list[Doc]:
    return [d for d in yaml.safe_load_all((KUSTOMIZE / f"{name}.yaml").read_text()) if d]


def normalise(node: Any, key: str = "") -> Any:
    if isinstance(node, dict):
        out = {k: normalise(v, k) for k, v in node.items()}
        if key in ("labels", "matchLabels", "selector") and all(
            isinstance(v, str) for v in out.values()
        ):
            out = {k: v for k, v in out.items() if k not in BOOKKEEPING}
        if key == "secret" and "secretName" in out and out["secretName"].startswith(PROBE_SECRET):
            # kustomize's secretGenerator suffixed a content hash; the chart takes the name of
            # the administrator's Secret
            out["secretName"] = PROBE_SECRET
        if key == "resources":
            # the memory request and limit were set again from a measurement
            # (bench/bench_sizing.py); tests/test_deploy.py holds the values
            out = {k: {n: q for n, q in v.items() if n != "memory"} for k, v in out.items()}
        if out.get("kind") == "ClusterRole" and "rules" in out:
            # kustomize's ClusterRole also granted get on pods, which no code uses
            out["rules"] = [
                {**r, "verbs": [v for v in r["verbs"] if v != "get"]} for r in out["rules"]
            ]
        if "relabelings" in out:
            out["relabelings"] = [
                r for r in out["relabelings"] if r not in (JOB_RELABEL, TARGET_LABELS_DROP)
            ]
        return out
    if isinstance(node, list):
        items = [normalise(v) for v in node]
        if key in NAMED_LISTS:
            items.sort(key=lambda d: str(d.get("name", d.get("containerPort"))))
        if key == "add":
            items.sort()
        return items
    return node


def by_identity(docs: list[Doc]) -> dict[tuple[str, str], Doc]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


@pytest.mark.parametrize("build", sorted(p.stem for p in KUSTOMIZE.glob("*.yaml")))
def test_renders_what_kustomize_deployed(build: str, tmp_path: Path) -> None:
    """The default values give today's DaemonSet (and every other object) exactly; each old
    overlay or component is a values setting that gives what it gave."""
    old = by_identity(kustomize_build(build))
    new = by_identity(
        [
            d
            # the GPU Operator's client-label affinity is new in the chart (test_deploy.py)
            for d in render({**VALUES[build], "gpuOperator": {"clientLabel": "none"}}, tmp_path)
            # generated from their sources, compared with them below and in test_deploy.py
            if d["kind"] != "PrometheusRule"
            and "grafana_dashboard" not in d["metadata"].get("labels", {})
        ]
    )
    # the chart creates neither the namespace (helm install -n, labelled by the
    # administrator: docs/install.md) nor the probe's Secret (the administrator's)
    dropped = {k for k in old if k[0] in ("Namespace", "Secret")}
    assert set(old) - dropped == set(new)
    for identity, doc in new.items():
        if identity == ("ConfigMap", "fabricscope-probe-peers"):
            assert parse_peers(doc["data"]["peers"]) == parse_peers(old[identity]["data"]["peers"])
            continue
        assert normalise(doc) == normalise(old[identity]), identity
    for monitor in (d for d in new.values() if d["kind"] == "ServiceMonitor"):
        assert JOB_RELABEL in monitor["spec"]["endpoints"][0]["relabelings"]
        assert TARGET_LABELS_DROP in monitor["spec"]["endpoints"][0]["relabelings"]


def test_normalise_still_sees_a_change(tmp_path: Path) -> None:
    """The comparison above is not blind: a changed flag, mount or capability shows."""
    (ds,) = [d for d in kustomize_build("standard") if d["kind"] == "DaemonSet"]
    for change in (
        lambda c: c["args"].append("--log.level=debug"),
        lambda c: c["volumeMounts"][0].update(readOnly=False),
        lambda c: c["securityContext"]["capabilities"]["add"].append("NET_ADMIN"),
    ):
        changed = copy.deepcopy(ds)
        change(changed["spec"]["template"]["spec"]["containers"][0])
        assert normalise(changed) != normalise(ds)


@pytest.mark.parametrize("build", sorted(VALUES))
def test_lint_strict(build: str, tmp_path: Path) -> None:
    out = run_helm("lint", "--strict", str(CHART), values=VALUES[build], tmp=tmp_path)
    assert "1 chart(s) linted, 0 chart(s) failed" in out


def test_chart_files_are_the_sources() -> None:
    """files/ holds generated copies of deploy/rules and dashboards/*.json (helm cannot read
    outside the chart); scripts/sync_chart.py regenerates them."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "sync_chart.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    rules = sorted(p.name for p in (CHART / "files" / "rules").iterdir())
    assert rules == sorted(p.name for p in (ROOT / "deploy" / "rules").glob("*.rules.yaml"))


def ignore_non_json(directory: str, names: list[str]) -> list[str]:
    return [n for n in names if not n.endswith(".json")]


def test_sync_check_names_a_stale_copy(tmp_path: Path) -> None:
    chart_copy = tmp_path / "repo"
    shutil.copytree(ROOT / "deploy", chart_copy / "deploy")
    shutil.copytree(ROOT / "dashboards", chart_copy / "dashboards", ignore=ignore_non_json)
    (chart_copy / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "sync_chart.py", chart_copy / "scripts")
    stale = chart_copy / "deploy/helm/fabricscope/files/rules/agent.rules.yaml"
    stale.write_text(stale.read_text() + "# edited in the chart, not at the source\n")
    (chart_copy / "deploy/helm/fabricscope/files/dashboards/old.json").write_text("{}")
    result = subprocess.run(
        [sys.executable, str(chart_copy / "scripts" / "sync_chart.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert "files/rules/agent.rules.yaml: missing or differs" in result.stderr
    assert "files/dashboards/old.json: no source any more" in result.stderr
    subprocess.run([sys.executable, str(chart_copy / "scripts" / "sync_chart.py")], check=True)
    assert stale.read_text() == (ROOT / "deploy/rules/agent.rules.yaml").read_text()
    assert not (chart_copy / "deploy/helm/fabricscope/files/dashboards/old.json").exists()


def test_dashboards_are_the_generated_json(tmp_path: Path) -> None:
    docs = render({"dashboards": {"enabled": True, "namespace": "monitoring"}}, tmp_path)
    maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    sources = sorted((ROOT / "dashboards").glob("*.json"))
    assert sorted(maps) == sorted(f"fabricscope-{p.stem}-dashboard" for p in sources)
    for path in sources:
        cm = maps[f"fabricscope-{path.stem}-dashboard"]
        assert cm["metadata"]["namespace"] == "monitoring"
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"]["grafana_folder"] == "Fabricscope"
        assert json.loads(cm["data"][path.name]) == json.loads(path.read_text())


def test_probe_rules_only_with_the_probe(tmp_path: Path) -> None:
    def groups(values: Doc) -> list[str]:
        docs = render(values, tmp_path)
        (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
        return [g["name"] for g in rule["spec"]["groups"]]

    assert "fabricscope-probe" not in groups({})
    assert "fabricscope-probe" in groups(VALUES["probe"])


def test_another_release_name(tmp_path: Path) -> None:
    """Two releases never collide (cluster-scoped RBAC included), and the job label the alert
    rules select stays fabricscope."""
    out = run_helm("template", "gpu-mon", str(CHART), "--namespace", "observability", tmp=tmp_path)
    docs = [d for d in yaml.safe_load_all(out) if d]
    names = {d["metadata"]["name"] for d in docs}
    assert names == {"gpu-mon-fabricscope"}
    (binding,) = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpu-mon-fabricscope", "namespace": "observability"}
    ]
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    assert ds["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "fabricscope",
        "app.kubernetes.io/instance": "gpu-mon",
    }
    (sm,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert JOB_RELABEL in sm["spec"]["endpoints"][0]["relabelings"]
    assert sm["spec"]["namespaceSelector"]["matchNames"] == ["observability"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"serviceMonitor": {"enable": True}}, "additional properties 'enable' not allowed"),
        ({"probe": {"secret": "x"}}, "additional properties 'secret' not allowed"),
        ({"image": {"digest": "latest"}}, "/image/digest"),
        ({"port": 0}, "/port"),
        ({"hostPaths": {"podLogs": "var/log/pods"}}, "/hostPaths/podLogs"),
        ({"hostPaths": {"kubeletRoot": ""}}, "/hostPaths/kubeletRoot"),
        ({"serviceMonitor": {"tlsConfig": {"ca": {"secret": {"name": "x"}}}}}, "missing"),
        ({"serviceMonitor": {"tlsConfig": {"servername": "x"}}}, "'servername' not allowed"),
        ({"podLabels": {"tier": 1}}, "/podLabels/tier"),
        ({"resources": {"limits": {"memory": "lots"}}}, "/resources/limits/memory"),
        ({"probe": {"enabled": True, "existingSecret": "s", "peers": ["a b"]}}, "/probe/peers"),
        ({"serviceMonitor": {"enabled": True}, "service": {"enabled": False}}, "needs service"),
        ({"web": {"tls": True}}, "web.tls needs web.existingSecret"),
        ({**VALUES["probe"], "hostNetwork": False}, "probe.enabled needs hostNetwork"),
    ],
)
def test_bad_values_are_refused_by_name(values: Doc, message: str, tmp_path: Path) -> None:
    assert message in render_fails(values, tmp_path)


def test_digest_wins_over_the_tag(tmp_path: Path) -> None:
    digest = "sha256:" + "ab" * 32
    docs = render({"image": {"digest": digest}}, tmp_path)
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    image = ds["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"registry.invalid/fabricscope@{digest}"


#: values that take a Kubernetes type the schema does not restate: checked where it lands, by
#: kubernetes-validate --strict on the rendered DaemonSet (tests/deploy/test_deploy.py)
FREE_FORM = {"affinity": "a core/v1 Affinity"}


def schema_gaps(values: Any, schema: Doc, path: str = "") -> list[str]:
    """Every place values.yaml and the schema disagree: a value the schema does not name, an
    object that accepts unknown keys, a schema entry values.yaml no longer has."""
    gaps = []
    if isinstance(values, dict) and "properties" in schema:
        if schema.get("additionalProperties") is not False:
            gaps.append(f"{path or '/'}: accepts unknown keys")
        props = schema["properties"]
        for key, value in values.items():
            if key not in props:
                gaps.append(f"{path}/{key}: not in the schema")
            else:
                gaps += schema_gaps(value, props[key], f"{path}/{key}")
        if values:  # an empty default ({}) is an optional Operator/Kubernetes object
            gaps += [
                f"{path}/{k}: in the schema, not in values.yaml" for k in props if k not in values
            ]
    elif isinstance(values, dict) and path.lstrip("/") not in FREE_FORM:
        # a map of free keys: its values must still be typed (labels: strings)
        if not isinstance(schema.get("additionalProperties"), dict):
            gaps.append(f"{path}: a map whose values are not typed")
    elif not isinstance(values, dict) and not {"type", "enum", "anyOf"} & set(schema):
        gaps.append(f"{path}: untyped")
    return gaps


def test_the_schema_covers_every_value() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert schema_gaps(values, schema) == []


def test_schema_gaps_sees_a_gap() -> None:
    schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}}},
    }
    assert schema_gaps({"a": {"b": "x", "c": 1}, "d": {"e": "f"}}, schema) == [
        "/a: accepts unknown keys",
        "/a/c: not in the schema",
        "/d: not in the schema",
    ]


def test_helm_package(tmp_path: Path) -> None:
    """``helm package`` makes the archive a chart repository serves, and the archive renders
    as the directory does (every template, file and the schema are in it)."""
    run_helm("package", str(CHART), "--destination", str(tmp_path))
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    archive = tmp_path / f"{chart['name']}-{chart['version']}.tgz"
    assert archive.is_file()
    from_dir = run_helm(*template_args())
    from_archive = run_helm("template", RELEASE, str(archive), "--namespace", NAMESPACE)
    assert from_archive == from_dir
    # the schema travels with it: a misspelt key is refused from the archive too
    refused = subprocess.run(
        [helm(), "template", "x", str(archive), "--set", "serviceMonitor.enable=true"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert refused.returncode != 0 and "'enable' not allowed" in refused.stderr


def test_notes_warn_of_a_tls_scrape_without_a_server_name_and_of_non_root(tmp_path: Path) -> None:
    """The targets are node IPs: without serverName the certificate must hold every node's IP,
    which the install notes say (``helm install --dry-run`` renders them offline); and what
    ``nonRoot`` gives up."""

    def notes(values: Doc) -> str:
        out = run_helm(
            "install",
            "--dry-run",
            RELEASE,
            str(CHART),
            "-n",
            NAMESPACE,
            values=values,
            tmp=tmp_path,
        )
        return out[out.index("NOTES:") :]

    web = {"existingSecret": "fabricscope-web", "tls": True}
    assert "tlsConfig.serverName is empty" in notes({"web": web})
    named = {"web": web, "serviceMonitor": {"tlsConfig": {"serverName": "fabricscope"}}}
    assert "tlsConfig.serverName" not in notes(named)
    plain = notes({})
    assert "tlsConfig.serverName" not in plain
    # nonRoot: what it gives up, in particular the counters' state across restarts
    assert "nonRoot is on" not in plain
    assert "nothing kept across\nrestarts" in notes({"nonRoot": True})
