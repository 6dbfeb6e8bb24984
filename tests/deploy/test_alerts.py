"""Alert rules (deploy/rules/*.yaml): promtool checks and unit tests, every metric and label an
expression uses exists in the catalog, every alert is tested both firing and quiet, every
runbook link lands on a heading of docs/alerts.md. The Helm chart ships the rule files
themselves (copies in deploy/helm/fabricscope/files/rules, checked by tests/deploy/test_helm.py).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from agent.probe.measure.records import REASONS as PROBE_REASONS
from exporter.metrics.catalog import all_specs
from exporter.metrics.spec import LABELS

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "rules"
RULE_TESTS = Path(__file__).resolve().parents[1] / "rules"
ALERTS_DOC = ROOT / "docs" / "alerts.md"
RUNBOOK_BASE = "https://github.com/fabricscope/fabricscope/blob/main/docs/alerts.md#"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

#: Series Prometheus makes itself (name -> labels of its own).
PROMETHEUS_SERIES: dict[str, tuple[str, ...]] = {
    "up": (),
    # kube-state-metrics, when Prometheus scrapes it (the maintenance rules)
    "kube_node_spec_unschedulable": ("node",),
}

#: Labels the scrape puts on every series (the ServiceMonitor's target labels).
TARGET_LABELS = frozenset(
    {"job", "instance", "namespace", "pod", "container", "service", "endpoint"}
)

#: Metrics an alert may use before the catalog has them (one being added in parallel), with
#: the labels it will have. Used only while the catalog lacks the name; once it has it, the
#: catalog is the authority (delete the entry then). Empty now: the probe alerts' metrics
#: (fabricscope_probe_busbw_bytes_per_second, fabricscope_probe_runs_total) landed in the
#: catalog with exporter/metrics/probe.py. Only fabricscope_probe_* names were ever pending.
PENDING_METRICS: dict[str, tuple[str, ...]] = {}

#: Labels a metric leaves empty on some of its series, which Prometheus then does not store
#: (an intra-node probe has no peer and no GPU pair: exporter/metrics/probe.py).
MAY_BE_EMPTY: dict[str, set[str]] = {
    "fabricscope_probe_busbw_bytes_per_second": {"peer", "gpu", "peer_gpu"},
    # a root port has no parent bridge; GPUs and NICs have no port type (exporter/metrics/pci.py)
    "fabricscope_pci_device_info": {"parent_pci_bus_id", "port_type", "driver"},
    # a rank on another node than the one that asks: no PCI bus id or pod known there
    "fabricscope_nccl_ras_rank_info": {"pci_bus_id", "pod"},
    # a device plugin's GPU has no claim, a whole GPU no MIG slice, a PF no physical function
    "fabricscope_pod_gpu_info": {"claim", "mig"},
    "fabricscope_pod_rdma_info": {"claim", "pf_device", "pf_pci_bus_id"},
}

SEVERITIES = ("critical", "warning", "info")

#: Series the recording rules make (name -> labels): the probe's localisation view of every
#: node pair (deploy/rules/probe.rules.yaml). Alerts may use them like catalog metrics.
RECORDED_SERIES: dict[str, tuple[str, ...]] = {
    "fabricscope:probe_pair_slow:last1h": ("instance", "peer"),
    "fabricscope:probe_pair_ok_directed:last1h": ("instance", "peer"),
    "fabricscope:probe_pair_ok:last1h": ("instance", "peer"),
    "fabricscope:probe_node_passes:last1h": ("instance",),
    "fabricscope:probe_bad_node:last1h": ("instance",),
    # the Fleet view, one series per node (deploy/rules/fleet.rules.yaml)
    "fabricscope:node_findings:count": ("instance",),
    "fabricscope:node_ports_down:count": ("instance",),
    "fabricscope:node_link_downs:increase1h": ("instance",),
    "fabricscope:node_port_error_rate:max5m": ("instance",),
    "fabricscope:node_transmit_wait_rate:max5m": ("instance",),
    "fabricscope:node_pfc_pause_sent_rate:max5m": ("instance",),
    "fabricscope:node_cnp_sent_rate:max5m": ("instance",),
    "fabricscope:node_sampler_duration:max": ("instance",),
    "fabricscope:node_sampler_failures:count": ("instance",),
    # non-root PCIe bridges with the ACS series per node and bridge model
    # (deploy/rules/hardware.rules.yaml)
    "fabricscope:acs_p2p_bridges:count": ("instance", "vendor", "model"),
    "fabricscope:acs_p2p_redirect_bridges:count": ("instance", "vendor", "model"),
    # fabricscope's GPUs and RDMA ports beside dcgm-exporter and node_exporter
    # (deploy/rules/joins.rules.yaml)
    "fabricscope:gpu_dcgm_sm_active:ratio": ("gpu", "uuid", "pci_bus_id"),
    "fabricscope:gpu_dcgm_graphics_active:ratio": ("gpu", "uuid", "pci_bus_id"),
    "fabricscope:gpu_dcgm_utilization:ratio": ("gpu", "uuid", "pci_bus_id"),
    "fabricscope:gpu_dcgm_activity:ratio": ("gpu", "uuid", "pci_bus_id", "field"),
    "fabricscope:infiniband_port_netdev_up": ("device", "port", "netdev"),
    "fabricscope:infiniband_port_netdev_receive_bytes:rate5m": ("device", "port", "netdev"),
    "fabricscope:infiniband_port_netdev_transmit_bytes:rate5m": ("device", "port", "netdev"),
    # stopped PMA counters per node (deploy/rules/hardware.rules.yaml)
    "fabricscope:infiniband_pma_saturated_counters:count": ("instance",),
    # nodes per NIC class and firmware release (deploy/rules/hardware.rules.yaml)
    "fabricscope:nic_firmware_nodes:count": ("namespace", "hca_type", "board_id", "fw_ver"),
}


@dataclass(frozen=True, slots=True)
class Foreign:
    """Another exporter's metric: the labels it writes (``optional``: only on some series or
    some versions) and where those label sets were seen."""

    labels: tuple[str, ...]
    optional: frozenset[str]
    source: str


_DCGM_SOURCE = (
    "dcgm-exporter /metrics as recorded in tests/fixtures/dcgm-exporter (NVIDIA/DCGM issue 226, "
    "NVIDIA/dcgm-exporter issues 250, 317, 512): pci_bus_id from 3.3.6, DCGM_FI_DRIVER_VERSION "
    "from 4.x, GPU_I_* on MIG instances, container/namespace/pod on GPUs a pod holds"
)
_DCGM = Foreign(
    (
        "gpu",
        "UUID",
        "pci_bus_id",
        "device",
        "modelName",
        "Hostname",
        "GPU_I_PROFILE",
        "GPU_I_ID",
        "DCGM_FI_DRIVER_VERSION",
        "container",
        "namespace",
        "pod",
    ),
    frozenset(
        {
            "pci_bus_id",
            "GPU_I_PROFILE",
            "GPU_I_ID",
            "DCGM_FI_DRIVER_VERSION",
            "container",
            "namespace",
            "pod",
        }
    ),
    _DCGM_SOURCE,
)
_NODE_NETCLASS = (
    "node_exporter 1.5.0 on the DGX fixture tree, recorded in "
    "tests/fixtures/node_exporter/dgx-h100.node_exporter-1.5.0.prom"
)
_NODE_NETDEV = (
    "node_exporter's own e2e fixture (collector/fixtures/e2e-output.txt): "
    'node_network_receive_bytes_total{device="eth0"}; the netdev collector reads the live host, '
    "not a sysfs tree"
)

#: Other exporters' metrics, allowed by name and only in the join rules
#: (deploy/rules/joins.rules.yaml) and their unit tests: no alert reads them.
FOREIGN_METRICS: dict[str, Foreign] = {
    "DCGM_FI_PROF_SM_ACTIVE": _DCGM,
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": _DCGM,
    "DCGM_FI_DEV_GPU_UTIL": _DCGM,
    "node_network_up": Foreign(("device",), frozenset(), _NODE_NETCLASS),
    "node_network_receive_bytes_total": Foreign(("device",), frozenset(), _NODE_NETDEV),
    "node_network_transmit_bytes_total": Foreign(("device",), frozenset(), _NODE_NETDEV),
}
JOIN_RULES = "joins.rules.yaml"


def catalog_labels() -> dict[str, tuple[str, ...]]:
    """Every metric name an alert may use -> its labels (catalog first, then pending)."""
    known = dict(PROMETHEUS_SERIES)
    known.update(RECORDED_SERIES)
    for name, labels in PENDING_METRICS.items():
        known[name] = labels
    for spec in all_specs():
        known[spec.name] = spec.labels
    return known


def catalog_help() -> dict[str, str]:
    return {spec.name: spec.help for spec in all_specs()}


# --- a small PromQL reader: selectors and grouping labels ---------------------------------

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
    |(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    |(?P<range>\[[^\]]*\])
    |(?P<duration>\d+(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*\b)
    |(?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
    |(?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
    |(?P<punct>[{}(),])
    |(?P<op>=~|!~|!=|==|<=|>=|[=<>+\-*/%^])
    """,
    re.VERBOSE,
)
_GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_KEYWORDS = _GROUPING | frozenset({"and", "or", "unless", "offset", "bool", "atan2"})


