"""Probe membership from the Kubernetes API: the Ready pods of the agent's own DaemonSet.

:class:`KubernetesMembers` is a :class:`~agent.probe.schedule.membership.MembershipSource`. It lists
the agent pods (``GET /api/v1/namespaces/<namespace>/pods?labelSelector=<selector>``) and
then watches them from the list's resourceVersion in a background thread (the loop of
:class:`~agent.kubernetes.podwatch.ListWatch`, shared with the attribution's pod watch), so that
``members()`` only returns the latest tuple and never waits on the API server.

Who is a member
    One entry per pod that is ``Running``, has the condition ``Ready=True``, is not being
    deleted (no ``metadata.deletionTimestamp``) and has a ``status.hostIP``; the entry is that
    host IP in canonical form (:func:`~agent.probe.schedule.membership.normalize_host`), sorted and
    de-duplicated (two pods on one node during a DaemonSet surge are one member). A node that
    is going away drops out as soon as its pod is deleted, or when the node lifecycle
    controller marks the pod not Ready (node NotReady), so it is not scheduled.

Why the host IP, not the node name
    The probe service dials a member at ``(member, probe port)`` and checks, in the
    rendezvous, that the host it reached calls itself ``member`` (its node id). The agents run
    with ``hostNetwork``, so the host IP is where the rendezvous listens
    (``--probe.listen-address`` from the downward API's ``status.hostIP``), and the default
    node id is that listen host. Node names, by contrast, are usually not resolvable from
    inside pods. So every agent must use its host IP as its node id; :attr:`self_address`
    reads it from the API when ``self_node`` (the node name) is known.

Agreement
    Every agent watches the same objects, so all converge on the same list; between an event
    and its arrival at each agent (normally well under a second) schedules may differ for a
    round, which the pair protocol survives (a partner that does not expect the offer
    declines or is unreachable). A full relist every ``resync_seconds`` bounds drift from a
    missed event.

Failures
    410 Gone (an HTTP status or a watch ERROR event) relists, as client-go's reflector does,
    and is not an error. A 403 counts ``api_forbidden``, any other failure (HTTP error,
    connection refused, malformed JSON) ``api_error``; both keep the last good list, log one
    warning on the way into failing (DEBUG after), and back off exponentially.
"""

from __future__ import annotations

import ipaddress
import logging
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from agent.kubernetes.pods import mapping_field, resource_version, text_field
from agent.kubernetes.podwatch import (
    ListWatch,
    WatchSettings,
    default_api_client,
    watch_event,
)

if TYPE_CHECKING:
    from agent.kubernetes.podwatch import ClientFactory

log = logging.getLogger(__name__)

#: the reasons of :attr:`KubernetesMembers.errors_total`
ERROR_REASONS = ("api_error", "api_forbidden")


# --- pure: pods -> members -------------------------------------------------------------------


def _ready(status: Mapping[str, object]) -> bool:
    conditions = status.get("conditions")
    for cond in conditions if isinstance(conditions, list) else ():
        if isinstance(cond, dict) and cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def _host_ip(status: Mapping[str, object]) -> str | None:
    """``status.hostIP`` (else the first of ``status.hostIPs``) in canonical form."""
    host = text_field(status, "hostIP")
    if host is None:
        ips = status.get("hostIPs")
        first = ips[0] if isinstance(ips, list) and ips else None
        host = text_field(first, "ip") if isinstance(first, dict) else None
    if host is None:
        return None
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class AgentPod:
    """What is kept of one agent pod: its node, host IP (None when not yet assigned), and
    whether it is a member now (Running, Ready, not terminating, with a host IP)."""

    uid: str
    node_name: str | None
    host: str | None
    terminating: bool
    member: bool


def parse_agent_pod(obj: object) -> AgentPod | None:
    """One pod's API JSON -> :class:`AgentPod`; None when it has no uid (nor namespace and
    name to stand in for one)."""
    if not isinstance(obj, dict):
        return None
    meta = mapping_field(obj, "metadata")
    uid = text_field(meta, "uid")
    if uid is None:
        name, namespace = text_field(meta, "name"), text_field(meta, "namespace")
        if name is None or namespace is None:
            return None
        uid = f"{namespace}/{name}"
    status = mapping_field(obj, "status")
    host = _host_ip(status)
    terminating = meta.get("deletionTimestamp") is not None
    member = (
        not terminating and host is not None and status.get("phase") == "Running" and _ready(status)
    )
    return AgentPod(
        uid, text_field(mapping_field(obj, "spec"), "nodeName"), host, terminating, member
    )


def _pod_items(pods_json: object) -> list[object]:
    if isinstance(pods_json, dict):
        items = pods_json.get("items")
        if isinstance(items, list):
            return items
    elif isinstance(pods_json, list):
        return pods_json
    raise ValueError("not a pod list (no items)")


def members_from_pods(pods: Mapping[str, AgentPod] | list[AgentPod]) -> tuple[str, ...]:
    values = pods.values() if isinstance(pods, Mapping) else pods
    return tuple(sorted({p.host for p in values if p.member and p.host is not None}))


def members_from_pod_list(pods_json: object) -> tuple[str, ...]:
    """A ``PodList`` (or its ``items`` list) as the API returns it -> the members: the
    canonical host IPs of the Running, Ready, non-terminating pods, sorted and de-duplicated.
    Items that are not pods are ignored; ValueError when ``pods_json`` has no item list."""
    parsed = (parse_agent_pod(item) for item in _pod_items(pods_json))
    return members_from_pods([p for p in parsed if p is not None])


