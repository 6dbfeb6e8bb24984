"""The finding-kind registry (agent/core/findings.py KINDS) is the one vocabulary: every kind the
code can raise is registered, every registered series is in the metric catalog, every
registered alert is a shipped rule whose expression reads that series, and the docs list
every kind (docs/metrics.md is regenerated from the registry by tests/metrics/test_catalog.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from agent.core import findings as findings_mod
from agent.core.findings import KINDS, Finding
from agent.workload.findings import PROCESS_FINDING_KINDS
from exporter.metrics.catalog import all_specs

ROOT = Path(__file__).resolve().parents[2]


def shipped_alerts() -> dict[str, str]:
    """Each alert's expression with the recording rules it reads written out in it (an alert
    may read its series through a recording rule: the fleet-wide ACS alert does)."""
    out, records = {}, {}
    for f in sorted((ROOT / "deploy" / "rules").glob("*.rules.yaml")):
        for group in yaml.safe_load(f.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    out[rule["alert"]] = rule["expr"]
                else:
                    records[rule["record"]] = rule["expr"]
    for _ in range(4):  # recording rules read by recording rules, a few deep at most
        for name, alert_expr in out.items():
            written_out = alert_expr
            for record, body in records.items():
                written_out = written_out.replace(record, f"({body})")
            out[name] = written_out
    return out


def raised_kinds() -> set[str]:
    """Kinds named in Finding(...) calls anywhere under agent/, read from the source (every module,
    so a split that moves a finding into a new module keeps it counted)."""
    kinds: set[str] = set()
    for path in sorted((ROOT / "agent").rglob("*.py")):
        kinds |= set(re.findall(r'Finding\(\s*"([a-z0-9_]+)"', path.read_text()))
    return kinds


def test_every_raised_kind_is_registered_and_every_registered_kind_is_raised() -> None:
    assert raised_kinds() == set(KINDS)
    assert set(PROCESS_FINDING_KINDS) <= set(KINDS)


def test_an_unregistered_kind_cannot_be_built() -> None:
    with pytest.raises(ValueError, match=r"not in agent\.core\.findings\.KINDS"):
        Finding("made_up", "x", "y")


def test_series_and_alerts_exist_and_agree() -> None:
    catalog = {s.name for s in all_specs()}
    alerts = shipped_alerts()
    for k in KINDS.values():
        assert k.series in catalog, k.kind
        if k.alert is not None:
            assert k.alert in alerts, k.kind
            assert k.series in alerts[k.alert], (k.kind, k.alert)
    assert "fabricscope_findings" in catalog


def test_docs_list_every_kind() -> None:
    text = (ROOT / "docs" / "metrics.md").read_text()
    section = text.split("## Findings", 1)[1]
    for kind in KINDS:
        assert f"| `{kind}` |" in section
    assert findings_mod.__doc__ is not None and "single registry" in findings_mod.__doc__


def test_the_findings_fragment_is_rebuilt_for_exactly_the_samplers_it_reads() -> None:
    """The agent rebuilds ``fabricscope_findings`` only on updates of ``SOURCES``: those must
    be the samplers ``render`` reads, or a finding would go stale."""
    from exporter.metrics import findings
    from exporter.metrics.spec import Families

    seen: set[str] = set()

    class Spy(dict[str, object]):
        def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
            seen.add(key)
            return default

    findings.render(Spy(), Families())  # type: ignore[arg-type]
    assert seen == findings.SOURCES
