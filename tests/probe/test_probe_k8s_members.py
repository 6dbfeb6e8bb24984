"""Probe membership from the Kubernetes API: the pure pod-list -> members function (table
tests), then :class:`KubernetesMembers` with the real ``kubernetes`` client against an API
server stand-in (pytest-httpserver on 127.0.0.1 serving JSON shaped like the API's: PodList,
newline-delimited watch events, Status errors, 410 Gone)."""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from kubernetes.client import ApiClient, Configuration
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from agent.probe.schedule.k8s_members import (
    ERROR_REASONS,
    AgentPod,
    KubernetesMembers,
    members_from_pod_list,
    parse_agent_pod,
)
from agent.probe.schedule.membership import MembershipSource
from tests.kubeapi import EXPIRED, FAST, FakeApi, clear_proxies, pod_list, status

NS = "fabricscope"
SELECTOR = "app.kubernetes.io/name=fabricscope"
PODS_PATH = f"/api/v1/namespaces/{NS}/pods"


def agent_pod(
    name: str,
    node: str,
    host: str | None,
    *,
    phase: str = "Running",
    ready: bool | None = True,
    terminating: bool = False,
    version: str = "1",
    uid: str | None = None,
    kind: bool = False,
) -> dict[str, object]:
    """An agent pod as the API returns it (list items carry no kind/apiVersion; watch
    objects do). ``ready`` None: no Ready condition yet (a pod just scheduled)."""
    meta: dict[str, object] = {
        "name": name,
        "generateName": "fabricscope-",
        "namespace": NS,
        "uid": uid or f"00000000-0000-4000-8000-{abs(hash(name)) % 10**12:012d}",
        "resourceVersion": version,
        "creationTimestamp": "2026-11-20T10:00:00Z",
        "labels": {
            "app.kubernetes.io/name": "fabricscope",
            "controller-revision-hash": "6d9f8b7c5",
            "pod-template-generation": "3",
        },
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "name": "fabricscope",
                "uid": "5f0c1e2a-3b4c-4d5e-8f90-a1b2c3d4e5f6",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if terminating:
        meta["deletionTimestamp"] = "2026-11-20T11:00:00Z"
        meta["deletionGracePeriodSeconds"] = 30
    status: dict[str, object] = {"phase": phase, "startTime": "2026-11-20T10:00:01Z"}
    if host is not None:
        status["hostIP"] = host
        status["hostIPs"] = [{"ip": host}]
        status["podIP"] = host  # hostNetwork: the pod IP is the node's
        status["podIPs"] = [{"ip": host}]
    if ready is not None:
        flag = "True" if ready else "False"
        status["conditions"] = [
            {"type": "PodReadyToStartContainers", "status": "True"},
            {"type": "Initialized", "status": "True"},
            {"type": "Ready", "status": flag, "lastTransitionTime": "2026-11-20T10:00:09Z"},
            {"type": "ContainersReady", "status": flag},
            {"type": "PodScheduled", "status": "True"},
        ]
    obj: dict[str, object] = {
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "hostNetwork": True,
            "containers": [{"name": "agent", "image": "fabricscope:dev"}],
        },
        "status": status,
    }
    if kind:
        obj = {"kind": "Pod", "apiVersion": "v1", **obj}
    return obj


A = agent_pod("fabricscope-a", "gpu-a01", "10.0.0.11", uid="uid-a")
B = agent_pod("fabricscope-b", "gpu-a02", "10.0.0.12", uid="uid-b")
C = agent_pod("fabricscope-c", "gpu-a03", "10.0.0.9", uid="uid-c")


# --- the pure function -----------------------------------------------------------------------

TABLE = [
    ("running and ready", [A], ("10.0.0.11",)),
    ("pending", [agent_pod("p", "n", "10.0.0.1", phase="Pending", ready=False)], ()),
    ("running, not ready", [agent_pod("p", "n", "10.0.0.1", ready=False)], ()),
    ("no Ready condition yet", [agent_pod("p", "n", "10.0.0.1", ready=None)], ()),
    ("terminating though ready", [agent_pod("p", "n", "10.0.0.1", terminating=True)], ()),
    ("no hostIP yet", [agent_pod("p", "n", None)], ()),
    ("hostIP not an address", [agent_pod("p", "n", "gpu-a01")], ()),
    ("succeeded", [agent_pod("p", "n", "10.0.0.1", phase="Succeeded", ready=False)], ()),
    ("IPv6 in canonical form", [agent_pod("p", "n", "2001:DB8:0::7")], ("2001:db8::7",)),
    (
        "surge: two ready pods on one node are one member",
        [A, agent_pod("fabricscope-a2", "gpu-a01", "10.0.0.11", uid="uid-a2")],
        ("10.0.0.11",),
    ),
    (
        "sorted as text, as every member source sorts",
        [A, B, C],
        ("10.0.0.11", "10.0.0.12", "10.0.0.9"),
    ),
    ("not pods are ignored", [A, "junk", {"metadata": {}}, None], ("10.0.0.11",)),
    ("empty", [], ()),
]


