"""The shipped Alertmanager configuration (``deploy/alertmanager/alertmanager.yml``) as a
real Alertmanager runs it: alerts posted to its API, the notifications it sends received by
a webhook and counted per receiver, the alerts its inhibit rules suppress read back from it.

The configuration is the shipped file with two changes only: every webhook points at the
test's receiver (each notification names its receiver in its body) and the fabricscope
route's group timers are a second instead of 30 s and 5 min, so a run takes seconds.

Used by ``tests/deploy/test_alertmanager.py`` and ``bench/alert_noise.py`` (the benchmark's
alerts, notifications counted).
"""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.promharness import WebhookReceiver, start_alertmanager, wait_until

ROOT = Path(__file__).resolve().parent.parent
AM_CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
#: receivers that notify (the rest record: no integration)
NOTIFYING = ("fabricscope-page", "fabricscope-ticket")
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def config_for(webhook_url: str) -> dict[str, Any]:
    """The shipped configuration, its webhooks at ``webhook_url``, its group timers 1 s."""
    cfg: dict[str, Any] = yaml.safe_load(AM_CONFIG.read_text())
    for r in cfg["receivers"]:
        for w in r.get("webhook_configs", []):
            w["url"] = webhook_url
    for route in cfg["route"]["routes"]:
        if "group_wait" in route:
            route["group_wait"] = "1s"
            route["group_interval"] = "1s"
    return cfg


@dataclass(frozen=True, slots=True)
class Delivery:
    #: receiver -> notifications it sent (a notification carries one group's alerts)
    notifications: Counter[str]
    #: receiver -> alerts notified through it
    alerts: Counter[str]
    #: label sets of the alerts the inhibit rules suppressed
    suppressed: list[dict[str, str]]
    #: label sets of the alerts routed to a receiver without integration (info)
    recorded: list[dict[str, str]]
    #: the notifications as received
    bodies: list[dict[str, Any]]


def _api(url: str, path: str, body: object | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"{url}{path}", data=data, headers={"Content-Type": "application/json"}
    )
    with _OPENER.open(req, timeout=30) as r:
        text = r.read()
    return json.loads(text) if text else None


def deliver(
    label_sets: Sequence[Mapping[str, str]], workdir: Path, *, timeout: float = 90.0
) -> Delivery:
    """Post ``label_sets`` as firing alerts to a real Alertmanager running the shipped
    configuration; return what it notified once every alert routed to a notifying receiver
    and not suppressed has reached the webhook (``timeout`` seconds at most)."""
    alerts = [{"labels": dict(ls), "annotations": {}} for ls in label_sets]
    hook = WebhookReceiver()
    with hook, start_alertmanager(workdir, hook.url, config=config_for(hook.url)) as am:
        if alerts:
            _api(am.url, "/api/v2/alerts", alerts)

        def known() -> list[dict[str, Any]] | None:
            got: list[dict[str, Any]] = _api(am.url, "/api/v2/alerts")
            return got if len(got) >= len({json.dumps(a, sort_keys=True) for a in alerts}) else None

        state = wait_until(known, timeout=timeout, what="Alertmanager holds every alert")
        # the inhibitor decides as groups flush: read the states after the first flush
        expected = {
            a["fingerprint"] for a in state if any(r["name"] in NOTIFYING for r in a["receivers"])
        }

        def settled() -> list[dict[str, Any]] | None:
            now: list[dict[str, Any]] = _api(am.url, "/api/v2/alerts")
            want = {
                a["fingerprint"]: a["labels"]
                for a in now
                if a["fingerprint"] in expected and a["status"]["state"] == "active"
            }
            got = {json.dumps(a.get("labels"), sort_keys=True) for a in hook.alerts()}
            missing = [f for f, ls in want.items() if json.dumps(ls, sort_keys=True) not in got]
            return now if not missing else None

        final = wait_until(settled, timeout=timeout, what="every notifying alert notified")
    bodies = list(hook.notifications)
    notes: Counter[str] = Counter()
    per: Counter[str] = Counter()
    for b in bodies:
        notes[str(b["receiver"])] += 1
        per[str(b["receiver"])] += len(b["alerts"])  # type: ignore[arg-type]
    suppressed = [a["labels"] for a in final if a["status"]["state"] == "suppressed"]
    recorded = [
        a["labels"]
        for a in final
        if a["status"]["state"] == "active"
        and not any(r["name"] in NOTIFYING for r in a["receivers"])
    ]
    return Delivery(notes, per, suppressed, recorded, bodies)
