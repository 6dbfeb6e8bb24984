"""Generates docs/metrics.md from the catalog (``python -m exporter.docs > docs/metrics.md``);
a test regenerates it and diffs, so the docs cannot drift from the code."""

from __future__ import annotations

import sys

from exporter.catalog import all_specs
from exporter.spec import LABELS


def render_markdown() -> str:
    lines = [
        "# Metrics",
        "",
        "Generated from the catalog by `python -m exporter.docs`; do not edit by hand.",
        "",
        "| name | type | unit | labels | help |",
        "| --- | --- | --- | --- | --- |",
    ]
    for spec in all_specs():
        labels = ", ".join(f"`{x}`" for x in spec.labels)
        help_text = spec.help.replace("|", "\\|")
        lines.append(
            f"| `{spec.name}` | {spec.type} | {spec.unit or '-'} | {labels} | {help_text} |"
        )
    lines += ["", "## Labels", "", "| label | meaning |", "| --- | --- |"]
    used = {label for spec in all_specs() for label in spec.labels}
    for label in sorted(used):
        lines.append(f"| `{label}` | {LABELS[label]} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render_markdown())