@pytest.mark.parametrize(("pods", "members"), [t[1:] for t in TABLE], ids=[t[0] for t in TABLE])
def test_members_from_pod_list(pods: list[object], members: tuple[str, ...]) -> None:
    assert members_from_pod_list(pod_list("7", *pods)) == members  # type: ignore[arg-type]
    assert members_from_pod_list(pods) == members  # a bare items list works too


def test_member_order_does_not_depend_on_the_api_order() -> None:
    pods = [A, B, C, agent_pod("d", "gpu-b01", "10.0.1.2"), agent_pod("e", "gpu-b02", "::1")]
    results = {members_from_pod_list(list(p)) for p in itertools.permutations(pods)}
    assert results == {("10.0.0.11", "10.0.0.12", "10.0.0.9", "10.0.1.2", "::1")}


def test_host_ips_list_stands_in_for_a_missing_host_ip() -> None:
    pod = agent_pod("p", "gpu-a01", None)
    pod["status"] = {**pod["status"], "hostIPs": [{"ip": "10.0.0.5"}, {"ip": "fd00::5"}]}  # type: ignore[dict-item]
    assert members_from_pod_list([pod]) == ("10.0.0.5",)


def test_parse_agent_pod_keeps_what_membership_needs() -> None:
    assert parse_agent_pod(A) == AgentPod("uid-a", "gpu-a01", "10.0.0.11", False, True)
    assert parse_agent_pod(agent_pod("p", "n", "10.0.0.1", terminating=True, uid="u")) == (
        AgentPod("u", "n", "10.0.0.1", True, False)
    )
    assert parse_agent_pod({"metadata": {"name": "x", "namespace": NS}}) == AgentPod(
        f"{NS}/x", None, None, False, False
    )
    assert parse_agent_pod({"metadata": {"name": "x"}}) is None
    assert parse_agent_pod("not a pod") is None


@pytest.mark.parametrize("body", [{"kind": "Status"}, "text", 3, {"items": "no"}])
def test_members_from_something_not_a_list_is_a_value_error(body: object) -> None:
    with pytest.raises(ValueError, match="not a pod list"):
        members_from_pod_list(body)


def test_constructor_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="namespace"):
        KubernetesMembers("", SELECTOR)
    with pytest.raises(ValueError, match="label_selector"):
        KubernetesMembers(NS, "")
    with pytest.raises(ValueError, match="resync_seconds"):
        KubernetesMembers(NS, SELECTOR, resync_seconds=0)


# --- an API server stand-in ------------------------------------------------------------------


FORBIDDEN = status(
    403,
    "Forbidden",
    'pods is forbidden: User "system:serviceaccount:fabricscope:fabricscope" cannot list '
    'resource "pods" in API group "" in the namespace "fabricscope"',
)


@pytest.fixture
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_proxies(monkeypatch)


@pytest.fixture
def fake_api(httpserver: HTTPServer, no_proxy: None) -> FakeApi:
    api = FakeApi()
    httpserver.expect_request(PODS_PATH, method="GET").respond_with_handler(api.handle)
    return api


def client_for(url: str) -> Callable[[], ApiClient]:
    def make() -> ApiClient:
        cfg = Configuration(host=url.rstrip("/"))
        cfg.retries = 0
        return ApiClient(cfg)

    return make


def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


@pytest.fixture
def make_members(
    fake_api: FakeApi, httpserver: HTTPServer
) -> Iterator[Callable[..., KubernetesMembers]]:
    made: list[KubernetesMembers] = []

    def make(**kwargs: object) -> KubernetesMembers:
        m = KubernetesMembers(
            NS,
            SELECTOR,
            api_client=client_for(httpserver.url_for("/")),
            settings=FAST,
            **kwargs,  # type: ignore[arg-type]
        )
        made.append(m)
        return m

    yield make
    for m in made:
        m.close()


