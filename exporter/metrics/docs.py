"""Generates docs/metrics.md from the catalog (``python -m exporter.metrics.docs >
docs/metrics.md``);
a test regenerates it and diffs, so the docs cannot drift from the code."""

from __future__ import annotations

import sys

from agent.core.findings import KINDS
from exporter.metrics import topology
from exporter.metrics.catalog import all_specs
from exporter.metrics.spec import LABELS, MetricSpec

#: The metric-stability policy, at the end of docs/metrics.md.
STABILITY = (
    "## Stability",
    "",
    "What a release may change in the series above, and how you hear of it. Every change is "
    "listed in [CHANGELOG.md](../CHANGELOG.md) under the release that makes it.",
    "",
    "- **Stable**: a metric's name, type, unit and label names, and the meaning of its "
    "value; the label values of fixed vocabularies (`reason`, `kind`, `comparison`, "
    "`transport`, `collective`, ...), to which a release may add values but from which it "
    "removes none. A release changes none of these without a deprecation: the old series "
    "keeps being exported beside its replacement for at least one minor release, and the "
    "changelog names both.",
    "- **May change in any release**: new metrics, new labels on `*_info` series, new "
    "values in a vocabulary, which series a `--collector.detail` level below `full` folds "
    "(the table under [Detail levels](#detail-levels); `full` always exports every series "
    "unfolded), help texts, the order of series, and the self-metrics of the agent "
    "(`fabricscope_sampler_*`, `fabricscope_http_*`) while the project is before 1.0.",
    "- **Not an interface**: the exposition's formatting, the number of series a node "
    "exports (it follows the hardware), log lines, and the recording rules' intermediate "
    "series, which are named `fabricscope:*` and change with the rules and dashboards that "
    "read them.",
    "- The shipped alert rules, dashboards and `fabricscope explain` read only what "
    "`--collector.detail=minimal` keeps, and are tested against this catalog on every change, "
    "so they never depend on a series a release may fold.",
)


def _row(spec: MetricSpec) -> str:
    labels = ", ".join(f"`{x}`" for x in spec.labels)
    help_text = spec.help.replace("|", "\\|")
    detail = spec.detail + ("*" if spec.fold else "")
    return (
        f"| `{spec.name}` | {spec.type} | {spec.unit or '-'} | {labels} | {detail} | {help_text} |"
    )


def render_markdown() -> str:
    lines = [
        "# Metrics",
        "",
        "Generated from the catalog by `python -m exporter.metrics.docs`; do not edit by hand.",
        "",
        "`detail` is the lowest `--collector.detail` level that exports the family (minimal: "
        "what the shipped alerts, dashboards and `fabricscope explain` read; default: also the "
        "diagnostic counters; full: everything); `*` marks a family that levels below full "
        "fold (see [Detail levels](#detail-levels)). What a release may change is under "
        "[Stability](#stability).",
        "",
        "| name | type | unit | labels | detail | help |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += [_row(spec) for spec in all_specs()]
    lines += [
        "",
        "## The topology controller",
        "",
        "`fabricscope topology-controller` (the chart's `topology.enabled`) serves these on its "
        "own `/metrics` ([topology.md](topology.md#the-controller)), not the agents'.",
        "",
        "| name | type | unit | labels | detail | help |",
        "| --- | --- | --- | --- | --- | --- |",
        *(_row(spec) for spec in topology.SPECS),
    ]
    lines += [
        "",
        "## Detail levels",
        "",
        "`--collector.detail` (default: `default`) sets how much a node exports; every name "
        "stays in this catalog whatever the level. `full` exports every series unfolded. "
        "`default` leaves out the families marked full above and folds these; `minimal` "
        "also leaves out the families marked default (`bench/series_budget.py` counts each "
        "level on the fixture trees; "
        "[performance.md](performance.md#what-a-node-costs-prometheus)).",
        "",
        "| name | below full |",
        "| --- | --- |",
    ]
    for spec in all_specs():
        if spec.fold:
            lines.append(f"| `{spec.name}` | {spec.fold.replace('|', chr(92) + '|')} |")
    lines += ["", "## Labels", "", "| label | meaning |", "| --- | --- |"]
    used = {label for spec in (*all_specs(), *topology.SPECS) for label in spec.labels}
    for label in sorted(used):
        lines.append(f"| `{label}` | {LABELS[label]} |")
    lines += [
        "",
        "## Findings",
        "",
        "Every finding kind, from the registry in `agent/core/findings.py`. Each appears in "
        "`fabricscope topo` (table and JSON, with its severity), is counted by "
        "`fabricscope_findings{kind}`, and is carried per object by the series named here; "
        "the alert is the shipped rule on that series (deploy/rules).",
        "",
        "| kind | area | severity | series | alert | meaning |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for k in sorted(KINDS.values(), key=lambda k: (k.area, k.kind)):
        alert = f"`{k.alert}`" if k.alert else "none shipped"
        meaning = (k.help + (f" {k.alert_note}" if k.alert_note else "")).replace("|", "\\|")
        lines.append(
            f"| `{k.kind}` | {k.area} | {k.severity} | `{k.series}` | {alert} | {meaning} |"
        )
    lines += ["", *STABILITY]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render_markdown())
