"""Client of the kubelet's pod-resources API: which devices and CPUs each container was given.

The kubelet serves ``v1.PodResourcesLister`` on a unix socket (by default
``/var/lib/kubelet/pod-resources/kubelet.sock``, root only). ``List`` returns, per pod and
container, the device-plugin resources allocated to it (``nvidia.com/gpu`` device ids are GPU
UUIDs; SR-IOV and RDMA plugins report VF PCI addresses or RDMA device names) and, with the
static CPU manager policy, its exclusive CPUs; and, for devices allocated through Dynamic
Resource Allocation, each ResourceClaim with the devices it got (driver, pool, device name)
and the CDI device names the driver prepared them as (``dynamic_resources``). It answers
from the kubelet's memory, so one call per sampling pass is cheap; a short deadline bounds a
hung kubelet.

The wire types come from ``agent/kubernetes/podresources.proto`` (the upstream messages, subset);
this
module turns them into plain frozen records at once, so nothing past it sees protobuf. The
generated module (which needs protobuf 7) and grpc (about 20 MiB resident) are imported when the
kubelet is first asked (its socket exists), so an
agent that never asks (attribution off) starts without protobuf installed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import grpc

    from agent.kubernetes import podresources_pb2 as pb

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
#: the kubelet's own limit for pod-resources messages (podresources.DefaultMaxMsgSize, 16 MiB)
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
_LIST = "/v1.PodResourcesLister/List"


@dataclass(frozen=True, slots=True)
class DeviceAllocation:
    """Devices of one resource given to a container; ``numa_nodes`` from their topology."""

    resource_name: str
    device_ids: tuple[str, ...]
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One device a ResourceClaim got: ``driver`` (``gpu.nvidia.com``), ``pool`` (usually
    the node's name), ``device`` (the driver's name for it, ``gpu-0``), each empty when an
    older kubelet did not send it, and ``cdi_devices``: the fully qualified CDI device names
    it was prepared as (``k8s.gpu.nvidia.com/claim=<claim uid>-gpu-0``)."""

    driver: str = ""
    pool: str = ""
    device: str = ""
    cdi_devices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimAllocation:
    """A ResourceClaim a container uses (Dynamic Resource Allocation) and its devices."""

    name: str
    namespace: str
    devices: tuple[ClaimDevice, ...] = ()


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    """What one container was given: device-plugin devices, exclusive CPUs (static CPU
    manager only) and ResourceClaims (``claims``)."""

    name: str
    devices: tuple[DeviceAllocation, ...] = ()
    cpu_ids: tuple[int, ...] = ()
    claims: tuple[ClaimAllocation, ...] = ()


@dataclass(frozen=True, slots=True)
class PodAllocation:
    namespace: str
    name: str
    containers: tuple[ContainerAllocation, ...] = ()


class SocketAbsent(Exception):  # noqa: N818 - an outcome, not a failure
    """The pod-resources socket does not exist: not a kubelet node, or not mounted in."""


def _messages() -> ModuleType:
    """The generated message classes (protobuf), imported on first use."""
    from agent.kubernetes import podresources_pb2

    return podresources_pb2


class KubeletUnavailable(Exception):  # noqa: N818 - named after the error reason it counts as
    """The socket exists but ``List`` failed; ``code`` is the gRPC status name
    (``DEADLINE_EXCEEDED``, ``UNAVAILABLE``, ``PERMISSION_DENIED`` ...)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


def from_response(resp: pb.ListPodResourcesResponse) -> tuple[PodAllocation, ...]:
    """Plain records for a ``List`` answer, pods sorted by namespace and name."""
    pods = []
    for p in resp.pod_resources:
        containers = tuple(
            ContainerAllocation(
                name=c.name,
                devices=tuple(
                    DeviceAllocation(
                        d.resource_name,
                        tuple(d.device_ids),
                        tuple(sorted(n.ID for n in d.topology.nodes)),
                    )
                    for d in c.devices
                ),
                cpu_ids=tuple(sorted(c.cpu_ids)),
                claims=tuple(
                    ClaimAllocation(
                        r.claim_name,
                        r.claim_namespace,
                        tuple(
                            ClaimDevice(
                                d.driver_name,
                                d.pool_name,
                                d.device_name,
                                tuple(x.name for x in d.cdi_devices),
                            )
                            for d in r.claim_resources
                        ),
                    )
                    for r in c.dynamic_resources
                ),
            )
            for c in p.containers
        )
        pods.append(PodAllocation(p.namespace, p.name, containers))
    return tuple(sorted(pods, key=lambda a: (a.namespace, a.name)))


class PodResourcesClient:
    """Calls ``List`` on the kubelet's socket with a deadline of ``timeout_seconds``.

    Each call opens its own channel and closes it: a restarted kubelet is picked up on the
    next call instead of after gRPC's reconnect backoff (up to 2 minutes), and nothing is
    left between calls for gRPC's threads to tend. A channel kept open between calls every
    15 s cost 0.8 to 1.3 millicores in gRPC's own event-engine threads with nothing to do
    (docs/performance.md, "gRPC's idle threads"); a channel per call costs its connect, a
    few hundred microseconds on a unix socket.
    """

    def __init__(self, socket_path: str = DEFAULT_SOCKET, *, timeout_seconds: float = 2.0) -> None:
        self.socket_path = socket_path
        self.timeout_seconds = timeout_seconds

    def socket_exists(self) -> bool:
        return os.path.exists(self.socket_path)

    def list(self) -> tuple[PodAllocation, ...]:
        """Every pod the kubelet knows, with what its containers were given.

        Raises :class:`SocketAbsent` when there is no socket and :class:`KubeletUnavailable`
        when the call fails or misses its deadline.
        """
        if not self.socket_exists():
            raise SocketAbsent(self.socket_path)
        import grpc  # ~20 MiB, paid only on a node with a kubelet socket

        msgs = _messages()
        channel = grpc.insecure_channel(
            "unix://" + os.path.abspath(self.socket_path),
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.enable_http_proxy", 0),
            ],
        )
        try:
            call: grpc.UnaryUnaryMultiCallable[
                pb.ListPodResourcesRequest, pb.ListPodResourcesResponse
            ] = channel.unary_unary(
                _LIST,
                request_serializer=msgs.ListPodResourcesRequest.SerializeToString,
                response_deserializer=msgs.ListPodResourcesResponse.FromString,
            )
            resp = call(msgs.ListPodResourcesRequest(), timeout=self.timeout_seconds)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            name = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
            detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            raise KubeletUnavailable(name, detail or "") from None
        finally:
            channel.close()
        return from_response(resp)
