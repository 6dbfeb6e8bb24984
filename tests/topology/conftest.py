"""Fixtures of the topology tests: the CRD schemas, copied from upstream with provenance
(``tests/fixtures/topology/README.md``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.topology.lab import Served, topology_run
from tests.topology.scenario import PHASES, SCENARIO

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topology"


def crd_schema(file: str, version: str) -> dict[str, Any]:
    crd = yaml.safe_load((FIXTURES / "crds" / file).read_text())
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            schema: dict[str, Any] = v["schema"]["openAPIV3Schema"]
            return schema
    raise KeyError(version)


def validate(obj: dict[str, Any], file: str, version: str) -> None:
    """``obj`` against the CRD's OpenAPI schema of ``version``, every property strictly (an
    unknown field, which the API server would prune or refuse, is an error here)."""
    schema = crd_schema(file, version)
    jsonschema.validate(obj, _strict(schema))


def _strict(schema: Any) -> Any:
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes")}
        if out.get("type") == "object" and "properties" in out:
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@pytest.fixture(scope="session")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The scenario's phases, one pass of every agent each, served by a real Prometheus."""
    work = tmp_path_factory.mktemp("topology")
    with topology_run(work, SCENARIO, list(PHASES)) as served:
        yield served
