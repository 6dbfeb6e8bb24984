"""The kubelet's pod-resources API for a lab node: a real gRPC server on a unix socket
(``v1.PodResourcesLister``, the servicer generated from ``agent/kubernetes/podresources.proto``),
so the
agent's attribution sampler reads the job's pods exactly as on a Kubernetes node; and the
job's pod as the API server lists it (:func:`pod_object`), for the agent's pod index."""

from __future__ import annotations

from concurrent import futures
from pathlib import Path

import grpc

from agent.kubernetes import podresources_pb2 as pb
from agent.kubernetes import podresources_pb2_grpc as pb_grpc
from agent.kubernetes.podwatch import PodIndex, parse_pod
from tests.lab.scenarios import CONTAINER, JOB_NAME, NAMESPACE, RAILS

GPU_RESOURCE = "nvidia.com/gpu"
RDMA_RESOURCE = "rdma/rdma_shared_device_a"


class Lister(pb_grpc.PodResourcesListerServicer):
    """Answers ``List`` with one pod: the job's pod on this node, holding every GPU and
    compute rail, with its exclusive CPUs (static CPU manager)."""

    def __init__(
        self,
        pod: str,
        gpu_uuids: list[str],
        cpu_ids: list[int],
        claims: list[pb.DynamicResource] | None = None,
    ) -> None:
        self.pod = pod
        self.gpu_uuids = gpu_uuids
        self.cpu_ids = cpu_ids
        #: Dynamic Resource Allocation (tests/lab/dra.py): the GPUs and rails come from these
        #: claims only, no device-plugin devices
        self.claims = claims

    def List(  # noqa: N802 - the gRPC method name
        self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pb.ListPodResourcesResponse:
        container = pb.ContainerResources(
            name=CONTAINER,
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
        if self.claims is not None:
            del container.devices[:]
            container.dynamic_resources.extend(self.claims)
        pod = pb.PodResources(name=self.pod, namespace=NAMESPACE, containers=[container])
        return pb.ListPodResourcesResponse(pod_resources=[pod])


def serve(socket: Path, lister: Lister) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_PodResourcesListerServicer_to_server(lister, server)  # type: ignore[no-untyped-call]
    if server.add_insecure_port("unix://" + str(socket)) != 1:
        raise OSError(f"cannot serve pod-resources on {socket}")
    server.start()
    return server


def pod_object(pod: str, uid: str, node: str) -> dict[str, object]:
    """The job's pod as ``GET /api/v1/pods?fieldSelector=spec.nodeName=<node>`` returns it
    (the fields the agent reads, as the API spells them): a StatefulSet ``llm`` controls
    pods ``llm-<n>``, so the agent names the job ``llm`` from the pod's owner."""
    return {
        "metadata": {
            "name": pod,
            "namespace": NAMESPACE,
            "uid": uid,
            "labels": {
                "app.kubernetes.io/name": JOB_NAME,
                "apps.kubernetes.io/pod-index": pod.rsplit("-", 1)[1],
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "StatefulSet",
                    "name": JOB_NAME,
                    "uid": "5c0f1b9e-3a9e-4b8e-9d6c-" + "0" * 12,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {"nodeName": node},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": CONTAINER, "containerID": f"containerd://{uid.replace('-', '')}"}
            ],
        },
    }


def pod_index(pod: str, uid: str, node: str) -> PodIndex:
    """The agent's index of ``node``'s pods, parsed by the agent's own :func:`parse_pod`
    from :func:`pod_object` (what its API watch would have built)."""
    meta = parse_pod(pod_object(pod, uid, node))
    assert meta is not None
    return PodIndex([meta])
