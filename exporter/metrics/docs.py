"""Generates docs/metrics.md from the catalog (``python -m exporter.metrics.docs >
docs/metrics.md``);
a test regenerates it and diffs, so the docs cannot drift from the code."""

from __future__ import annotations

import sys

from agent.core.findings import KINDS
from exporter.metrics.catalog import all_specs
from exporter.metrics.spec import LABELS


def render_markdown() -> str:
    lines = [
        "# Metrics",
        "",
        "Generated from the catalog by `python -m exporter.metrics.docs`; do not edit by hand.",
        "",
        "`detail` is the lowest `--collector.detail` level that exports the family (minimal: "
        "what the shipped alerts, dashboards and `fabricscope explain` read; default: also the "
        "diagnostic counters; full: everything); `*` marks a family that levels below full "
        "fold (see [Detail levels](#detail-levels)).",
        "",
        "| name | type | unit | labels | detail | help |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for spec in all_specs():
        labels = ", ".join(f"`{x}`" for x in spec.labels)
        help_text = spec.help.replace("|", "\\|")
        detail = spec.detail + ("*" if spec.fold else "")
        lines.append(
            f"| `{spec.name}` | {spec.type} | {spec.unit or '-'} | {labels} | {detail} "
            f"| {help_text} |"
        )
    lines += [
        "",
        "## Detail levels",
        "",
        "`--collector.detail` (default: `default`) sets how much a node exports; every name "
        "stays in this catalog whatever the level. `full` exports every series unfolded. "
        "`default` leaves out the families marked full above and folds these; `minimal` "
        "also leaves out the families marked default (`bench/series_budget.py` counts each "
        "level on the fixture trees; README, Performance).",
        "",
        "| name | below full |",
        "| --- | --- |",
    ]
    for spec in all_specs():
        if spec.fold:
            lines.append(f"| `{spec.name}` | {spec.fold.replace('|', chr(92) + '|')} |")
    lines += ["", "## Labels", "", "| label | meaning |", "| --- | --- |"]
    used = {label for spec in all_specs() for label in spec.labels}
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
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render_markdown())
