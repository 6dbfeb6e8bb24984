"""Pod attribution end to end: the kubelet's pod-resources API (a real gRPC server on a unix
socket), the real ``kubernetes`` client against an API server stand-in (pytest-httpserver
serving JSON shaped like the API's: PodList, watch events, Status errors), GPU processes'
cgroups from real /proc/<pid>/cgroup files, and the exported series."""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from kubernetes.client import ApiClient, Configuration
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from agent.core.errors import NoData
from agent.core.runner import Runner, SamplerSpec
from agent.core.sysfs import ReadIssue, SysfsReader
from agent.infiniband.records import IbDevice, InfinibandSnapshot
from agent.kubernetes import podresources_pb2 as pb
from agent.kubernetes import podresources_pb2_grpc as pb_grpc
from agent.kubernetes.allocation import GpuAllocation
from agent.kubernetes.attribution import (
    KUBELET_LIST_MAX_AGE_SECONDS,
    AttributionSampler,
    AttributionSnapshot,
    ContainerCpus,
    GpuAttribution,
    RdmaAttribution,
    attribute_allocations,
    gpu_allocation,
    is_gpu_resource,
    is_rdma_resource,
    normalize_pci_address,
    resolve_gpu,
)
from agent.kubernetes.cgroup import PodContainer
from agent.kubernetes.podresources import ContainerAllocation, DeviceAllocation, PodAllocation
from agent.kubernetes.podwatch import (
    PodIndex,
    PodMeta,
    PodWatcher,
    iter_lines,
    parse_pod,
)
from agent.nvml.snapshot import ComputeProcess, NvmlGpu, NvmlSnapshot
from exporter.metrics import attribution as render_attribution
from exporter.metrics.exposition import render_text
from exporter.metrics.spec import Families
from tests.kubeapi import EXPIRED, FAST, FakeApi, clear_proxies, pod_list, status
from tests.promharness import promtool_check_metrics

PROCFS = Path(__file__).resolve().parents[1] / "fixtures" / "procfs-cgroup"
NODE = "node-a"

GPU0 = "GPU-5b2c6e4e-05c6-1d1e-6b09-0b9f1f8e3c51"
GPU1 = "GPU-9a1f4c42-8f5e-63a1-2b3c-1c7e6a6b2f10"
MIG_NEW = "MIG-0c8e4b2a-7d36-5b1e-9f0a-2f3c4d5e6f70"

# Pods whose UIDs and container ids are those of tests/fixtures/procfs-cgroup/{1001,1002,1009}
TRAINER_UID = "7fda01c4-0ece-403d-88b4-c371d66d132a"
TRAINER_CID = "e58a24d4a722c99712cff74ef69d93311089584eb32617b3890e0dcb996133f1"
EVAL_UID = "042efd86-1f3b-4f2f-8736-f31c58e95bbc"
EVAL_CID = "f33f47b0db740bb647cb3e7ac62d96c74966dbb99cbfaf4563bfd42d387e8b44"
ETCD_HASH = "d8992f589d8dd12c4342376ccb459375"
ETCD_CID = "ecbcea5cd29afb25ba519715e827cda9e66cd0a914207f49ce0a292a6aa84d66"

NVML = NvmlSnapshot(
    driver_version="580.159.04",
    gpus=(
        NvmlGpu(
            index=0,
            pci_bus_id="0000:19:00.0",
            uuid=GPU0,
            compute_processes=(
                ComputeProcess(1001, 40 << 30),  # trainer-0's worker
                ComputeProcess(2215, 1 << 20),  # a host process
                ComputeProcess(424242, None),  # exited before its cgroup was read
            ),
        ),
        NvmlGpu(
            index=1,
            pci_bus_id="0000:3b:00.0",
            uuid=GPU1,
            compute_processes=(ComputeProcess(1002, 8 << 30), ComputeProcess(1009, None)),
        ),
    ),
)


def ib_device(name: str, pci: str) -> IbDevice:
    return IbDevice(
        name, "28.39.1002", "MT_0000000838", "MT4129", None, "CA", pci, 0, "mlx5_core", ()
    )


IB = InfinibandSnapshot(
    devices=(
        ib_device("mlx5_0", "0000:1a:00.0"),
        ib_device("mlx5_2", "0000:1a:00.2"),  # an SR-IOV VF of mlx5_0, bound on the host
        ib_device("mlx5_3", "0000:3c:00.0"),
    )
)


# --- pure joins ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0000:1a:00.2", "0000:1a:00.2"),
        ("0000:1A:00.2", "0000:1a:00.2"),
        ("1a:00.2", "0000:1a:00.2"),
        ("10000:01:00.0", "10000:01:00.0"),  # VMD domains have 5 digits
        ("mlx5_2", None),
        ("GPU-5b2c6e4e", None),
        ("0000:1a:00.8", None),
    ],
)
def test_normalize_pci_address(text: str, expected: str | None) -> None:
    assert normalize_pci_address(text) == expected


@pytest.mark.parametrize(
    ("device_id", "uuid", "gpu"),
    [
        (GPU1, GPU1, 1),
        (GPU1.lower().replace("gpu-", "GPU-"), GPU1.lower().replace("gpu-", "GPU-"), 1),
        (GPU0 + "::3", GPU0, 0),  # time-slicing replica 3 of GPU 0
        ("1", GPU1, 1),  # device-id-strategy=index
        ("0:2", "0:2", 0),  # index strategy, MIG device 2 of GPU 0
        ("MIG-" + GPU1 + "/7/0", "MIG-" + GPU1 + "/7/0", 1),  # pre-R470 MIG id names its GPU
        (MIG_NEW, MIG_NEW, None),  # R470+ MIG UUID: parent unknown without MIG queries
        (
            "GPU-00000000-0000-0000-0000-000000000000",
            "GPU-00000000-0000-0000-0000-000000000000",
            None,
        ),
        ("7", "7", None),
    ],
)
def test_resolve_gpu(device_id: str, uuid: str, gpu: int | None) -> None:
    got_uuid, got = resolve_gpu(device_id, NVML)
    assert (got_uuid, got.index if got is not None else None) == (uuid, gpu)