def test_list_then_watch_follows_pods_joining_leaving_and_turning_unready(
    fake_api: FakeApi, make_members: Callable[..., KubernetesMembers]
) -> None:
    fake_api.lists = [pod_list("1000", B, A)]
    c_starting = agent_pod(
        "fabricscope-c", "gpu-a03", "10.0.0.9", ready=False, uid="uid-c", version="1010"
    )
    c_ready = agent_pod("fabricscope-c", "gpu-a03", "10.0.0.9", uid="uid-c", version="1020")
    bookmark = {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "1015"}}
    fake_api.watches = [
        [{"type": "ADDED", "object": {"kind": "Pod", "apiVersion": "v1", **c_starting}}],
        [
            {"type": "BOOKMARK", "object": bookmark},
            {"type": "MODIFIED", "object": {"kind": "Pod", "apiVersion": "v1", **c_ready}},
        ],
        [
            {
                "type": "MODIFIED",  # node gpu-a01 went NotReady: its pod is marked not Ready
                "object": agent_pod(
                    "fabricscope-a",
                    "gpu-a01",
                    "10.0.0.11",
                    ready=False,
                    uid="uid-a",
                    version="1030",
                    kind=True,
                ),
            }
        ],
        [
            {
                "type": "MODIFIED",  # gpu-a02 is drained: its pod is terminating
                "object": agent_pod(
                    "fabricscope-b",
                    "gpu-a02",
                    "10.0.0.12",
                    terminating=True,
                    uid="uid-b",
                    version="1040",
                    kind=True,
                ),
            },
            {
                "type": "DELETED",
                "object": agent_pod(
                    "fabricscope-b",
                    "gpu-a02",
                    "10.0.0.12",
                    terminating=True,
                    uid="uid-b",
                    version="1041",
                    kind=True,
                ),
            },
        ],
    ]
    m = make_members()
    source: MembershipSource = m
    assert source.members() in ((), ("10.0.0.11", "10.0.0.12"))  # starts the watch; no wait
    assert m.wait_synced(5)
    seen: list[tuple[str, ...]] = []

    def settled() -> bool:
        now = m.members()
        if not seen or seen[-1] != now:
            seen.append(now)
        return now == ("10.0.0.9",)

    until(settled)
    # every list the probe could have read was a consistent state, in the order of the
    # events (the watch may have applied some before the first read here: a loaded machine)
    order = [
        ("10.0.0.11", "10.0.0.12"),
        ("10.0.0.11", "10.0.0.12", "10.0.0.9"),
        ("10.0.0.12", "10.0.0.9"),
        ("10.0.0.9",),
    ]
    assert set(seen) <= set(order), seen
    steps = [order.index(s) for s in seen]
    assert steps == sorted(set(steps)), seen
    until(lambda: len(fake_api.watch_requests()) >= 5)
    lists, watches = fake_api.list_requests(), fake_api.watch_requests()
    assert lists[0] == {"labelSelector": SELECTOR, "resourceVersion": "0"}
    assert watches[0] == {
        "labelSelector": SELECTOR,
        "watch": "true",
        "resourceVersion": "1000",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "5",
    }
    # each watch resumes from the latest resourceVersion seen (a bookmark's counts too)
    assert [r["resourceVersion"] for r in watches[:5]] == ["1000", "1010", "1020", "1030", "1041"]
    assert len(lists) == 1 and m.healthy and m.lists_total == 1
    assert m.errors_total == dict.fromkeys(ERROR_REASONS, 0)


def test_expired_watch_event_relists(
    fake_api: FakeApi, make_members: Callable[..., KubernetesMembers]
) -> None:
    fake_api.lists = [pod_list("1000", A), pod_list("1500", A, B)]
    fake_api.watches = [[{"type": "ERROR", "object": EXPIRED}]]
    m = make_members()
    m.start()
    until(lambda: m.members() == ("10.0.0.11", "10.0.0.12"))
    assert len(fake_api.list_requests()) == 2
    until(lambda: any(r["resourceVersion"] == "1500" for r in fake_api.watch_requests()))
    assert m.errors_total == dict.fromkeys(ERROR_REASONS, 0)  # 410 is the protocol
    assert m.healthy