# --- the watch ---------------------------------------------------------------------------


class KubernetesMembers(ListWatch):
    """The probe members: Ready agent pods' host IPs, kept current by a list+watch thread
    (:class:`~agent.kubernetes.podwatch.ListWatch`).

    ``namespace`` and ``label_selector`` select the DaemonSet's pods. ``api_client`` makes the
    client (default: in-cluster configuration, else the kubeconfig). ``self_node`` is this
    node's name (``spec.nodeName``, from the downward API) or host IP; it only serves
    :attr:`self_address` and the log line saying when this node joins or leaves. A full
    relist happens every ``resync_seconds``; ``settings`` holds timeouts and backoff.

    The thread starts on :meth:`start` or the first :meth:`members` call; :meth:`close`
    stops it. ``members()`` never blocks and never raises: before the first successful
    list it returns ``()``, and on errors the last good list.
    """

    what = "probe members"

    def __init__(
        self,
        namespace: str,
        label_selector: str,
        *,
        api_client: ClientFactory | None = None,
        self_node: str | None = None,
        resync_seconds: float = 300,
        settings: WatchSettings | None = None,
    ) -> None:
        if not namespace:
            raise ValueError("namespace must not be empty")
        if not label_selector:
            raise ValueError("label_selector must not be empty (it selects the agent pods)")
        if not resync_seconds > 0:
            raise ValueError(f"resync_seconds must be > 0, not {resync_seconds!r}")
        super().__init__(
            api_client or default_api_client,
            settings or WatchSettings(),
            thread_name="probe-k8s-members",
            resync_seconds=float(resync_seconds),
        )
        self.namespace = namespace
        self.label_selector = label_selector
        self._self_node = self_node.strip().lower() if self_node else None
        self._pods: dict[str, AgentPod] = {}  # the thread's own; published as tuples below
        self._members: tuple[str, ...] = ()
        self._self_address: str | None = None
        self._self_member = False
        self._errors = dict.fromkeys(ERROR_REASONS, 0)

    @property
    def where(self) -> str:
        return f"pods {self.label_selector!r} in namespace {self.namespace}"

    # -- what the probe reads ------------------------------------------------------------

    def members(self) -> tuple[str, ...]:
        """The current members (canonical host IPs, sorted); starts the watch if needed."""
        if self._thread is None and not self._stop.is_set():
            self.start()
        return self._members

    @property
    def errors_total(self) -> dict[str, int]:
        """Failed list/watch requests by reason (every reason of :data:`ERROR_REASONS`)."""
        with self._lock:
            return dict(self._errors)

    @property
    def self_address(self) -> str | None:
        """The host IP of this node's agent pod (``self_node`` matched against
        ``spec.nodeName`` or the host IP), Ready or not, unless it is terminating; None when
        ``self_node`` is unset or no such pod is known."""
        return self._self_address

    # -- the list+watch ------------------------------------------------------------------

    def _path(self) -> tuple[str, dict[str, str]]:
        path = f"/api/v1/namespaces/{urllib.parse.quote(self.namespace, safe='')}/pods"
        return path, {"labelSelector": self.label_selector}

    def _parse(self, item: object) -> AgentPod | None:
        return parse_agent_pod(item)

    def _replace(self, items: list[object]) -> str:
        self._pods = {p.uid: p for p in cast("list[AgentPod]", items)}
        self._publish()
        return f"{len(self._members)} members"

    def _apply(self, event: object, version: str) -> str:
        kind, obj = watch_event(event)
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            pod = parse_agent_pod(obj)
            if pod is not None:
                if kind == "DELETED":
                    self._pods.pop(pod.uid, None)
                else:
                    self._pods[pod.uid] = pod
                self._publish()
        return resource_version(obj) or version

    def _failed(self, reason: str) -> None:
        with self._lock:
            self._errors[reason] += 1

    # -- publishing ---------------------------------------------------------------------

    def _publish(self) -> None:
        """Swap in the members and self address computed from the thread's pods; log what
        changed."""
        members = members_from_pods(self._pods)
        before, self._members = self._members, members
        if members != before:
            joined = sorted(set(members) - set(before))
            left = sorted(set(before) - set(members))
            log.info(
                "probe members from %s: %d (joined %s, left %s)",
                self.where,
                len(members),
                ", ".join(joined) or "none",
                ", ".join(left) or "none",
            )
        if self._self_node is None:
            return
        mine = [
            p
            for p in self._pods.values()
            if not p.terminating and self._self_node in (p.node_name, p.host)
        ]
        address = next((p.host for p in sorted(mine, key=lambda p: not p.member) if p.host), None)
        self._self_address = address
        is_member = address is not None and address in members
        if is_member != self._self_member:
            self._self_member = is_member
            log.info(
                "probe members: this node (%s, %s) %s",
                self._self_node,
                address or "no host IP",
                "is a member" if is_member else "is no longer a member",
            )

    def _state_changed(self, state: str, detail: str, previous: str) -> None:
        if state == previous:
            if state != "ok":
                log.debug("probe members: still failing: %s (%s)", state, detail)
            return
        if state == "ok":
            log.info("probe members from %s: ok (%s)", self.where, detail)
        else:
            log.warning(
                "probe members from %s failing: %s (%s); keeping the last good list (%d members)",
                self.where,
                state,
                detail,
                len(self._members),
            )