def test_resource_classes() -> None:
    assert is_gpu_resource("nvidia.com/gpu", ["0"])
    assert is_gpu_resource("nvidia.com/gpu.shared", [GPU0 + "::1"])
    assert is_gpu_resource("nvidia.com/mig-1g.10gb", [MIG_NEW])
    assert is_gpu_resource("nvidia.com/a100", [GPU0])
    assert not is_gpu_resource("nvidia.com/rdma_shared_device_a", ["0"])
    assert not is_gpu_resource("amd.com/gpu", ["0000:c1:00.0"])
    for name in (
        "rdma/hca_shared_devices_a",
        "openshift.io/mlxnics",
        "intel.com/mlnx_sriov_rdma",
        "nvidia.com/rdma_shared_device_a",
        "nvidia.com/hostdev",
        "example.com/sriov_vf",
    ):
        assert is_rdma_resource(name), name
    assert not is_rdma_resource("amd.com/gpu")
    assert not is_rdma_resource("smarter-devices/fuse")


def alloc(ns: str, name: str, *containers: ContainerAllocation) -> PodAllocation:
    return PodAllocation(ns, name, containers)


ALLOCATIONS = (
    alloc(
        "ml",
        "trainer-0",
        ContainerAllocation(
            "worker",
            (
                DeviceAllocation("nvidia.com/gpu", (GPU0,), (0,)),
                DeviceAllocation("intel.com/mlnx_sriov_rdma", ("0000:1A:00.2",), (0,)),
                DeviceAllocation("rdma/hca_shared_devices_a", ("7f3c9b1a",)),  # opaque: kept
                DeviceAllocation("openshift.io/mlxnics", ("mlx5_3",)),
                DeviceAllocation("intel.com/sriov_netdevice", ("0000:5e:02.1",)),  # VF in the pod
                DeviceAllocation("amd.com/gpu", ("0000:c1:00.0",)),  # not ours: skipped
                DeviceAllocation("example.com/nic", ("0000:1a:00.0",)),  # resolves: kept
            ),
            (8, 9, 10, 11),
        ),
        ContainerAllocation("sidecar"),
    ),
    alloc(
        "ml",
        "tiny-0",
        ContainerAllocation("job", (DeviceAllocation("nvidia.com/mig-1g.10gb", (MIG_NEW,)),)),
    ),
)


def test_attribute_allocations_joins_hardware_and_keeps_unknown_ids() -> None:
    gpus, rdma, cpus = attribute_allocations(ALLOCATIONS, NVML, IB)
    assert gpus == [
        GpuAttribution("ml", "trainer-0", "worker", GPU0, 0, "0000:19:00.0", "podresources"),
        GpuAttribution("ml", "tiny-0", "job", MIG_NEW, None, None, "podresources", mig="unknown"),
    ]
    w = ("ml", "trainer-0", "worker")
    assert rdma == [
        RdmaAttribution(*w, "intel.com/mlnx_sriov_rdma", "0000:1A:00.2", "mlx5_2", "0000:1a:00.2"),
        RdmaAttribution(*w, "rdma/hca_shared_devices_a", "7f3c9b1a", None, None),
        RdmaAttribution(*w, "openshift.io/mlxnics", "mlx5_3", "mlx5_3", "0000:3c:00.0"),
        RdmaAttribution(*w, "intel.com/sriov_netdevice", "0000:5e:02.1", None, "0000:5e:02.1"),
        RdmaAttribution(*w, "example.com/nic", "0000:1a:00.0", "mlx5_0", "0000:1a:00.0"),
    ]
    assert cpus == [ContainerCpus(*w, (8, 9, 10, 11))]


def test_attribute_allocations_without_hardware_snapshots() -> None:
    gpus, rdma, _ = attribute_allocations(ALLOCATIONS, None, None)
    assert [(g.uuid, g.gpu, g.pci_bus_id) for g in gpus] == [
        (GPU0, None, None),
        (MIG_NEW, None, None),
    ]
    # without the InfiniBand snapshot nothing resolves, and only RDMA-named pools are kept
    assert [(r.resource, r.device, r.pci_bus_id) for r in rdma] == [
        ("intel.com/mlnx_sriov_rdma", None, "0000:1a:00.2"),
        ("rdma/hca_shared_devices_a", None, None),
        ("openshift.io/mlxnics", None, None),
        ("intel.com/sriov_netdevice", None, "0000:5e:02.1"),
    ]


# --- pod JSON and the index ---------------------------------------------------------------


def pod_json(
    uid: str,
    name: str,
    namespace: str,
    containers: dict[str, str],
    *,
    version: str = "1",
    annotations: dict[str, str] | None = None,
    runtime: str = "containerd",
    kind: bool = False,
) -> dict[str, object]:
    """A pod as the API returns it (list items carry no kind/apiVersion; watch objects do)."""
    meta: dict[str, object] = {
        "name": name,
        "namespace": namespace,
        "uid": uid,
        "resourceVersion": version,
        "creationTimestamp": "2026-11-20T10:00:00Z",
        "labels": {"app": name.rsplit("-", 1)[0]},
    }
    if annotations:
        meta["annotations"] = annotations
    obj: dict[str, object] = {
        "metadata": meta,
        "spec": {
            "nodeName": NODE,
            "containers": [
                {"name": c, "image": "nvcr.io/nvidia/pytorch:25.10-py3"} for c in containers
            ],
        },
        "status": {
            "phase": "Running",
            "hostIP": "10.0.0.11",
            "podIP": "10.244.1.7",
            "containerStatuses": [
                {
                    "name": c,
                    "containerID": f"{runtime}://{cid}",
                    "image": "nvcr.io/nvidia/pytorch:25.10-py3",
                    "imageID": "nvcr.io/nvidia/pytorch@sha256:" + "0" * 64,
                    "ready": True,
                    "restartCount": 0,
                    "started": True,
                    "state": {"running": {"startedAt": "2026-11-20T10:00:05Z"}},
                }
                for c, cid in containers.items()
            ],
        },
    }
    if kind:
        obj = {"kind": "Pod", "apiVersion": "v1", **obj}
    return obj


