"""Parsing one CDI spec (pure): the devices it defines and the device nodes and environment
each adds to a container.

The format is the CNCF Container Device Interface's (``SPEC.md`` of cncf-tags/
container-device-interface): a YAML or JSON document with ``cdiVersion``, ``kind``
(``vendor.com/class``), ``devices`` (each a ``name`` and ``containerEdits``) and spec-wide
``containerEdits``. ``containerEdits`` holds ``env`` (``KEY=VALUE`` strings), ``deviceNodes``
(each a ``path``, optionally ``hostPath``, ``major``, ``minor``), ``mounts`` and ``hooks``;
only ``env`` and ``deviceNodes`` say which hardware a device is, so only they are kept.

Specs are written by drivers running as root on the node, but are still read as untrusted
input: the text is bounded before it gets here (:mod:`agent.cdi.registry`), aliases are not
expanded into copies (PyYAML's safe loader shares them), and only the keys above are walked,
with caps on how many devices, nodes and variables are kept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

#: caps on what one spec may contribute (the NVIDIA DRA driver's claim specs hold one device
#: per allocated GPU or MIG slice, a handful of nodes each)
MAX_DEVICES = 1024
MAX_NODES = 64
MAX_ENV = 256
MAX_NAME = 256


@dataclass(frozen=True, slots=True)
class CdiDevice:
    """One device of a spec: its name within the spec's kind, the container paths of its
    device nodes and its ``KEY=VALUE`` environment, as the spec lists them."""

    name: str
    device_nodes: tuple[str, ...] = ()
    env: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CdiSpec:
    """``kind`` is ``vendor.com/class``; a device's qualified name is ``kind=name``."""

    kind: str
    devices: tuple[CdiDevice, ...] = ()


def parse_spec(text: str, *, json_format: bool = False) -> CdiSpec:
    """The devices of one spec; ValueError when it is not a CDI spec. PyYAML is imported
    here, on the first spec, so a node without DRA never loads it."""
    import yaml

    loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        doc = json.loads(text) if json_format else yaml.load(text, Loader=loader)
    except (ValueError, yaml.YAMLError, RecursionError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"not {'JSON' if json_format else 'YAML'}: {first[:200]}") from None
    if not isinstance(doc, dict):
        raise ValueError("not a CDI spec: the document is not a mapping")
    kind = doc.get("kind")
    if not isinstance(kind, str) or "/" not in kind or len(kind) > MAX_NAME:
        raise ValueError("not a CDI spec: no kind of the form vendor.com/class")
    raw = doc.get("devices")
    if not isinstance(raw, list):
        raise ValueError("not a CDI spec: devices is not a list")
    if len(raw) > MAX_DEVICES:
        raise ValueError(f"{len(raw)} devices, more than {MAX_DEVICES}")
    devices = []
    for entry in raw:
        if not isinstance(entry, dict):
            continue
        name = entry.get("name")
        if not isinstance(name, str) or not name or len(name) > MAX_NAME:
            continue
        edits = entry.get("containerEdits")
        nodes, env = _edits(edits if isinstance(edits, dict) else {})
        devices.append(CdiDevice(name, nodes, env))
    return CdiSpec(kind, tuple(devices))


def _edits(edits: dict[object, object]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    nodes: list[str] = []
    raw_nodes = edits.get("deviceNodes")
    if isinstance(raw_nodes, list):
        for n in raw_nodes[:MAX_NODES]:
            path = n.get("path") if isinstance(n, dict) else None
            if isinstance(path, str) and len(path) <= MAX_NAME:
                nodes.append(path)
    env: list[str] = []
    raw_env = edits.get("env")
    if isinstance(raw_env, list):
        env = [e for e in raw_env[:MAX_ENV] if isinstance(e, str) and len(e) <= 4096]
    return tuple(nodes), tuple(env)


def split_qualified(name: str) -> tuple[str, str] | None:
    """``("vendor.com/class", "device")`` for ``vendor.com/class=device``, else None."""
    kind, sep, device = name.partition("=")
    if not sep or "/" not in kind or not device:
        return None
    return kind, device