def test_410_status_on_the_watch_request_relists(
    fake_api: FakeApi, make_members: Callable[..., KubernetesMembers]
) -> None:
    fake_api.lists = [pod_list("1000", A), pod_list("1600", C, A)]
    fake_api.watch_fail = (410, EXPIRED)
    m = make_members()
    m.start()
    until(lambda: m.members() == ("10.0.0.11", "10.0.0.9"))
    assert len(fake_api.list_requests()) == 2 and m.errors_total["api_error"] == 0


def test_forbidden_keeps_the_last_list_counts_logs_once_and_recovers(
    fake_api: FakeApi,
    make_members: Callable[..., KubernetesMembers],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="agent.probe.schedule.k8s_members")
    fake_api.lists = [pod_list("1000", A, B)]
    fake_api.watches = [[{"type": "ERROR", "object": FORBIDDEN}]]  # RBAC lost mid-watch
    m = make_members()
    m.start()
    until(lambda: m.errors_total["api_forbidden"] >= 1)
    with fake_api.lock:
        fake_api.fail = (403, FORBIDDEN)  # and every later request is refused
    until(lambda: m.errors_total["api_forbidden"] >= 4)
    assert m.members() == ("10.0.0.11", "10.0.0.12")  # the last good list
    assert not m.healthy and m.errors_total["api_error"] == 0
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "api_forbidden" in warnings[0].getMessage()
    assert "keeping the last good list (2 members)" in warnings[0].getMessage()
    n = len(fake_api.requests)
    time.sleep(0.3)  # backing off: at most one request per 0.2 s once at the cap
    assert len(fake_api.requests) - n <= 3
    with fake_api.lock:
        fake_api.fail = None  # RBAC fixed
        fake_api.lists = [pod_list("2000", A, B, C)]
        fake_api.watches = [[{"type": "ERROR", "object": EXPIRED}]]  # the version is old
    until(lambda: m.healthy and m.members() == ("10.0.0.11", "10.0.0.12", "10.0.0.9"))


def test_forbidden_before_any_list_gives_no_members(
    fake_api: FakeApi, make_members: Callable[..., KubernetesMembers]
) -> None:
    fake_api.lists = [pod_list("1000", A)]
    fake_api.fail = (403, FORBIDDEN)
    m = make_members()
    assert m.members() == ()
    until(lambda: m.errors_total["api_forbidden"] >= 2)
    assert m.members() == () and not m.healthy and not m.wait_synced(0)


def test_server_error_and_bad_json_are_api_errors(
    fake_api: FakeApi, make_members: Callable[..., KubernetesMembers]
) -> None:
    fake_api.lists = [pod_list("1000", A)]
    fake_api.fail = (500, status(500, "InternalError", "etcdserver: request timed out"))
    m = make_members()
    m.start()
    until(lambda: m.errors_total["api_error"] >= 1)
    with fake_api.lock:
        fake_api.fail = None
        fake_api.watches = [["not json"]]  # type: ignore[list-item]
    until(lambda: m.errors_total["api_error"] >= 2)
    assert m.members() == ("10.0.0.11",)  # the list survives a broken watch
    assert m.errors_total["api_forbidden"] == 0


def test_unreachable_api_server_backs_off_and_counts(no_proxy: None) -> None:
    m = KubernetesMembers(
        NS, SELECTOR, api_client=client_for("http://127.0.0.1:9"), settings=FAST
    )  # the discard port: connection refused
    try:
        t0 = time.monotonic()
        assert m.members() == ()
        assert time.monotonic() - t0 < 0.1
        until(lambda: m.errors_total["api_error"] >= 3)
        assert m.errors_total["api_forbidden"] == 0 and not m.healthy
    finally:
        m.close()
    assert not m.running


def test_periodic_resync_relists(
    fake_api: FakeApi, make_members: Callable[..., KubernetesMembers]
) -> None:
    """A change the watch never delivered (a missed event) shows up at the next resync."""
    fake_api.lists = [pod_list("1000", A), pod_list("1100", A, B)]
    m = make_members(resync_seconds=0.3)
    m.start()
    until(lambda: m.members() == ("10.0.0.11", "10.0.0.12"))
    assert m.lists_total >= 2 and m.errors_total == dict.fromkeys(ERROR_REASONS, 0)
    # the watch ends by the resync time (timeoutSeconds is at least 1)
    assert fake_api.watch_requests()[0]["timeoutSeconds"] == "1"