TRAINER = pod_json(TRAINER_UID, "trainer-0", "ml", {"worker": TRAINER_CID}, version="1001")
EVAL = pod_json(EVAL_UID, "eval-1", "ml", {"eval": EVAL_CID}, version="1002", runtime="cri-o")
ETCD = pod_json(
    "5c1e1b0a-9a47-4c43-8d6c-6a3a8f2f11aa",
    "etcd-node-a",
    "kube-system",
    {"etcd": ETCD_CID},
    version="1003",
    annotations={"kubernetes.io/config.mirror": ETCD_HASH, "kubernetes.io/config.source": "file"},
)


def test_parse_pod_reads_identity_container_ids_and_the_mirror_hash() -> None:
    assert parse_pod(EVAL) == PodMeta(
        EVAL_UID,
        "ml",
        "eval-1",
        None,
        ((EVAL_CID, "eval"),),
        labels=(("app", "eval"),),
        ip="10.244.1.7",
    )
    host = parse_pod({**EVAL, "spec": {"hostNetwork": True}})
    assert host is not None and host.host_network
    assert parse_pod({**EVAL, "spec": {"hostNetwork": "yes"}}).host_network is False  # type: ignore[union-attr]
    etcd = parse_pod(ETCD)
    assert etcd is not None and etcd.mirror_uid == ETCD_HASH
    assert parse_pod({"metadata": {"name": "x"}}) is None
    assert parse_pod("not a pod") is None
    pending = pod_json(TRAINER_UID, "trainer-0", "ml", {})
    assert parse_pod(pending) == PodMeta(
        TRAINER_UID, "ml", "trainer-0", labels=(("app", "trainer"),), ip="10.244.1.7"
    )


def test_index_lookup_by_uid_and_static_pod_hash() -> None:
    pods = [parse_pod(p) for p in (TRAINER, EVAL, ETCD)]
    index = PodIndex(p for p in pods if p is not None)
    hit = index.lookup(PodContainer(TRAINER_UID, TRAINER_CID, "containerd"))
    assert hit is not None and (hit[0].name, hit[1]) == ("trainer-0", "worker")
    hit = index.lookup(PodContainer(ETCD_HASH, ETCD_CID, "containerd"))
    assert hit is not None and (hit[0].namespace, hit[0].name, hit[1]) == (
        "kube-system",
        "etcd-node-a",
        "etcd",
    )
    hit = index.lookup(PodContainer(EVAL_UID, "f" * 64, "crio"))  # a container not yet listed
    assert hit is not None and hit[1] == ""
    assert index.lookup(PodContainer("0" * 32, None, None)) is None
    assert len(index.without(EVAL_UID)) == 2 and len(index.with_pod(pods[1])) == 3  # type: ignore[arg-type]


# --- an API server stand-in ---------------------------------------------------------------


FORBIDDEN = status(
    403,
    "Forbidden",
    'pods is forbidden: User "system:serviceaccount:monitoring:fabricscope" cannot list '
    'resource "pods" in API group "" at the cluster scope',
)


