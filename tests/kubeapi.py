"""A stand-in Kubernetes API server's pod endpoint for the pod-watch tests (attribution's
cluster-wide watch, the probe's namespaced membership): scripted lists and watches served
through pytest-httpserver, the Status objects the API server sends, and fast watch settings.
No API server runs here: the bodies follow the API's own PodList, watch-event and Status
shapes."""

from __future__ import annotations

import json
import threading
import time

import pytest
from werkzeug import Request, Response

from agent.kubernetes.podwatch import WatchSettings

#: the proxy variables urllib3 and the kubernetes client honour: a test server is local
PROXY_VARIABLES = (
    "http_proxy",
    "https_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "all_proxy",
    "ALL_PROXY",
)

FAST = WatchSettings(
    watch_timeout_seconds=5,
    connect_timeout_seconds=2.0,
    list_timeout_seconds=5.0,
    read_timeout_seconds=5.0,
    backoff_initial_seconds=0.05,
    backoff_max_seconds=0.2,
)


def status(code: int, reason: str, message: str) -> dict[str, object]:
    """A ``Status`` object as the API server sends it."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


EXPIRED = status(410, "Expired", "too old resource version: 1000 (1500)")


def pod_list(version: str, *items: dict[str, object]) -> dict[str, object]:
    return {
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": version},
        "items": list(items),
    }


def clear_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in PROXY_VARIABLES:
        monkeypatch.delenv(var, raising=False)


class FakeApi:
    """Serves a pods endpoint: lists from ``lists`` (the last one repeats), watches from
    ``watches`` (each a list of events; an exhausted script answers an empty stream, as a
    watch that timed out), ``watch_fail`` (one watch answered with that HTTP status and
    Status body), or ``fail`` (an HTTP status and its Status body) for every request."""

    def __init__(self) -> None:
        self.lists: list[dict[str, object]] = []
        self.watches: list[list[dict[str, object]]] = []
        self.fail: tuple[int, dict[str, object]] | None = None
        self.watch_fail: tuple[int, dict[str, object]] | None = None
        self.requests: list[dict[str, str]] = []
        self.lock = threading.Lock()

    def handle(self, request: Request) -> Response:
        args = request.args.to_dict()
        with self.lock:
            self.requests.append(args)
            fail = self.fail
            if fail is None and args.get("watch") == "true":
                fail, self.watch_fail = self.watch_fail, None
        if fail is not None:
            return Response(json.dumps(fail[1]), status=fail[0], mimetype="application/json")
        if args.get("watch") == "true":
            with self.lock:
                events = self.watches.pop(0) if self.watches else []
            if not events:
                time.sleep(0.05)
            body = "".join(json.dumps(e) + "\n" for e in events)
            return Response(body, mimetype="application/json")
        with self.lock:
            body_obj = self.lists.pop(0) if len(self.lists) > 1 else self.lists[0]
        return Response(json.dumps(body_obj), mimetype="application/json")

    def list_requests(self) -> list[dict[str, str]]:
        with self.lock:
            return [r for r in self.requests if r.get("watch") != "true"]

    def watch_requests(self) -> list[dict[str, str]]:
        with self.lock:
            return [r for r in self.requests if r.get("watch") == "true"]
