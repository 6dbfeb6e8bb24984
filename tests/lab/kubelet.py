"""The kubelet's pod-resources API for a lab node: a real gRPC server on a unix socket
(``v1.PodResourcesLister``, the servicer generated from ``agent/podresources.proto``), so the
agent's attribution sampler reads the job's pods exactly as on a Kubernetes node."""

from __future__ import annotations

from concurrent import futures
from pathlib import Path

import grpc

from agent import podresources_pb2 as pb
from agent import podresources_pb2_grpc as pb_grpc
from tests.lab.scenarios import NAMESPACE, RAILS

GPU_RESOURCE = "nvidia.com/gpu"
RDMA_RESOURCE = "rdma/rdma_shared_device_a"


class Lister(pb_grpc.PodResourcesListerServicer):
    """Answers ``List`` with one pod: the job's pod on this node, holding every GPU and
    compute rail, with its exclusive CPUs (static CPU manager)."""

    def __init__(self, pod: str, gpu_uuids: list[str], cpu_ids: list[int]) -> None:
        self.pod = pod
        self.gpu_uuids = gpu_uuids
        self.cpu_ids = cpu_ids

    def List(  # noqa: N802 - the gRPC method name
        self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pb.ListPodResourcesResponse:
        container = pb.ContainerResources(
            name="trainer",
            devices=[
                pb.ContainerDevices(
                    resource_name=GPU_RESOURCE,
                    device_ids=self.gpu_uuids,
                    topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=0), pb.NUMANode(ID=1)]),
                ),
                pb.ContainerDevices(
                    resource_name=RDMA_RESOURCE, device_ids=[dev for dev, _ in RAILS]
                ),
            ],
            cpu_ids=self.cpu_ids,
        )
        pod = pb.PodResources(name=self.pod, namespace=NAMESPACE, containers=[container])
        return pb.ListPodResourcesResponse(pod_resources=[pod])


def serve(socket: Path, lister: Lister) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_PodResourcesListerServicer_to_server(lister, server)  # type: ignore[no-untyped-call]
    if server.add_insecure_port("unix://" + str(socket)) != 1:
        raise OSError(f"cannot serve pod-resources on {socket}")
    server.start()
    return server
