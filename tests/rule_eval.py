"""The shipped rules as Prometheus's rule manager would run them over a stored history: the
recording rules in dependency order, every alerting rule's expression evaluated at each
step by a real query engine (Prometheus's or VictoriaMetrics') as a range query, and its
``for`` applied here: an alert is pending from the first evaluation that returns its label
set and fires once it has been returned for ``for`` without a gap (the rule manager's
semantics; Prometheus 2.42 cannot evaluate alerts over the past itself). An episode is one
label set's run of firing evaluations.

Used by ``bench/alert_noise.py`` (the fleet alert budget) and
``tests/deploy/test_victoriametrics.py`` (the same rules on both engines).
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

RULES = Path(__file__).resolve().parent.parent / "deploy" / "rules"
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def api(url: str, path: str, params: dict[str, str]) -> list[dict[str, Any]]:
    body = urllib.parse.urlencode(params).encode()
    with _OPENER.open(f"{url}{path}", data=body, timeout=300) as r:
        answer = json.load(r)
    if answer.get("status") != "success":
        raise RuntimeError(f"{path} {params.get('query')}: {answer}")
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def duration(text: str | None) -> float:
    if not text:
        return 0.0
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    total, num = 0.0, ""
    i = 0
    while i < len(text):
        c = text[i]
        if c.isdigit():
            num += c
            i += 1
            continue
        unit = "ms" if text.startswith("ms", i) else c
        total += float(num) * units[unit]
        num = ""
        i += len(unit)
    return total


@dataclass(frozen=True, slots=True)
class Rule:
    file: str
    name: str  # alert or record name
    expr: str
    for_s: float
    labels: tuple[tuple[str, str], ...]
    alert: bool


def load_rules(rules_dir: Path = RULES) -> list[Rule]:
    out = []
    for path in sorted(rules_dir.glob("*.rules.yaml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for r in group["rules"]:
                out.append(
                    Rule(
                        path.name,
                        r.get("alert") or r["record"],
                        r["expr"],
                        duration(r.get("for")),
                        tuple(sorted((r.get("labels") or {}).items())),
                        "alert" in r,
                    )
                )
    return out


def record_levels(rules: list[Rule]) -> list[list[Rule]]:
    """Recording rules in dependency order: a rule reading another's series comes later."""
    records = [r for r in rules if not r.alert]
    names = {r.name for r in records}
    level: dict[str, int] = {}
    for _ in records:  # at most as many passes as rules
        for r in records:
            deps = [n for n in names if n != r.name and n in r.expr]
            level[r.name] = 1 + max((level.get(d, 0) for d in deps), default=-1)
    out: list[list[Rule]] = []
    for r in records:
        while len(out) <= level[r.name]:
            out.append([])
        out[level[r.name]].append(r)
    return out


@dataclass(frozen=True, slots=True)
class Episode:
    alert: str
    severity: str
    labels: dict[str, str]
    start: float  # first firing evaluation
    end: float  # last firing evaluation
    fault: str  # the planted fault it belongs to, "" for background


def evaluate(url: str, rule: Rule, start: float, end: float, step: float) -> list[Episode]:
    """The rule manager's view of ``rule`` at every ``step`` from ``start``: episodes."""
    result = api(
        url,
        "/api/v1/query_range",
        {"query": rule.expr, "start": f"{start:.0f}", "end": f"{end:.0f}", "step": f"{step:g}"},
    )
    severity = dict(rule.labels).get("severity", "")
    out = []
    for s in result:
        labels = {k: v for k, v in s["metric"].items() if k != "__name__"}
        labels.update(dict(rule.labels))
        times = [float(t) for t, _ in s["values"]]
        active_at: float | None = None
        prev: float | None = None
        firing_from: float | None = None
        for t in [*times, float("inf")]:
            if prev is not None and t - prev > step * 1.5:  # a gap: resolved, pending reset
                if firing_from is not None:
                    out.append(Episode(rule.name, severity, labels, firing_from, prev, ""))
                active_at = firing_from = None
            if t == float("inf"):
                break
            if active_at is None:
                active_at = t
            if firing_from is None and t - active_at >= rule.for_s:
                firing_from = t
            prev = t
    return out