def test_identical_members_whatever_the_api_order(httpserver: HTTPServer, no_proxy: None) -> None:
    pods = [A, B, C, agent_pod("d", "gpu-b01", "10.0.1.2", ready=False)]
    got: list[tuple[str, ...]] = []
    for order, items in enumerate((pods, pods[::-1], pods[2:] + pods[:2])):
        api = FakeApi()
        api.lists = [pod_list("1", *items)]
        path = f"/api/v1/namespaces/ns{order}/pods"
        httpserver.expect_request(path).respond_with_handler(api.handle)
        m = KubernetesMembers(
            f"ns{order}", SELECTOR, api_client=client_for(httpserver.url_for("/")), settings=FAST
        )
        try:
            m.start()
            assert m.wait_synced(5)
            got.append(m.members())
        finally:
            m.close()
    assert got == [("10.0.0.11", "10.0.0.12", "10.0.0.9")] * 3


def test_self_address_is_this_nodes_pod_ready_or_not(
    fake_api: FakeApi, make_members: Callable[..., KubernetesMembers]
) -> None:
    starting = agent_pod("fabricscope-c", "gpu-a03", "10.0.0.9", ready=False, uid="uid-c")
    leaving = agent_pod("fabricscope-d", "gpu-a04", "10.0.0.4", terminating=True, uid="uid-d")
    fake_api.lists = [pod_list("1000", A, starting, leaving)]
    mine = make_members(self_node="GPU-A03")
    cases = {
        "10.0.0.9": mine,  # known while its pod is not yet Ready (and so not a member)
        None: make_members(self_node="gpu-a04"),  # its pod is terminating
        "10.0.0.11": make_members(self_node="10.0.0.11"),  # matched by host IP
    }
    for address, m in cases.items():
        m.start()
        assert m.wait_synced(5)
        assert m.members() == ("10.0.0.11",)
        assert m.self_address == address
    assert make_members().self_address is None  # no self_node given


def test_this_node_joining_is_logged(
    fake_api: FakeApi,
    make_members: Callable[..., KubernetesMembers],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="agent.probe.schedule.k8s_members")
    starting = agent_pod("fabricscope-c", "gpu-a03", "10.0.0.9", ready=False, uid="uid-c")
    fake_api.lists = [pod_list("1000", A, starting)]
    fake_api.watches = [[{"type": "MODIFIED", "object": {"kind": "Pod", "apiVersion": "v1", **C}}]]
    m = make_members(self_node="gpu-a03")
    m.start()
    until(lambda: m.members() == ("10.0.0.11", "10.0.0.9"))
    lines = [r.getMessage() for r in caplog.records]
    assert "probe members: this node (gpu-a03, 10.0.0.9) is a member" in lines
    assert any("(joined 10.0.0.9, left none)" in line for line in lines)


def test_members_never_block_and_close_interrupts_a_watch(no_proxy: None) -> None:
    """The list hangs: members() still answers at once. Then the watch streams an event and
    stays open (chunked, as a real API server's): the event applies on arrival, and close()
    does not wait for the stream."""
    release_list, release_watch = threading.Event(), threading.Event()

    def handle(request: Request) -> Response:
        if request.args.get("watch") != "true":
            release_list.wait(10)
            return Response(json.dumps(pod_list("1000", A)), mimetype="application/json")

        def events() -> Iterator[str]:
            yield json.dumps({"type": "ADDED", "object": {**B, "kind": "Pod"}}) + "\n"
            release_watch.wait(10)

        return Response(events(), mimetype="application/json")

    server = HTTPServer(host="127.0.0.1", threaded=True)
    server.start()
    server.expect_request(PODS_PATH).respond_with_handler(handle)
    m = KubernetesMembers(NS, SELECTOR, api_client=client_for(server.url_for("/")), settings=FAST)
    try:
        m.start()
        t0 = time.monotonic()
        for _ in range(100):
            assert m.members() == ()
        assert time.monotonic() - t0 < 0.1 and not m.healthy
        release_list.set()
        until(lambda: m.members() == ("10.0.0.11", "10.0.0.12"))  # while the stream is open
        assert m.healthy
        t0 = time.monotonic()
        m.close(timeout=2.0)
        assert time.monotonic() - t0 < 1.0 and not m.running
        assert m.members() == ("10.0.0.11", "10.0.0.12")  # readable after close, no restart
        assert not m.running
        assert m.errors_total == dict.fromkeys(ERROR_REASONS, 0)
    finally:
        release_list.set()
        release_watch.set()
        m.close()
        server.clear()
        server.stop()
