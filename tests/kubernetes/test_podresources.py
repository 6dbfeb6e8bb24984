"""agent/kubernetes/podresources.py against a real gRPC server on a unix socket, speaking
the kubelet's ``v1.PodResourcesLister`` through the servicer generated from
agent/kubernetes/podresources.proto; and the generated modules regenerated from that proto
and diffed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from agent.kubernetes import podresources_pb2 as pb
from agent.kubernetes import podresources_pb2_grpc as pb_grpc
from agent.kubernetes.podresources import (
    ContainerAllocation,
    DeviceAllocation,
    KubeletUnavailable,
    PodAllocation,
    PodResourcesClient,
    SocketAbsent,
    from_response,
)

ROOT = Path(__file__).resolve().parents[2]
PROTO = "agent/kubernetes/podresources.proto"
GENERATED = (
    "agent/kubernetes/podresources_pb2.py",
    "agent/kubernetes/podresources_pb2.pyi",
    "agent/kubernetes/podresources_pb2_grpc.py",
)
#: keeps ruff (lint and format) and mypy out of generated code without any per-file config
HEADER = "# ruff: noqa\n# fmt: off\n# mypy: ignore-errors\n"

GPU0 = "GPU-5b2c6e4e-05c6-1d1e-6b09-0b9f1f8e3c51"
GPU1 = "GPU-9a1f4c42-8f5e-63a1-2b3c-1c7e6a6b2f10"
VF = "0000:1a:00.2"


def generate(out: Path) -> dict[str, str]:
    """Run protoc (grpcio-tools) on the proto into ``out`` and add the header."""
    (out / PROTO).parent.mkdir(parents=True, exist_ok=True)
    (out / PROTO).write_bytes((ROOT / PROTO).read_bytes())
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I.",
            "--python_out=.",
            "--pyi_out=.",
            "--grpc_python_out=.",
            PROTO,
        ],
        cwd=out,
        check=True,
    )
    return {rel: HEADER + (out / rel).read_text() for rel in GENERATED}


def test_generated_modules_regenerate_identically(tmp_path: Path) -> None:
    fresh = generate(tmp_path)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        for rel, text in fresh.items():
            (ROOT / rel).write_text(text)
    committed = {rel: (ROOT / rel).read_text() for rel in GENERATED}
    assert committed == fresh, "run: UPDATE_GOLDEN=1 pytest tests/kubernetes/test_podresources.py"


def test_proto_keeps_the_upstream_wire_names_and_numbers() -> None:
    """The kubelet's field numbers and names (k8s.io/kubelet podresources v1 api.proto)."""
    fields = {
        m.name: {f.name: f.number for f in m.fields}
        for m in pb.DESCRIPTOR.message_types_by_name.values()
    }
    assert pb.DESCRIPTOR.package == "v1"
    assert fields["ListPodResourcesResponse"] == {"pod_resources": 1}
    assert fields["PodResources"] == {"name": 1, "namespace": 2, "containers": 3}
    assert fields["ContainerResources"] == {
        "name": 1,
        "devices": 2,
        "cpu_ids": 3,
        "dynamic_resources": 5,
    }
    # class_name = 1 is a tombstone upstream since 1.31
    assert fields["DynamicResource"] == {
        "claim_name": 2,
        "claim_namespace": 3,
        "claim_resources": 4,
    }
    assert fields["ClaimResource"] == {
        "cdi_devices": 1,
        "driver_name": 2,
        "pool_name": 3,
        "device_name": 4,
        "share_id": 5,
    }
    assert fields["CDIDevice"] == {"name": 1}
    assert fields["ContainerDevices"] == {"resource_name": 1, "device_ids": 2, "topology": 3}
    assert fields["TopologyInfo"] == {"nodes": 1}
    assert fields["NUMANode"] == {"ID": 1}
    service = pb.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert [m.name for m in service.methods] == ["List", "GetAllocatableResources", "Get"]


# --- a kubelet stand-in: the generated servicer on a unix socket ---------------------------


def pod(namespace: str, name: str, *containers: pb.ContainerResources) -> pb.PodResources:
    return pb.PodResources(name=name, namespace=namespace, containers=list(containers))


def devices(resource: str, *ids: str, numa: tuple[int, ...] = ()) -> pb.ContainerDevices:
    topo = pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in numa])
    return pb.ContainerDevices(resource_name=resource, device_ids=list(ids), topology=topo)


TRAINER = pod(
    "ml",
    "trainer-0",
    pb.ContainerResources(
        name="worker",
        devices=[
            devices("nvidia.com/gpu", GPU1, GPU0, numa=(0,)),
            devices("intel.com/mlnx_vf", VF),
        ],
        cpu_ids=[3, 1, 2],
    ),
    pb.ContainerResources(name="sidecar"),
)
WEB = pod("default", "web-7d9f", pb.ContainerResources(name="nginx"))


