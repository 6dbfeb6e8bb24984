"""Nodes through the Kubernetes API: list them (names and labels), merge-patch one node's
labels. Plain HTTPS with the service account's token; each request bounded by a timeout, an
answer bounded in size and parsed as the API's ``NodeList``. The controller needs exactly
``get``/``list``/``patch`` on ``nodes``, which is all its ClusterRole grants."""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

#: the largest NodeList read (5,000 nodes with their labels and status is ~100 MB; we ask
#: for metadata only through the table of labels we need, pages of 500)
MAX_BODY_BYTES = 64 << 20
PAGE = 500


class KubeError(Exception):
    """A Kubernetes API request failed; ``str()`` is one line."""


@dataclass(frozen=True, slots=True)
class KubeSettings:
    url: str
    token_file: str | None = None
    ca_file: str | None = None
    timeout: float = 10.0

    @classmethod
    def in_cluster(cls, url: str, token_file: str, ca_file: str, timeout: float) -> KubeSettings:
        if not url:
            host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise KubeError(
                    "not in a cluster (no KUBERNETES_SERVICE_HOST): give --kubernetes.api-url"
                )
            url = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        return cls(
            url.rstrip("/"),
            token_file if token_file and Path(token_file).exists() else None,
            ca_file if ca_file and Path(ca_file).exists() else None,
            timeout,
        )


class NodesApi:
    def __init__(self, settings: KubeSettings) -> None:
        self.settings = settings
        self._ctx: ssl.SSLContext | None = None
        if settings.url.startswith("https://"):
            self._ctx = ssl.create_default_context(cafile=settings.ca_file)

    def _headers(self) -> dict[str, str]:
        h = {"Accept": "application/json"}
        if self.settings.token_file:
            # re-read each time: the kubelet rotates projected tokens
            token = Path(self.settings.token_file).read_text().strip()
            h["Authorization"] = f"Bearer {token}"
        return h

    def _call(self, method: str, path: str, body: bytes | None, ctype: str = "") -> object:
        headers = self._headers()
        if ctype:
            headers["Content-Type"] = ctype
        req = urllib.request.Request(
            self.settings.url + path, data=body, headers=headers, method=method
        )
        where = f"{method} {path.split('?', maxsplit=1)[0]}"
        try:
            with urllib.request.urlopen(
                req, timeout=self.settings.timeout, context=self._ctx
            ) as resp:
                raw = resp.read(MAX_BODY_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raise KubeError(f"{where}: HTTP {exc.code} {_status_message(exc)}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise KubeError(f"{where}: {reason}") from None
        if len(raw) > MAX_BODY_BYTES:
            raise KubeError(f"{where}: answer larger than {MAX_BODY_BYTES} bytes")
        try:
            return json.loads(raw)
        except ValueError:
            raise KubeError(f"{where}: answer is not JSON") from None

    def list_labels(self) -> dict[str, dict[str, str]]:
        """Every node's name -> its labels (paged)."""
        out: dict[str, dict[str, str]] = {}
        token = ""
        while True:
            q = {"limit": str(PAGE)}
            if token:
                q["continue"] = token
            data = self._call("GET", "/api/v1/nodes?" + urllib.parse.urlencode(q), None)
            if not isinstance(data, dict) or data.get("kind") != "NodeList":
                raise KubeError("GET /api/v1/nodes: answer is not a NodeList")
            items = data.get("items")
            if not isinstance(items, list):
                raise KubeError("GET /api/v1/nodes: NodeList without items")
            for item in items:
                meta = item.get("metadata") if isinstance(item, dict) else None
                name = meta.get("name") if isinstance(meta, dict) else None
                if not isinstance(name, str):
                    raise KubeError("GET /api/v1/nodes: a node without a name")
                labels = meta.get("labels")  # type: ignore[union-attr]
                labels = {} if labels is None else labels
                if not isinstance(labels, dict):
                    raise KubeError(f"GET /api/v1/nodes: node {name}'s labels are not a map")
                out[name] = {str(k): str(v) for k, v in labels.items()}
            meta = data.get("metadata")
            token = meta.get("continue", "") if isinstance(meta, dict) else ""
            if not token:
                return out

    def patch_labels(self, node: str, labels: Mapping[str, str | None]) -> None:
        """Merge-patch ``node``'s labels: a value sets, ``None`` removes."""
        body = json.dumps({"metadata": {"labels": dict(labels)}}).encode()
        path = "/api/v1/nodes/" + urllib.parse.quote(node, safe="")
        self._call("PATCH", path, body, "application/merge-patch+json")


def _status_message(exc: urllib.error.HTTPError) -> str:
    try:
        data = json.loads(exc.read(1 << 16))
    except (ValueError, OSError):
        return exc.reason if isinstance(exc.reason, str) else ""
    msg = data.get("message", "") if isinstance(data, dict) else ""
    return str(msg)[:200].replace("\n", " ")
