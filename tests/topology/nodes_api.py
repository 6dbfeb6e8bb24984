"""A stand-in Kubernetes API server's nodes endpoint for the controller tests, served through
pytest-httpserver: ``GET /api/v1/nodes`` (a ``NodeList``, paged with ``limit``/``continue``
as the API server pages), ``PATCH /api/v1/nodes/NAME`` with a JSON merge patch (RFC 7386:
a ``null`` removes a key), and the ``Status`` objects the API server answers a refusal with.
No API server runs here: the bodies follow the API's own Node, NodeList and Status shapes
(``tests/kubeapi.py`` for the pods endpoint)."""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from werkzeug import Request, Response

from tests.kubeapi import status


def node(name: str, labels: dict[str, str], version: int) -> dict[str, Any]:
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": f"00000000-0000-4000-8000-{abs(hash(name)) % 10**12:012d}",
            "resourceVersion": str(version),
            "creationTimestamp": "2026-11-01T00:00:00Z",
            "labels": dict(labels),
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"podCIDR": "10.244.0.0/24"},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "nodeInfo": {"kubeletVersion": "v1.33.1"},
        },
    }


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            _merge(target[k], v)
        else:
            target[k] = v
    return target


class NodesApi:
    """Nodes with labels; every request recorded; ``forbid_patch`` answers PATCH with 403."""

    def __init__(self, nodes: dict[str, dict[str, str]], page: int = 500) -> None:
        self.labels = {n: dict(lb) for n, lb in nodes.items()}
        self.version = 1000
        self.page = page
        self.forbid_patch = False
        self.patches: list[tuple[str, str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def handle(self, request: Request) -> Response:
        with self.lock:
            if request.method == "GET" and request.path == "/api/v1/nodes":
                return self._list(request)
            m = re.fullmatch(r"/api/v1/nodes/([^/]+)", request.path)
            if request.method == "PATCH" and m:
                return self._patch(m.group(1), request)
        return _json(
            status(404, "NotFound", "the server could not find the requested resource"), 404
        )

    def _list(self, request: Request) -> Response:
        limit = int(request.args.get("limit", "0")) or len(self.labels)
        start = int(request.args.get("continue") or 0)
        names = sorted(self.labels)
        chunk = names[start : start + min(limit, self.page)]
        more = start + len(chunk) < len(names)
        body = {
            "kind": "NodeList",
            "apiVersion": "v1",
            "metadata": {
                "resourceVersion": str(self.version),
                **({"continue": str(start + len(chunk))} if more else {}),
            },
            "items": [node(n, self.labels[n], self.version) for n in chunk],
        }
        return _json(body, 200)

    def _patch(self, name: str, request: Request) -> Response:
        if self.forbid_patch:
            return _json(
                status(
                    403,
                    "Forbidden",
                    f'nodes "{name}" is forbidden: User "system:serviceaccount:fabricscope:'
                    'fabricscope-topology" cannot patch resource "nodes" in API group "" at '
                    "the cluster scope",
                ),
                403,
            )
        if name not in self.labels:
            return _json(status(404, "NotFound", f'nodes "{name}" not found'), 404)
        ctype = request.headers.get("Content-Type", "")
        body = json.loads(request.get_data())
        self.patches.append((name, ctype, body))
        if ctype != "application/merge-patch+json":
            return _json(status(415, "UnsupportedMediaType", f"{ctype} not supported"), 415)
        meta = {"labels": self.labels[name]}
        _merge(meta, body.get("metadata", {}))
        self.labels[name] = meta["labels"]
        self.version += 1
        return _json(node(name, self.labels[name], self.version), 200)


def _json(body: dict[str, Any], code: int) -> Response:
    return Response(json.dumps(body), status=code, mimetype="application/json")