@dataclass(frozen=True, slots=True)
class Matcher:
    label: str
    op: str
    value: str


@dataclass(frozen=True, slots=True)
class Selector:
    name: str
    matchers: tuple[Matcher, ...]


@dataclass(slots=True)
class Query:
    selectors: list[Selector] = field(default_factory=list)
    grouping: set[str] = field(default_factory=set)


def _tokens(expr: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise ValueError(f"cannot read PromQL at {expr[pos : pos + 20]!r}")
        kind = m.lastgroup or ""
        if kind != "space":
            out.append((kind, m.group()))
        pos = m.end()
    return out


def _unquote(s: str) -> str:
    return s[1:-1].encode().decode("unicode_escape") if s[0] in "\"'" else s[1:-1]


def parse_query(expr: str) -> Query:
    """The metric selectors (with their matchers) and the grouping labels of ``expr``."""
    toks = _tokens(expr)
    q = Query()
    i = 0

    def at(j: int) -> str:
        return toks[j][1] if j < len(toks) else ""

    while i < len(toks):
        kind, text = toks[i]
        if kind != "ident":
            i += 1
            continue
        if text in _GROUPING:
            if at(i + 1) == "(":
                j = i + 2
                while at(j) != ")":
                    if toks[j][0] == "ident":
                        q.grouping.add(toks[j][1])
                    j += 1
                i = j + 1
            else:
                i += 1
            continue
        if text in _KEYWORDS or at(i + 1) in ("(", "by", "without"):
            i += 1  # a keyword, a function or an aggregation (`sum without (x) (...)`)
            continue
        matchers: list[Matcher] = []
        j = i + 1
        if at(j) == "{":
            j += 1
            while at(j) != "}":
                if at(j) == ",":
                    j += 1
                    continue
                label, op, value = toks[j][1], toks[j + 1][1], toks[j + 2]
                assert value[0] == "string", f"matcher value of {label} in {expr!r}"
                matchers.append(Matcher(label, op, _unquote(value[1])))
                j += 3
            j += 1
        q.selectors.append(Selector(text, tuple(matchers)))
        i = j
    return q


def test_query_reader_on_a_known_expression() -> None:
    q = parse_query(
        'sum without (reason) (increase(m_total{reason=~"io|parse", a="x"}[15m])) > 0 '
        "unless on (instance, device) other == 3 or m_total offset 15m "
        "and ignoring (pod) quantile by (gpu) (0.5, m_total)"
    )
    assert q.selectors == [
        Selector("m_total", (Matcher("reason", "=~", "io|parse"), Matcher("a", "=", "x"))),
        Selector("other", ()),
        Selector("m_total", ()),
        Selector("m_total", ()),
    ]
    assert q.grouping == {"reason", "instance", "device", "pod", "gpu"}


# --- the rules ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Alert:
    file: str
    group: str
    rule: dict[str, object]

    @property
    def name(self) -> str:
        return str(self.rule["alert"])

    @property
    def expr(self) -> str:
        return str(self.rule["expr"])


def rule_files() -> list[Path]:
    return sorted(RULES.glob("*.rules.yaml"))


def load_groups(path: Path) -> list[dict[str, object]]:
    doc = yaml.safe_load(path.read_text())
    assert set(doc) == {"groups"}, f"{path.name}: only `groups` at the top"
    groups: list[dict[str, object]] = doc["groups"]
    return groups


def alerts() -> Iterator[Alert]:
    for path in rule_files():
        for group in load_groups(path):
            rules = group["rules"]
            assert isinstance(rules, list)
            for rule in rules:
                if "record" not in rule:
                    yield Alert(path.name, str(group["name"]), rule)


ALERTS = list(alerts())


def test_rule_files_exist_and_every_rule_is_an_alert() -> None:
    assert [p.name for p in rule_files()] == [
        "agent.rules.yaml",
        "fleet.rules.yaml",
        "hardware.rules.yaml",
        "joins.rules.yaml",
        "maintenance.rules.yaml",
        "probe.rules.yaml",
        "ras.rules.yaml",
        "throughput.rules.yaml",
    ]
    for path in rule_files():
        for group in load_groups(path):
            assert str(group["name"]).startswith("fabricscope-")
            rules = group["rules"]
            assert isinstance(rules, list)
            for rule in rules:
                if "record" in rule:  # localisation and fleet views, see RECORDED_SERIES
                    assert rule["record"] in RECORDED_SERIES, rule["record"]
                    continue
                assert "alert" in rule, f"{path.name}: only alerting and recording rules here"
    names = [a.name for a in ALERTS]
    assert len(names) == len(set(names)), "alert names must be unique"


@pytest.mark.parametrize("path", rule_files(), ids=lambda p: p.name)
def test_promtool_check_rules(path: Path) -> None:
    result = subprocess.run(
        [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("alert", ALERTS, ids=lambda a: a.name)
def test_alert_shape(alert: Alert) -> None:
    rule = alert.rule
    assert alert.name.startswith("Fabricscope")
    assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}
    labels = rule["labels"]
    annotations = rule["annotations"]
    assert isinstance(labels, dict) and isinstance(annotations, dict)
    assert set(labels) == {"severity"}
    assert labels["severity"] in SEVERITIES
    assert set(annotations) == {"summary", "description", "runbook_url"}
    assert annotations["runbook_url"] == RUNBOOK_BASE + alert.name.lower()


def github_anchors(markdown: str) -> set[str]:
    """Anchors GitHub makes from headings: lower case, punctuation dropped, spaces -> '-'."""
    anchors = set()
    for line in markdown.splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


def test_every_runbook_anchor_is_a_heading_of_alerts_md() -> None:
    anchors = github_anchors(ALERTS_DOC.read_text())
    missing = [a.name for a in ALERTS if a.name.lower() not in anchors]
    assert not missing, f"docs/alerts.md has no heading for: {missing}"


@pytest.mark.parametrize("alert", ALERTS, ids=lambda a: a.name)
def test_alert_uses_only_catalog_metrics_and_their_labels(alert: Alert) -> None:
    known = catalog_labels()
    helps = catalog_help()
    q = parse_query(alert.expr)
    assert q.selectors, f"{alert.name}: no metric in {alert.expr!r}"
    used_labels: set[str] = set(TARGET_LABELS)
    for sel in q.selectors:
        assert sel.name in known, (
            f"{alert.name}: {sel.name} is neither in exporter.metrics.catalog "
            "nor in PENDING_METRICS"
        )
        labels = set(known[sel.name])
        used_labels |= labels
        for m in sel.matchers:
            assert m.label in labels | TARGET_LABELS, (
                f"{alert.name}: {sel.name} has no label {m.label} (it has {sorted(labels)})"
            )
            if m.label == "reason" and m.op in ("=", "=~"):
                # every value the alert names must be in the metric's reason vocabulary
                vocab = helps.get(sel.name, " ".join(PROBE_REASONS))
                for value in m.value.split("|"):
                    if sel.name == "fabricscope_gpu_xid_errors_total" and value.isdigit():
                        continue  # an XID's reason is its code, a number, not a word
                    assert re.search(rf"\b{re.escape(value)}\b", vocab), (
                        f"{alert.name}: reason {value!r} is not one {sel.name} uses"
                    )
    stray = q.grouping - used_labels
    assert not stray, f"{alert.name}: groups by labels no metric of it has: {sorted(stray)}"
    templated = set(re.findall(r"\$labels\.(\w+)", str(alert.rule["annotations"])))
    assert templated <= used_labels, f"{alert.name}: annotations use {templated - used_labels}"


def recording_rules() -> list[tuple[str, dict[str, object]]]:
    return [
        (path.name, rule)
        for path in rule_files()
        for group in load_groups(path)
        for rule in group["rules"]  # type: ignore[attr-defined]
        if "record" in rule
    ]


def _label_replace_targets(expr: str) -> set[str]:
    """The labels ``label_replace(v, "dst", ...)`` writes in ``expr``."""
    toks = _tokens(expr)
    out = set()
    for i, (kind, text) in enumerate(toks):
        if kind == "ident" and text == "label_replace":
            depth, j = 0, i + 1
            while j < len(toks):
                if toks[j][1] == "(":
                    depth += 1
                elif toks[j][1] == ")":
                    depth -= 1
                elif depth == 1 and toks[j][1] == ",":
                    out.add(_unquote(toks[j + 1][1]))
                    break
                j += 1
    return out


@pytest.mark.parametrize(
    ("file", "rule"), recording_rules(), ids=lambda r: r if isinstance(r, str) else r["record"]
)
def test_recording_rule_reads_only_known_metrics(file: str, rule: dict[str, object]) -> None:
    """A recording rule reads fabricscope's catalog, other records, and, in the join rules
    only, the other exporters' metrics FOREIGN_METRICS lists (each with its source)."""
    known = catalog_labels()
    if file == JOIN_RULES:
        known.update({n: f.labels for n, f in FOREIGN_METRICS.items()})
    expr = str(rule["expr"])
    q = parse_query(expr)
    assert q.selectors, rule
    used: set[str] = set(TARGET_LABELS) | _label_replace_targets(expr)
    for sel in q.selectors:
        assert sel.name in known, f"{rule['record']}: {sel.name} is no metric it may read"
        used |= set(known[sel.name])
        for m in sel.matchers:
            assert m.label in set(known[sel.name]) | TARGET_LABELS, (rule["record"], m)
    stray = q.grouping - used
    assert not stray, f"{rule['record']}: groups by labels nothing has: {sorted(stray)}"


def test_foreign_metrics_are_read_by_the_join_rules_only() -> None:
    read = {
        sel.name
        for file, rule in recording_rules()
        if file == JOIN_RULES
        for sel in parse_query(str(rule["expr"])).selectors
    }
    assert set(FOREIGN_METRICS) <= read, "an allowance no rule needs"
    for a in ALERTS:
        assert not {s.name for s in parse_query(a.expr).selectors} & set(FOREIGN_METRICS)
    for file, rule in recording_rules():
        if file != JOIN_RULES:
            names = {s.name for s in parse_query(str(rule["expr"])).selectors}
            assert not names & set(FOREIGN_METRICS), rule["record"]
    assert all(f.source and f.optional <= set(f.labels) for f in FOREIGN_METRICS.values())


def test_label_replace_targets_are_read() -> None:
    expr = 'label_replace(label_replace(m, "a", "$1", "b", "(.+)"), "c", "x", "", "")'
    assert _label_replace_targets(expr) == {"a", "c"}


def test_pending_list_holds_only_probe_metrics() -> None:
    assert all(n.startswith("fabricscope_probe_") for n in PENDING_METRICS)
    for labels in PENDING_METRICS.values():
        assert set(labels) <= set(LABELS), "pending labels must come from the one vocabulary"


# --- promtool unit tests ------------------------------------------------------------------


def rule_tests() -> list[Path]:
    return sorted(RULE_TESTS.glob("*.test.yaml"))


def test_each_rule_file_has_its_unit_test_file() -> None:
    tested = set()
    for path in rule_tests():
        doc = yaml.safe_load(path.read_text())
        for rf in doc["rule_files"]:
            tested.add((path.parent / rf).resolve())
    assert tested == {p.resolve() for p in rule_files()}


@pytest.mark.parametrize("path", rule_tests(), ids=lambda p: p.name)
def test_promtool_test_rules(path: Path) -> None:
    result = subprocess.run(
        [PROMTOOL, "test", "rules", path.name],
        cwd=path.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_tested_firing_and_quiet() -> None:
    fires: set[str] = set()
    quiet: set[str] = set()
    for path in rule_tests():
        for case in yaml.safe_load(path.read_text())["tests"]:
            for t in case.get("alert_rule_test", []):
                (fires if t.get("exp_alerts") else quiet).add(t["alertname"])
    names = {a.name for a in ALERTS}
    assert names - fires == set(), "never tested firing"
    assert names - quiet == set(), "never tested quiet"
    assert (fires | quiet) <= names, "tests for alerts that do not exist"


_SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}$")
_PAIR = re.compile(r'\s*([a-zA-Z_]\w*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def test_unit_test_series_look_like_real_scrapes() -> None:
    """Input series carry exactly their metric's labels plus the scrape's job and instance,
    so an alert that fires in the unit tests fires on what fabricscope really exports."""
    known = catalog_labels()
    foreign = {n: f.labels for n, f in FOREIGN_METRICS.items()}
    for path in rule_tests():
        joins = path.name == "joins.test.yaml"
        for case in yaml.safe_load(path.read_text())["tests"]:
            for s in case["input_series"]:
                m = _SERIES.match(s["series"])
                assert m, s["series"]
                name, body = m.groups()
                labels = {k for k, _ in _PAIR.findall(body)}
                if joins and name in foreign:
                    expected = set(foreign[name])
                    may_lack = set(FOREIGN_METRICS[name].optional)
                else:
                    assert name in known, f"{path.name}: {name} is not a metric fabricscope has"
                    expected = set(known[name])
                    may_lack = (
                        MAY_BE_EMPTY.get(name, set()) if name not in PENDING_METRICS else expected
                    )
                assert {"job", "instance"} <= labels, s["series"]
                # a metric's own namespace/pod/container (honorLabels) are its labels
                own = labels - (TARGET_LABELS - expected)
                assert expected - may_lack <= own <= expected, (
                    f"{path.name}: {s['series']} should carry {sorted(expected)}"
                )


# --- the PrometheusRule objects -----------------------------------------------------------


# --- each alert's rate over the benchmark's week ---------------------------------------------

ALERT_NOISE = ROOT / "bench" / "results" / "alert_noise.json"
RATE_HEADER = "healthy fleet, per 1,000 node-days"


#: alerts whose expression changed since bench/results/alert_noise.json was measured, for a
#: result that does not record the expressions it measured (newer ones do, and this stays
#: empty): their figure is stale
CHANGED_SINCE_THE_WEEK: set[str] = set()


#: alerts whose sources the week's history renders now but did not when
#: bench/results/alert_noise.json was measured (the committed result says "modelled": false):
#: the next run of the week gives them a figure (tests/deploy/test_alert_noise.py checks the
#: history renders what they read); until then their cell reads "not measured yet" and they
#: stay in WITHOUT_A_FIGURE. Only ever shorter: a result that models one fails below.
RENDERED_SINCE_THE_WEEK: set[str] = set()


def rate_cell(
    entry: dict[str, object] | None,
    fired: float | None = None,
    expr: str | None = None,
    rendered_since: bool = False,
) -> str:
    """The "Every alert" table's rate cell for one alert of alert_noise.json's every_alert
    (None: an alert added since the benchmark last ran); ``fired``: its background figure
    where it fired over the week (then it reads series the week holds); ``expr``: the
    alert's expression now (another one than the week measured: not measured yet);
    ``rendered_since``: the week renders its sources now, not when it was measured."""
    if entry is None or ("expr" in entry and entry["expr"] != expr) or rendered_since:
        return "not measured yet"
    if fired is not None:
        return f"{fired:g}"
    if not entry["modelled"]:
        return "not in the week's history"
    value = entry["per_1000_node_days"]
    assert isinstance(value, float | int)
    return f"{value:g}"


def every_alert_rows(text: str) -> list[list[str]]:
    table = text.split("## Every alert", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in table.splitlines() if ln.startswith("| ")]
    return [[c.strip() for c in ln.strip("|").split(" | ")] for ln in lines]


def test_every_alert_row_gives_its_rate_over_the_benchmark_week() -> None:
    """docs/alerts.md says how often a healthy fleet sees each alert: bench/alert_noise.py's
    figure, or that its source is not in the week's history."""
    result = json.loads(ALERT_NOISE.read_text())
    week = result["every_alert"]
    fired = {r["alert"]: r["per_1000_node_days"] for r in result["alerts"]}
    rows = every_alert_rows(ALERTS_DOC.read_text())
    assert rows[0][-1] == RATE_HEADER, rows[0]
    exprs = {a.name: a.expr for a in ALERTS}
    names = set(exprs)
    if any("expr" in e for e in week.values()):
        assert not CHANGED_SINCE_THE_WEEK, "the result records its expressions: empty it"
    seen = set()
    for row in rows[2:]:
        name = re.match(r"\[(\w+)\]", row[0])
        assert name, row
        seen.add(name[1])
        entry = week.get(name[1])
        if name[1] in CHANGED_SINCE_THE_WEEK:
            entry = None
        if name[1] in RENDERED_SINCE_THE_WEEK:
            assert entry is not None and not entry["modelled"], (
                f"{name[1]}: the week measured it, take it out of RENDERED_SINCE_THE_WEEK"
            )
        cell = rate_cell(
            entry, fired.get(name[1]), exprs[name[1]], name[1] in RENDERED_SINCE_THE_WEEK
        )
        assert row[-1] == cell, (name[1], row[-1])
    assert seen == names
    assert set(week) <= names, "alert_noise.json names alerts the rules no longer have"
    assert RENDERED_SINCE_THE_WEEK <= WITHOUT_A_FIGURE, "a rendered alert has no figure yet"


#: alerts whose healthy-fleet rate the benchmark's week does not give yet: their sources
#: (the probe, NCCL's transport lines, a job's samples/s or step time,
#: read errors) are not rendered in the week's history, or the alert is newer than the
#: week's run or changed since (CHANGED_SINCE_THE_WEEK), or its sources are rendered since
#: the week was measured (RENDERED_SINCE_THE_WEEK). Only ever shorter: an
#: alert added without a figure fails below.
WITHOUT_A_FIGURE: set[str] = set()


def runbooks(text: str) -> dict[str, str]:
    """Alert name -> the text of its runbook section in docs/alerts.md."""
    parts = re.split(r"^#{2,4} (.*)$", text, flags=re.M)
    return {head.strip(): body for head, body in zip(parts[1::2], parts[2::2], strict=True)}


def test_every_alert_says_what_fires_it_how_often_and_what_to_do() -> None:
    """docs/alerts.md gives each shipped alert what fires it (its row), how often a healthy
    fleet sees it per 1,000 node-days (a figure of the week, WITHOUT_A_FIGURE aside) and what
    to do (its runbook section, more than a line)."""
    text = ALERTS_DOC.read_text()
    rows = {re.match(r"\[(\w+)\]", r[0])[1]: r for r in every_alert_rows(text)[2:]}  # type: ignore[index]
    books = runbooks(text)
    lacking = []
    for a in ALERTS:
        row = rows.get(a.name)
        if row is None or len(row[3].split()) < 4:
            lacking.append(f"{a.name}: no 'fires when'")
        if row is None or not re.fullmatch(r"\d+(\.\d+)?", row[-1]):
            if a.name not in WITHOUT_A_FIGURE:
                lacking.append(f"{a.name}: no healthy-fleet figure ({row and row[-1]})")
        elif a.name in WITHOUT_A_FIGURE:
            lacking.append(f"{a.name}: has a figure now, take it out of WITHOUT_A_FIGURE")
        if len(books.get(a.name, "").split()) < 20:
            lacking.append(f"{a.name}: no runbook saying what to do")
    assert not lacking, lacking
    assert not WITHOUT_A_FIGURE - {a.name for a in ALERTS}, "WITHOUT_A_FIGURE names gone alerts"