class Lister(pb_grpc.PodResourcesListerServicer):
    """Answers ``List`` with ``self.pods``; sleeps ``self.delay`` seconds first."""

    def __init__(self) -> None:
        self.pods: list[pb.PodResources] = [TRAINER, WEB]
        self.delay = 0.0
        self.calls = 0

    def List(  # noqa: N802 - the gRPC method name
        self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pb.ListPodResourcesResponse:
        self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        return pb.ListPodResourcesResponse(pod_resources=self.pods)


@pytest.fixture
def kubelet_socket(tmp_path: Path) -> Path:
    return tmp_path / "pod-resources" / "kubelet.sock"


def serve(path: Path, lister: Lister) -> grpc.Server:
    path.parent.mkdir(parents=True, exist_ok=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_PodResourcesListerServicer_to_server(lister, server)
    assert server.add_insecure_port("unix://" + str(path)) == 1
    server.start()
    return server


@pytest.fixture
def kubelet(kubelet_socket: Path) -> Iterator[Lister]:
    lister = Lister()
    server = serve(kubelet_socket, lister)
    yield lister
    server.stop(grace=None)


EXPECTED = (
    PodAllocation("default", "web-7d9f", (ContainerAllocation("nginx"),)),
    PodAllocation(
        "ml",
        "trainer-0",
        (
            ContainerAllocation(
                "worker",
                (
                    DeviceAllocation("nvidia.com/gpu", (GPU1, GPU0), (0,)),
                    DeviceAllocation("intel.com/mlnx_vf", (VF,), ()),
                ),
                (1, 2, 3),
            ),
            ContainerAllocation("sidecar"),
        ),
    ),
)


def test_list_over_a_real_unix_socket(kubelet: Lister, kubelet_socket: Path) -> None:
    client = PodResourcesClient(str(kubelet_socket), timeout_seconds=2.0)
    assert client.list() == EXPECTED
    assert client.list() == EXPECTED  # a channel of its own each call
    assert kubelet.calls == 2


class _Recorded:
    """A real channel that says whether it was closed."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel
        self.closed = False

    def unary_unary(self, *args: object, **kwargs: object) -> object:
        return self.channel.unary_unary(*args, **kwargs)  # type: ignore[arg-type]

    def close(self) -> None:
        self.closed = True
        self.channel.close()


def test_every_call_closes_its_channel(
    kubelet: Lister, kubelet_socket: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing is held between calls (a channel kept open costs gRPC's threads CPU while
    idle), after an answer and after a failure alike."""
    opened: list[_Recorded] = []
    real = grpc.insecure_channel

    def recording(target: str, options: object = None) -> _Recorded:
        opened.append(_Recorded(real(target, options=options)))  # type: ignore[arg-type]
        return opened[-1]

    monkeypatch.setattr(grpc, "insecure_channel", recording)
    client = PodResourcesClient(str(kubelet_socket), timeout_seconds=0.3)
    assert client.list() == EXPECTED
    assert client.list() == EXPECTED
    kubelet.delay = 1.0
    with pytest.raises(KubeletUnavailable):
        client.list()
    assert [c.closed for c in opened] == [True, True, True]


def test_from_response_is_pure() -> None:
    assert from_response(pb.ListPodResourcesResponse(pod_resources=[TRAINER, WEB])) == EXPECTED
    assert from_response(pb.ListPodResourcesResponse()) == ()


def test_deadline_exceeded_fails_within_the_deadline(kubelet: Lister, kubelet_socket: Path) -> None:
    kubelet.delay = 3.0
    client = PodResourcesClient(str(kubelet_socket), timeout_seconds=0.3)
    t0 = time.monotonic()
    with pytest.raises(KubeletUnavailable) as info:
        client.list()
    elapsed = time.monotonic() - t0
    assert info.value.code == "DEADLINE_EXCEEDED"
    assert elapsed < 1.5


def test_socket_absent(tmp_path: Path) -> None:
    client = PodResourcesClient(str(tmp_path / "nothing.sock"))
    with pytest.raises(SocketAbsent):
        client.list()


def test_nobody_listening_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))  # the socket file exists, but nothing accepts connections
    try:
        client = PodResourcesClient(str(path), timeout_seconds=1.0)
        with pytest.raises(KubeletUnavailable) as info:
            client.list()
        assert info.value.code == "UNAVAILABLE"
    finally:
        sock.close()


def test_a_restarted_kubelet_is_picked_up_on_the_next_call(kubelet_socket: Path) -> None:
    lister = Lister()
    server = serve(kubelet_socket, lister)
    client = PodResourcesClient(str(kubelet_socket), timeout_seconds=1.0)
    try:
        assert client.list() == EXPECTED
        server.stop(grace=None).wait()
        if kubelet_socket.exists():
            kubelet_socket.unlink()
        with pytest.raises((KubeletUnavailable, SocketAbsent)):
            client.list()
        lister.pods = [WEB]
        server = serve(kubelet_socket, lister)
        assert client.list() == EXPECTED[:1]
    finally:
        server.stop(grace=None)


def test_concurrent_calls_share_one_client(kubelet: Lister, kubelet_socket: Path) -> None:
    client = PodResourcesClient(str(kubelet_socket))
    results: list[tuple[PodAllocation, ...]] = []

    def run() -> None:
        results.append(client.list())

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [EXPECTED] * 4


def test_the_grpcio_floor_is_the_generated_stubs_own() -> None:
    """The generated stubs raise at import under an older grpcio (a lent GPU machine's
    1.84 did): pyproject's floor is the version they were generated with."""
    import tomllib

    from agent.kubernetes import podresources_pb2_grpc

    root = Path(__file__).resolve().parents[2]
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    grpcio = [d for d in deps if d.startswith("grpcio")]
    assert grpcio == [f"grpcio>={podresources_pb2_grpc.GRPC_GENERATED_VERSION},<2"], grpcio
