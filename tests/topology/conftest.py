"""Fixtures of the topology tests: the CRD schemas, copied from upstream with provenance
(``tests/fixtures/topology/README.md``), and the validation of a custom resource against them.

kubernetes-validate knows only Kubernetes' built-in kinds: given a Kueue or Volcano resource
it prints a warning ("Couldn't find schema") and passes it. So a custom resource is validated
as kubernetes-validate validates a built-in one (JSON Schema, every unknown field an error,
its own strict ``ObjectMeta`` schema for ``metadata``), against the CRD's OpenAPI schema
instead of a built-in's, plus the name rule the API server applies to custom resources (a
DNS subdomain). Built-in kinds (a Job of the docs) go through kubernetes-validate itself."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from referencing import Registry, Resource

from tests.topology.lab import Served, topology_run
from tests.topology.scenario import PHASES, SCENARIO

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topology"


@functools.cache
def crd_schema(file: str, version: str) -> dict[str, Any]:
    """The CRD's schema of ``version`` (cached: read only, :func:`_strict` copies it)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load((FIXTURES / "crds" / file).read_text(), Loader=loader)
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            schema: dict[str, Any] = v["schema"]["openAPIV3Schema"]
            return schema
    raise KeyError(version)


#: kubernetes-validate's strict schemas of this Kubernetes release (ObjectMeta is the same
#: in every release it knows that the chart supports)
K8S_SCHEMAS = "kubernetes-json-schema/v1.33.0-local-strict/_definitions.json"
OBJECT_META = "https://kubernetes.io/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
#: the API server's name rule for custom resources: a DNS-1123 subdomain
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@functools.cache
def _k8s_registry() -> Registry:
    defs = json.loads(
        resources.files("kubernetes_validate").joinpath(K8S_SCHEMAS).read_text(encoding="utf-8")
    )
    return Resource.from_contents(defs) @ Registry()


def validate(obj: dict[str, Any], file: str, version: str) -> None:
    """``obj`` against the CRD's OpenAPI schema of ``version``, every property strictly (an
    unknown field, which the API server would prune or refuse, is an error here), its
    ``metadata`` against kubernetes-validate's strict ObjectMeta, its name a DNS subdomain."""
    schema = _strict(crd_schema(file, version))
    schema["properties"]["metadata"] = {"$ref": OBJECT_META}
    jsonschema.Draft202012Validator(schema, registry=_k8s_registry()).validate(obj)
    name = obj["metadata"]["name"]
    assert len(name) <= 253 and DNS_SUBDOMAIN.fullmatch(name), f"not a DNS subdomain: {name!r}"


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