@pytest.fixture
def fake_api(httpserver: HTTPServer, monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    clear_proxies(monkeypatch)
    api = FakeApi()
    httpserver.expect_request("/api/v1/pods", method="GET").respond_with_handler(api.handle)
    return api


@pytest.fixture
def api_client(httpserver: HTTPServer) -> Callable[[], ApiClient]:
    def make() -> ApiClient:
        return ApiClient(Configuration(host=httpserver.url_for("/").rstrip("/")))

    return make


def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


class Errors:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def __call__(self, reason: str) -> None:
        self.reasons.append(reason)


@pytest.fixture
def watcher_factory(
    fake_api: FakeApi, api_client: Callable[[], ApiClient]
) -> Iterator[Callable[[Errors], PodWatcher]]:
    made: list[PodWatcher] = []

    def make(errors: Errors) -> PodWatcher:
        w = PodWatcher(NODE, api_client, errors, FAST)
        made.append(w)
        w.start()
        return w

    yield make
    for w in made:
        w.close()


def names(w: PodWatcher) -> list[str]:
    index = w.index
    return [] if index is None else [p.name for p in index.pods()]


def test_list_then_watch_added_and_deleted(
    fake_api: FakeApi, watcher_factory: Callable[[Errors], PodWatcher]
) -> None:
    fake_api.lists.append(pod_list("1000", TRAINER))
    fake_api.watches = [
        [
            {
                "type": "ADDED",
                "object": pod_json(
                    EVAL_UID, "eval-1", "ml", {"eval": EVAL_CID}, version="1010", kind=True
                ),
            }
        ],
        [
            {
                "type": "BOOKMARK",
                "object": {
                    "kind": "Pod",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": "1020"},
                },
            },
            {
                "type": "DELETED",
                "object": pod_json(TRAINER_UID, "trainer-0", "ml", {}, version="1030", kind=True),
            },
        ],
    ]
    errors = Errors()
    w = watcher_factory(errors)
    assert w.wait_synced(5)
    until(lambda: names(w) == ["eval-1"])
    until(lambda: len(fake_api.watch_requests()) >= 3)
    lists, watches = fake_api.list_requests(), fake_api.watch_requests()
    assert lists[0] == {"fieldSelector": f"spec.nodeName={NODE}", "resourceVersion": "0"}
    assert watches[0] == {
        "fieldSelector": f"spec.nodeName={NODE}",
        "watch": "true",
        "resourceVersion": "1000",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "5",
    }
    # each watch resumes from the latest resourceVersion seen (a bookmark's counts too)
    assert [r["resourceVersion"] for r in watches[:3]] == ["1000", "1010", "1030"]
    assert len(lists) == 1 and errors.reasons == [] and w.healthy


def test_expired_watch_event_relists(
    fake_api: FakeApi, watcher_factory: Callable[[Errors], PodWatcher]
) -> None:
    fake_api.lists.append(pod_list("1000", TRAINER))
    fake_api.lists.append(pod_list("1500", EVAL))  # what the relist finds
    fake_api.watches = [[{"type": "ERROR", "object": EXPIRED}]]
    errors = Errors()
    w = watcher_factory(errors)
    until(lambda: names(w) == ["eval-1"])
    assert len(fake_api.list_requests()) == 2
    until(lambda: any(r["resourceVersion"] == "1500" for r in fake_api.watch_requests()))
    assert errors.reasons == []  # 410 is the protocol, not a failure


def test_410_status_on_the_watch_request_relists(
    fake_api: FakeApi, watcher_factory: Callable[[Errors], PodWatcher]
) -> None:
    fake_api.lists.append(pod_list("1000", TRAINER))
    fake_api.lists.append(pod_list("1600", TRAINER, EVAL))
    fake_api.watch_fail = (410, EXPIRED)
    errors = Errors()
    w = watcher_factory(errors)
    until(lambda: names(w) == ["eval-1", "trainer-0"])
    assert len(fake_api.list_requests()) == 2 and errors.reasons == []


def test_forbidden_is_counted_backs_off_and_recovers(
    fake_api: FakeApi, watcher_factory: Callable[[Errors], PodWatcher]
) -> None:
    fake_api.lists.append(pod_list("1000", TRAINER))
    fake_api.fail = (403, FORBIDDEN)
    errors = Errors()
    w = watcher_factory(errors)
    until(lambda: len(errors.reasons) >= 3)
    assert set(errors.reasons) == {"api_forbidden"}
    assert w.index is None and not w.healthy
    n = len(fake_api.requests)
    time.sleep(0.3)  # backing off: at most one request per 0.2 s once at the cap
    assert len(fake_api.requests) - n <= 3
    with fake_api.lock:
        fake_api.fail = None  # RBAC fixed
    until(lambda: names(w) == ["trainer-0"] and w.healthy)


def test_server_error_and_bad_json_are_api_errors(
    fake_api: FakeApi, watcher_factory: Callable[[Errors], PodWatcher]
) -> None:
    fake_api.lists.append(pod_list("1000", TRAINER))
    fake_api.fail = (500, status(500, "InternalError", "etcdserver: request timed out"))
    errors = Errors()
    w = watcher_factory(errors)
    until(lambda: len(errors.reasons) >= 1)
    assert set(errors.reasons) == {"api_error"}
    with fake_api.lock:
        fake_api.fail = None
    fake_api.watches = [["not json"]]  # type: ignore[list-item]
    until(lambda: errors.reasons.count("api_error") >= 2)
    assert names(w) == ["trainer-0"]  # the index survives a broken watch


def test_unreachable_api_server_is_an_api_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(var, raising=False)
    errors = Errors()

    def nowhere() -> ApiClient:
        cfg = Configuration(host="http://127.0.0.1:9")  # discard port: connection refused
        cfg.retries = 0
        return ApiClient(cfg)

    w = PodWatcher(NODE, nowhere, errors, FAST)
    w.start()
    try:
        until(lambda: len(errors.reasons) >= 2)
        assert set(errors.reasons) == {"api_error"}
    finally:
        w.close()


@pytest.mark.parametrize("threaded", [False, True], ids=["http1.0-stream", "http1.1-chunked"])
def test_events_apply_as_they_arrive_and_close_interrupts_a_watch(
    threaded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real API server streams a watch (chunked over HTTP/1.1): each event must be applied
    when it arrives, not when the stream ends, and close() must not wait for the stream."""
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(var, raising=False)
    release = threading.Event()
    added = pod_json(EVAL_UID, "eval-1", "ml", {"eval": EVAL_CID}, version="1010", kind=True)

    def handle(request: Request) -> Response:
        if request.args.get("watch") != "true":
            body = {
                "kind": "PodList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": "1000"},
                "items": [TRAINER],
            }
            return Response(json.dumps(body), mimetype="application/json")

        def events() -> Iterator[str]:
            yield json.dumps({"type": "ADDED", "object": added}) + "\n"
            release.wait(10)  # the stream stays open, as a real watch does

        return Response(events(), mimetype="application/json")

    server = HTTPServer(threaded=threaded)
    server.start()
    server.expect_request("/api/v1/pods").respond_with_handler(handle)
    host = server.url_for("/").rstrip("/")
    errors = Errors()
    w = PodWatcher(NODE, lambda: ApiClient(Configuration(host=host)), errors, FAST)
    try:
        w.start()
        until(lambda: names(w) == ["eval-1", "trainer-0"])  # while the stream is still open
        t0 = time.monotonic()
        w.close(timeout=2.0)
        assert time.monotonic() - t0 < 1.0 and not w.running
        assert errors.reasons == []
    finally:
        release.set()
        server.clear()
        server.stop()


def test_close_under_a_read_logs_no_failure(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """close() shuts the stream under the watch's read; http.client then fails in ways of its
    own (seen in bench/podwatch_growth.py: AttributeError, its file already None). That is
    the close itself, not a fault: no traceback in the log, no error counted."""
    reading = threading.Event()

    def watch(self: PodWatcher, api: object, version: str, remaining: float) -> str:
        reading.set()
        self._stop.wait(10)
        raise AttributeError("'NoneType' object has no attribute 'close'")

    monkeypatch.setattr(PodWatcher, "_list", lambda self, api: "1000")
    monkeypatch.setattr(PodWatcher, "_watch", watch)
    errors = Errors()
    w = PodWatcher(NODE, lambda: ApiClient(Configuration(host="http://127.0.0.1:9")), errors, FAST)
    w.start()
    assert reading.wait(10)
    with caplog.at_level(logging.DEBUG):
        w.close(timeout=5.0)
    assert not w.running
    assert errors.reasons == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


class ChunkedStream:
    """A response that arrives in the given pieces (chunked) or reads (plain)."""

    def __init__(self, pieces: list[bytes], chunked: bool) -> None:
        self.pieces, self.chunked, self.data = list(pieces), chunked, b""

    def stream(self, amt: int | None = None, decode_content: bool | None = None) -> Iterator[bytes]:
        yield from self.pieces

    def read1(self, amt: int | None = None, decode_content: bool | None = None) -> bytes:
        return self.pieces.pop(0) if self.pieces else b""

    def release_conn(self) -> None: ...

    def close(self) -> None: ...


@pytest.mark.parametrize("chunked", [True, False])
def test_lines_reassemble_events_split_across_reads(chunked: bool) -> None:
    pieces = [b'{"type":"ADD', b'ED"}\n{"type":"BOOK', b'MARK"}\n\n', b'{"type":"DELETED"}']
    got = list(iter_lines(ChunkedStream(pieces, chunked)))
    assert got == [b'{"type":"ADDED"}', b'{"type":"BOOKMARK"}', b'{"type":"DELETED"}']


# --- a kubelet stand-in -------------------------------------------------------------------


class Lister(pb_grpc.PodResourcesListerServicer):
    def __init__(self) -> None:
        self.pods: list[pb.PodResources] = []
        self.delay = 0.0
        self.fail = False
        self.calls = 0

    def List(  # noqa: N802 - the gRPC method's name
        self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pb.ListPodResourcesResponse:
        self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        if self.fail:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the kubelet is restarting")
        return pb.ListPodResourcesResponse(pod_resources=self.pods)


def kubelet_pod(
    namespace: str, name: str, container: str, *devs: tuple[str, str], cpus: tuple[int, ...] = ()
) -> pb.PodResources:
    return pb.PodResources(
        name=name,
        namespace=namespace,
        containers=[
            pb.ContainerResources(
                name=container,
                devices=[pb.ContainerDevices(resource_name=r, device_ids=[i]) for r, i in devs],
                cpu_ids=list(cpus),
            )
        ],
    )


KUBELET_TRAINER = kubelet_pod(
    "ml",
    "trainer-0",
    "worker",
    ("nvidia.com/gpu", GPU0),
    ("intel.com/mlnx_sriov_rdma", "0000:1a:00.2"),
    cpus=(2, 3),
)


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[tuple[Lister, Path]]:
    path = tmp_path / "kubelet.sock"
    lister = Lister()
    lister.pods = [KUBELET_TRAINER]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_PodResourcesListerServicer_to_server(lister, server)
    server.add_insecure_port("unix://" + str(path))
    server.start()
    yield lister, path
    server.stop(grace=None)


@pytest.fixture
def samplers() -> Iterator[list[AttributionSampler]]:
    made: list[AttributionSampler] = []
    yield made
    for s in made:
        s.close()


def sampler(
    made: list[AttributionSampler],
    *,
    socket: Path | None,
    api: Callable[[], ApiClient] | None = None,
    procfs: Path = PROCFS,
    nvml: NvmlSnapshot | None = NVML,
    timeout: float = 2.0,
    first_wait: float = 5.0,
    kubelet_max_age: float = KUBELET_LIST_MAX_AGE_SECONDS,
) -> AttributionSampler:
    s = AttributionSampler(
        gpus=lambda: nvml,
        rdma=lambda: IB,
        procfs=SysfsReader(procfs),
        socket_path=str(socket) if socket is not None else None,
        kubelet_timeout_seconds=timeout,
        node_name=NODE if api is not None else None,
        api_client=api,
        watch=FAST,
        first_sync_wait_seconds=first_wait if api is not None else 0.0,
        kubelet_max_age_seconds=kubelet_max_age,
    )
    made.append(s)
    return s


W = ("ml", "trainer-0", "worker")
TRAINER_GPU = GpuAttribution(*W, GPU0, 0, "0000:19:00.0", "podresources")
TRAINER_VF = RdmaAttribution(
    *W, "intel.com/mlnx_sriov_rdma", "0000:1a:00.2", "mlx5_2", "0000:1a:00.2"
)


def errors_of(snap: AttributionSnapshot) -> dict[str, int]:
    return {k: v for k, v in snap.errors_total if v}


def test_podresources_only(
    kubelet: tuple[Lister, Path], samplers: list[AttributionSampler]
) -> None:
    _, path = kubelet
    snap = sampler(samplers, socket=path).sample()
    assert snap == AttributionSnapshot(
        gpus=(TRAINER_GPU,),
        rdma=(TRAINER_VF,),
        cpus=(ContainerCpus(*W, (2, 3)),),
        methods_up=(("cgroup", False), ("podresources", True)),
        errors_total=(
            ("api_error", 0),
            ("api_forbidden", 0),
            ("cgroup_parse", 0),
            ("kubelet_unavailable", 0),
        ),
    )
    assert snap.pods == 1


def test_no_socket_and_no_node_name_is_no_data(
    tmp_path: Path, samplers: list[AttributionSampler]
) -> None:
    with pytest.raises(NoData):
        sampler(samplers, socket=tmp_path / "absent.sock").sample()
    with pytest.raises(NoData):
        sampler(samplers, socket=None).sample()
    runner = Runner([SamplerSpec(sampler(samplers, socket=None), 15.0, 5.0)])
    status = runner.run_once()["attribution"]
    assert (status.success, status.hardware_present, status.snapshot) == (True, False, None)


def test_socket_absent_falls_back_to_cgroups(
    tmp_path: Path,
    fake_api: FakeApi,
    api_client: Callable[[], ApiClient],
    samplers: list[AttributionSampler],
) -> None:
    fake_api.lists.append(pod_list("1000", TRAINER, EVAL, ETCD))
    snap = sampler(samplers, socket=tmp_path / "absent.sock", api=api_client).sample()
    assert snap.gpus == (
        GpuAttribution("kube-system", "etcd-node-a", "etcd", GPU1, 1, "0000:3b:00.0", "cgroup"),
        GpuAttribution("ml", "eval-1", "eval", GPU1, 1, "0000:3b:00.0", "cgroup"),
        GpuAttribution(*W, GPU0, 0, "0000:19:00.0", "cgroup"),
    )
    assert snap.rdma == () and snap.cpus == ()  # allocations only come from the kubelet
    assert snap.methods_up == (("cgroup", True), ("podresources", False))
    assert errors_of(snap) == {} and snap.issues == () and snap.pods == 3


def test_both_methods_dedupe_and_cgroup_adds_unallocated_use(
    kubelet: tuple[Lister, Path],
    fake_api: FakeApi,
    api_client: Callable[[], ApiClient],
    samplers: list[AttributionSampler],
) -> None:
    _, path = kubelet
    fake_api.lists.append(pod_list("1000", TRAINER, EVAL))
    snap = sampler(samplers, socket=path, api=api_client).sample()
    assert snap.gpus == (
        GpuAttribution("ml", "eval-1", "eval", GPU1, 1, "0000:3b:00.0", "cgroup"),
        TRAINER_GPU,  # the kubelet's record wins over the cgroup one for the same pod and GPU
    )
    assert snap.methods_up == (("cgroup", True), ("podresources", True))


def test_deadline_exceeded_is_counted_and_the_pass_stays_short(
    kubelet: tuple[Lister, Path],
    fake_api: FakeApi,
    api_client: Callable[[], ApiClient],
    samplers: list[AttributionSampler],
) -> None:
    lister, path = kubelet
    lister.delay = 2.0
    fake_api.lists.append(pod_list("1000", TRAINER))
    s = sampler(samplers, socket=path, api=api_client, timeout=0.3)
    s.sample()  # the first pass also waits for the pod index
    t0 = time.monotonic()
    snap = s.sample()
    assert time.monotonic() - t0 < 1.0
    assert errors_of(snap) == {"kubelet_unavailable": 2}
    assert snap.gpus == (
        GpuAttribution(*W, GPU0, 0, "0000:19:00.0", "cgroup"),
    )  # degraded, not lost
    assert snap.methods_up == (("cgroup", True), ("podresources", False))


def test_the_probe_is_told_when_the_gpus_pods_hold_cannot_be_established(
    tmp_path: Path,
    kubelet: tuple[Lister, Path],
    fake_api: FakeApi,
    api_client: Callable[[], ApiClient],
    samplers: list[AttributionSampler],
) -> None:
    """Fail closed: every way of not knowing is an unknown allocation, never an empty one."""
    lister, path = kubelet
    known = sampler(samplers, socket=path).sample()
    assert gpu_allocation(known) == GpuAllocation(frozenset({0}))
    # NVML's pass failed: the kubelet's GPU ids cannot be joined to GPUs
    blind = sampler(samplers, socket=path, nvml=None).sample()
    assert gpu_allocation(blind) == GpuAllocation(frozenset(), "nvml_unavailable")
    # ...which matters only when the kubelet names GPUs
    lister.pods = [kubelet_pod("ml", "net-0", "w", ("intel.com/mlnx_sriov_rdma", "0000:1a:00.2"))]
    assert gpu_allocation(sampler(samplers, socket=path, nvml=None).sample()) == GpuAllocation()
    # a MIG device's own UUID (R470 on) does not name its GPU
    tiny = kubelet_pod("ml", "tiny-0", "job", ("nvidia.com/mig-1g.10gb", MIG_NEW))
    lister.pods = [KUBELET_TRAINER, tiny]
    mig = sampler(samplers, socket=path).sample()
    assert gpu_allocation(mig) == GpuAllocation(frozenset({0}), "unmapped_device")
    # the kubelet's call fails
    lister.fail = True
    failing = sampler(samplers, socket=path).sample()
    assert errors_of(failing) == {"kubelet_unavailable": 1}
    assert gpu_allocation(failing) == GpuAllocation(frozenset(), "kubelet_unavailable")
    # no socket on a Kubernetes node: pods using GPUs are seen, idle holders are not
    fake_api.lists.append(pod_list("1000", TRAINER))
    absent = sampler(samplers, socket=tmp_path / "absent.sock", api=api_client).sample()
    assert gpu_allocation(absent) == GpuAllocation(frozenset({0}), "kubelet_unavailable")
    # no snapshot: unknown, unless attribution found no kubelet and no node (bare metal)
    assert gpu_allocation(None) == GpuAllocation(frozenset(), "no_attribution")
    assert gpu_allocation(None, bare_metal=True) == GpuAllocation()


def test_forbidden_api_keeps_podresources_attribution(
    kubelet: tuple[Lister, Path],
    fake_api: FakeApi,
    api_client: Callable[[], ApiClient],
    samplers: list[AttributionSampler],
) -> None:
    _, path = kubelet
    fake_api.lists.append(pod_list("1000", TRAINER, EVAL))
    fake_api.fail = (403, FORBIDDEN)
    s = sampler(samplers, socket=path, api=api_client, first_wait=0.0)
    s.sample()  # starts the watch
    until(lambda: dict(s.errors.totals())["api_forbidden"] >= 1)
    snap = s.sample()
    assert snap.gpus == (TRAINER_GPU,) and snap.rdma == (TRAINER_VF,)
    assert errors_of(snap)["api_forbidden"] >= 1
    assert snap.methods_up == (("cgroup", False), ("podresources", True))


def eval_pod_added(fake_api: FakeApi, s: AttributionSampler) -> None:
    """The API watch reports eval-1 (ADDED); returns once the sampler's pod index has it."""
    fake_api.watches = [
        [
            {
                "type": "ADDED",
                "object": pod_json(
                    EVAL_UID, "eval-1", "ml", {"eval": EVAL_CID}, version="1100", kind=True
                ),
            }
        ]
    ]
    until(
        lambda: s.watcher is not None and s.watcher.index is not None and len(s.watcher.index) == 2
    )


def test_attribution_follows_pods_starting_and_stopping(
    kubelet: tuple[Lister, Path],
    fake_api: FakeApi,
    api_client: Callable[[], ApiClient],
    samplers: list[AttributionSampler],
) -> None:
    lister, path = kubelet
    fake_api.lists.append(pod_list("1000", TRAINER))
    s = sampler(samplers, socket=path, api=api_client)
    first = s.sample()
    assert [(g.pod, g.method) for g in first.gpus] == [("trainer-0", "podresources")]
    # eval-1 starts: the API watch reports it, its process shows up on GPU 1
    eval_pod_added(fake_api, s)
    assert [(g.pod, g.method) for g in s.sample().gpus] == [
        ("eval-1", "cgroup"),
        ("trainer-0", "podresources"),
    ]
    # trainer-0 ends: the kubelet no longer lists it, the API deletes it
    lister.pods = []
    fake_api.watches = [
        [
            {
                "type": "DELETED",
                "object": pod_json(TRAINER_UID, "trainer-0", "ml", {}, version="1200", kind=True),
            }
        ]
    ]
    until(
        lambda: s.watcher is not None and s.watcher.index is not None and len(s.watcher.index) == 1
    )
    last = s.sample()
    assert [(g.pod, g.method) for g in last.gpus] == [("eval-1", "cgroup")]
    assert last.rdma == () and last.pods == 1


def test_the_kubelet_is_asked_again_only_when_the_nodes_pods_change(
    kubelet: tuple[Lister, Path],
    fake_api: FakeApi,
    api_client: Callable[[], ApiClient],
    samplers: list[AttributionSampler],
) -> None:
    """With a healthy pod watch, the kubelet's answer stands until a pod of the node changes
    (the kubelet assigns devices as it starts containers; the pod's status changes after)."""
    lister, path = kubelet
    fake_api.lists.append(pod_list("1000", TRAINER))
    s = sampler(samplers, socket=path, api=api_client)
    assert [g.pod for g in s.sample().gpus] == ["trainer-0"] and lister.calls == 1
    until(lambda: s.watcher is not None and s.watcher.healthy)
    for _ in range(3):
        snap = s.sample()
        assert snap.gpus == (TRAINER_GPU,) and snap.rdma == (TRAINER_VF,)
        assert snap.methods_up == (("cgroup", True), ("podresources", True))
    assert lister.calls == 1
    # eval-1 is scheduled and started: the kubelet gives it GPU 1, the watch reports it
    lister.pods = [KUBELET_TRAINER, kubelet_pod("ml", "eval-1", "eval", ("nvidia.com/gpu", GPU1))]
    eval_pod_added(fake_api, s)
    assert [(g.pod, g.method) for g in s.sample().gpus] == [
        ("eval-1", "podresources"),
        ("trainer-0", "podresources"),
    ]
    assert lister.calls == 2
    s.sample()
    assert lister.calls == 2


def test_the_kubelet_is_asked_every_pass_without_a_watch_or_after_a_failure(
    kubelet: tuple[Lister, Path],
    fake_api: FakeApi,
    api_client: Callable[[], ApiClient],
    samplers: list[AttributionSampler],
) -> None:
    lister, path = kubelet
    bare = sampler(samplers, socket=path)  # no node name: no pod watch
    for _ in range(3):
        assert bare.sample().gpus == (TRAINER_GPU,)
    assert lister.calls == 3
    fake_api.lists.append(pod_list("1000", TRAINER))
    lister.calls = 0
    lister.fail = True
    s = sampler(samplers, socket=path, api=api_client)
    for _ in range(2):  # a failed List stands for nothing: asked again on the next pass
        assert s.sample().methods_up == (("cgroup", True), ("podresources", False))
    assert lister.calls == 2
    lister.fail = False
    assert s.sample().gpus == (TRAINER_GPU,) and lister.calls == 3
    s.sample()
    assert lister.calls == 3
    # an answer older than the longest it may stand is asked for again
    aged = sampler(samplers, socket=path, api=api_client, kubelet_max_age=0.0)
    aged.sample()
    until(lambda: aged.watcher is not None and aged.watcher.healthy)
    lister.calls = 0
    aged.sample()
    aged.sample()
    assert lister.calls == 2


def test_unparsable_cgroup_is_counted_and_named(
    tmp_path: Path,
    fake_api: FakeApi,
    api_client: Callable[[], ApiClient],
    samplers: list[AttributionSampler],
) -> None:
    procfs = tmp_path / "proc"
    shutil.copytree(PROCFS, procfs)
    (procfs / "1002" / "cgroup").write_text("this is not a cgroup file\n")
    fake_api.lists.append(pod_list("1000", TRAINER, EVAL))
    snap = sampler(samplers, socket=None, api=api_client, procfs=procfs).sample()
    assert [g.pod for g in snap.gpus] == ["trainer-0"]
    assert errors_of(snap) == {"cgroup_parse": 1}
    assert snap.issues == (
        ReadIssue("1002/cgroup", "parse", "not a cgroup line: 'this is not a cgroup file'"),
    )


def test_before_the_first_list_gpus_stay_unattributed(
    tmp_path: Path,
    fake_api: FakeApi,
    api_client: Callable[[], ApiClient],
    samplers: list[AttributionSampler],
) -> None:
    fake_api.lists.append(pod_list("1000", TRAINER))
    fake_api.fail = (500, status(500, "InternalError", "etcdserver: leader changed"))
    s = AttributionSampler(
        gpus=lambda: NVML,
        rdma=lambda: IB,
        procfs=SysfsReader(PROCFS),
        socket_path=None,
        node_name=NODE,
        api_client=api_client,
        watch=FAST,
    )
    samplers.append(s)
    snap = s.sample()  # never waits on the API server
    assert snap.gpus == () and snap.methods_up == (("cgroup", False), ("podresources", False))


# --- rendering ----------------------------------------------------------------------------


SNAP = AttributionSnapshot(
    gpus=(
        GpuAttribution("ml", "eval-1", "eval", GPU1, 1, "0000:3b:00.0", "cgroup"),
        TRAINER_GPU,
        GpuAttribution("ml", "tiny-0", "job", MIG_NEW, None, None, "podresources"),
    ),
    rdma=(TRAINER_VF, RdmaAttribution(*W, "rdma/hca_shared_devices_a", "7f3c9b1a", None, None)),
    methods_up=(("cgroup", True), ("podresources", False)),
    errors_total=(
        ("api_error", 0),
        ("api_forbidden", 2),
        ("cgroup_parse", 0),
        ("kubelet_unavailable", 5),
    ),
)

_GPU = "fabricscope_pod_gpu_info"
_RDMA = "fabricscope_pod_rdma_info"
EXPECTED_LINES = [
    f"# HELP fabricscope_attribution_errors_total {render_attribution.ERRORS.help}",
    "# TYPE fabricscope_attribution_errors_total counter",
    'fabricscope_attribution_errors_total{reason="api_error"} 0.0',
    'fabricscope_attribution_errors_total{reason="api_forbidden"} 2.0',
    'fabricscope_attribution_errors_total{reason="cgroup_parse"} 0.0',
    'fabricscope_attribution_errors_total{reason="kubelet_unavailable"} 5.0',
    f"# HELP fabricscope_attribution_method_up {render_attribution.METHOD_UP.help}",
    "# TYPE fabricscope_attribution_method_up gauge",
    'fabricscope_attribution_method_up{method="cgroup"} 1.0',
    'fabricscope_attribution_method_up{method="podresources"} 0.0',
    f"# HELP fabricscope_attribution_pods {render_attribution.PODS.help}",
    "# TYPE fabricscope_attribution_pods gauge",
    "fabricscope_attribution_pods 3.0",
    f"# HELP {_GPU} {render_attribution.POD_GPU_INFO.help}",
    f"# TYPE {_GPU} gauge",
    f'{_GPU}{{claim="",container="eval",gpu="1",method="cgroup",mig="",namespace="ml",'
    f'pci_bus_id="0000:3b:00.0",pod="eval-1",uuid="{GPU1}"}} 1.0',
    f'{_GPU}{{claim="",container="job",gpu="",method="podresources",mig="",namespace="ml",'
    f'pci_bus_id="",pod="tiny-0",uuid="{MIG_NEW}"}} 1.0',
    f'{_GPU}{{claim="",container="worker",gpu="0",method="podresources",mig="",namespace="ml",'
    f'pci_bus_id="0000:19:00.0",pod="trainer-0",uuid="{GPU0}"}} 1.0',
    f"# HELP {_RDMA} {render_attribution.POD_RDMA_INFO.help}",
    f"# TYPE {_RDMA} gauge",
    f'{_RDMA}{{claim="",container="worker",device="mlx5_2",device_id="0000:1a:00.2",namespace="ml",'
    'pci_bus_id="0000:1a:00.2",pf_device="",pf_pci_bus_id="",pod="trainer-0",'
    'resource="intel.com/mlnx_sriov_rdma"} 1.0',
    f'{_RDMA}{{claim="",container="worker",device="",device_id="7f3c9b1a",namespace="ml",'
    'pci_bus_id="",pf_device="",pf_pci_bus_id="",pod="trainer-0",'
    'resource="rdma/hca_shared_devices_a"} 1.0',
]


def test_render_exact_text() -> None:
    out = Families()
    render_attribution.render(SNAP, out)
    assert render_text(out).decode().splitlines() == EXPECTED_LINES


def test_an_empty_pass_still_reports_health_and_errors() -> None:
    out = Families()
    render_attribution.render(AttributionSnapshot(), out)
    got = {(spec.name, labels): v for spec, samples in out.items() for labels, v in samples}
    assert got == {
        ("fabricscope_attribution_pods", ()): 0.0,
        ("fabricscope_attribution_method_up", ("cgroup",)): 0.0,
        ("fabricscope_attribution_method_up", ("podresources",)): 0.0,
        ("fabricscope_attribution_errors_total", ("api_error",)): 0.0,
        ("fabricscope_attribution_errors_total", ("api_forbidden",)): 0.0,
        ("fabricscope_attribution_errors_total", ("cgroup_parse",)): 0.0,
        ("fabricscope_attribution_errors_total", ("kubelet_unavailable",)): 0.0,
    }


def test_exposition_passes_promtool() -> None:
    out = Families()
    render_attribution.render(SNAP, out)
    promtool_check_metrics(render_text(out))


def test_specs_use_the_label_vocabulary() -> None:
    for spec in render_attribution.SPECS:
        assert len(spec.labels) <= 12
    assert "source" not in {label for spec in render_attribution.SPECS for label in spec.labels}


def test_rdma_rows_keep_their_device_while_infiniband_has_no_answer(
    kubelet: tuple[Lister, Path], samplers: list[AttributionSampler]
) -> None:
    """At agent start attribution and InfiniBand run their first passes together, and a busy
    node can time an InfiniBand pass out. A row attributed while InfiniBand has no answer
    would lack its device and PCI address and regain them a pass later: two identities for
    one series (a rollout renamed it; tests/deploy/test_rollout.py). The rows wait for
    InfiniBand's first answer and keep its last one through a failed pass; once it answers
    that there is no InfiniBand, an unresolved row is what the node really has."""
    _, path = kubelet
    ib: list[InfinibandSnapshot | None] = [None]
    unanswered = [True]
    s = AttributionSampler(
        gpus=lambda: NVML,
        rdma=lambda: ib[0],
        procfs=SysfsReader(PROCFS),
        socket_path=str(path),
        rdma_unanswered=lambda: unanswered[0],
    )
    samplers.append(s)
    first = s.sample()
    assert first.rdma == () and first.gpus == (TRAINER_GPU,)
    ib[0], unanswered[0] = IB, False
    assert s.sample().rdma == (TRAINER_VF,)
    ib[0], unanswered[0] = None, True  # a failed pass: no snapshot now
    assert s.sample().rdma == (TRAINER_VF,)
    ib[0], unanswered[0] = None, False  # answered: no InfiniBand here
    (unresolved,) = s.sample().rdma
    assert unresolved.device is None and unresolved.device_id == TRAINER_VF.device_id


def test_gpu_rows_are_exported_from_nvmls_first_answer(
    kubelet: tuple[Lister, Path], samplers: list[AttributionSampler]
) -> None:
    """Before NVML first answers (its child starts with the agent) a GPU row lacks its index
    and PCI address; exported, it would be a second identity of the series a pass later. The
    row stays in the snapshot (the probe's allocation fails closed on it) but is not
    exported until NVML has answered."""
    _, path = kubelet
    nvml: list[NvmlSnapshot | None] = [None]
    unanswered = [True]
    s = AttributionSampler(
        gpus=lambda: nvml[0],
        rdma=lambda: IB,
        procfs=SysfsReader(PROCFS),
        socket_path=str(path),
        gpus_unanswered=lambda: unanswered[0],
    )
    samplers.append(s)

    def exported(snap: AttributionSnapshot) -> str:
        out = Families()
        render_attribution.render(snap, out)
        return render_text(out).decode()

    first = s.sample()
    assert first.gpus_pending and first.gpus and first.allocation_unknown is not None
    assert "fabricscope_pod_gpu_info{" not in exported(first)
    nvml[0], unanswered[0] = NVML, False
    answered = s.sample()
    assert not answered.gpus_pending and 'gpu="0"' in exported(answered)
    nvml[0], unanswered[0] = None, True  # a failed pass after an answer: exported as it is
    assert not s.sample().gpus_pending
