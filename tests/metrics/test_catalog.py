"""The catalog: one spec per name, Prometheus conventions, docs generated from it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exporter.metrics.catalog import all_specs
from exporter.metrics.docs import render_markdown
from exporter.metrics.spec import MetricSpec, spec_problems

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_every_spec_follows_the_conventions() -> None:
    specs = all_specs()
    assert len(specs) > 9
    assert {s.name: spec_problems(s) for s in specs if spec_problems(s)} == {}


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"name": "fabricscope_x", "type": "counter"}, "counters end in _total"),
        ({"name": "fabricscope_x_total", "type": "gauge"}, "only counters end in _total"),
        ({"name": "fabricscope_x_bits", "type": "gauge", "unit": "bits"}, "not a base unit"),
        ({"name": "fabricscope_x", "type": "gauge", "unit": "bytes"}, "must end in _bytes"),
        ({"name": "node_x", "type": "gauge"}, "fabricscope_"),
        ({"name": "fabricscope_x", "type": "gauge", "labels": ("podname",)}, "vocabulary"),
        ({"name": "fabricscope_x", "type": "gauge", "help": "lower case."}, "sentence"),
    ],
)
def test_convention_violations_are_rejected(kwargs: dict[str, object], problem: str) -> None:
    args: dict[str, object] = {"help": "Help."} | kwargs
    with pytest.raises(ValueError, match=problem):
        MetricSpec(**args)  # type: ignore[arg-type]


def test_metrics_doc_is_generated_from_the_catalog() -> None:
    text = render_markdown()
    if os.environ.get("UPDATE_GOLDEN") == "1":
        DOCS.write_text(text)
    assert DOCS.read_text() == text, "docs/metrics.md is stale: run `make golden`"
