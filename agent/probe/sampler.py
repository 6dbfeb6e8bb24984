"""The ``probe`` sampler, and building it from the agent's ``--probe.*`` settings: the secret,
the membership source (peers file or Kubernetes), the devices and their busy check, the
service (:mod:`agent.probe.run.service`) started with its rendezvous bound."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

from agent.config import ProbeSettings
from agent.core.errors import ConfigError
from agent.kubernetes.allocation import GpuAllocation
from agent.probe.rendezvous.secret import load_secret
from agent.probe.run.addresses import parse_hostport
from agent.probe.run.devices import (
    BusyGpus,
    GpuViewSource,
    NvmlBusyGpus,
    discover_slots,
    isolated_gpu_view,
    no_busy_gpus,
)
from agent.probe.run.results import ProbeSnapshot
from agent.probe.run.service import ProbeService
from agent.probe.schedule.membership import MembershipSource, PeersFile, normalize_host


class ProbeSampler:
    """The ``probe`` sampler: reports the service's latest results; never probes itself.
    ``close()`` (the runner calls it on shutdown) stops the service."""

    name = "probe"

    def __init__(self, service: ProbeService) -> None:
        self.service = service

    def sample(self) -> ProbeSnapshot:
        return self.service.snapshot()

    def close(self) -> None:
        self.service.stop()


def build_probe_sampler(
    settings: ProbeSettings,
    *,
    view: GpuViewSource | None = None,
    allocated: Callable[[], GpuAllocation] | None = None,
    memory_limit: int | None = None,
) -> ProbeSampler:
    """Load the secret, open the membership source (peers file or Kubernetes), find the
    devices, start the service (binding the rendezvous port). ``view``: where NVML is asked
    which GPUs there are and which are busy (default: a child process, kept for the busy
    checks when the backend is NCCL). ``allocated``: the GPUs pods hold, never probed whatever
    NVML says, or why that cannot be told, and then no GPU is probed (default: no pods).
    ``memory_limit``: the pod's, of which the GPU view's child gets its share as a memory
    ceiling. ConfigError, one clear line, for anything the user must
    fix."""
    secret = load_secret(settings.secret_file) if settings.secret_file else None
    listen: tuple[str, int] | None = None
    if settings.listen_address:
        try:
            listen = parse_hostport(settings.listen_address)
        except ValueError as exc:
            raise ConfigError(f"--probe.listen-address: {exc}") from None
    members: MembershipSource | None = None
    if settings.peers_file:
        if not os.path.isfile(settings.peers_file):
            raise ConfigError(f"probe peers file {settings.peers_file} does not exist")
        members = PeersFile(settings.peers_file)
    elif settings.kubernetes_selector:
        members = _kubernetes_members(settings)
    node_id = settings.node_id or (listen[0] if listen else socket.gethostname())
    try:
        node_id = normalize_host(node_id)
    except ValueError as exc:
        raise ConfigError(f"probe node id: {exc}") from None
    gpus = view or (
        isolated_gpu_view(memory_limit=memory_limit) if settings.backend != "gloo" else None
    )
    backend, slots = discover_slots(settings.backend, settings.cpu_slots, view=gpus)
    busy: BusyGpus = no_busy_gpus
    if backend == "nccl" and gpus is not None:
        busy = NvmlBusyGpus(gpus)
    elif gpus is not None:
        gpus.close()  # no GPU: the child is not needed again
    service = ProbeService(
        settings,
        node_id=node_id,
        backend=backend,
        slots=slots,
        secret=secret,
        members=members,
        listen=listen,
        busy=busy,
        allocated=allocated or GpuAllocation,
    )
    service.start()
    return ProbeSampler(service)


SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _kubernetes_members(settings: ProbeSettings) -> MembershipSource:
    """The agent pods matching ``--probe.kubernetes-selector``, in their namespace (default:
    the service account's). Imports the Kubernetes client only here."""
    from agent.probe.schedule.k8s_members import KubernetesMembers

    namespace = settings.kubernetes_namespace
    if not namespace:
        try:
            with open(SERVICE_ACCOUNT_NAMESPACE) as f:
                namespace = f.read().strip()
        except OSError:
            raise ConfigError(
                "--probe.kubernetes-selector: no --probe.kubernetes-namespace given and "
                f"{SERVICE_ACCOUNT_NAMESPACE} is unreadable (not in a pod?)"
            ) from None
    assert settings.kubernetes_selector is not None
    return KubernetesMembers(
        namespace, settings.kubernetes_selector, self_node=os.environ.get("NODE_NAME")
    )
