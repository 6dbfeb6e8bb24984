"""The devices a probe may use on this node, and which of them it may use now: discovery
(NCCL on the GPUs NVML sees, else gloo on simulated CPU slots), busy checks (GPUs running
compute processes or kept for others by their compute mode, GPUs the kubelet gave to pods)
and the per-device locks that keep two probes off one device.

NVML is never called in the agent's own process: :class:`GpuViewSampler` (the GPUs a probe
may use and which of them run compute processes now) runs in a supervised child process
(:func:`isolated_gpu_view`, :mod:`agent.core.isolation`), the same way the NVML sampler does, so a
crash or hang inside the driver library costs a busy check ("unknown": nothing is probed),
never ``/metrics``. The discovery and every later busy check ask the same child.

GPU numbering: a slot's ``label`` is the NVML index (workers run with
``CUDA_DEVICE_ORDER=PCI_BUS_ID``, see :mod:`agent.probe.run.service`); under gloo it is the slot
number ``0 .. cpu_slots - 1``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from agent.core.errors import ConfigError, NoData, SamplerFailure
from agent.core.isolation import ChildError, ChildSpec, IsolatedSampler, expect
from agent.core.sysfs import ReadIssue
from agent.nvml.api import LiveNvml, NvmlApi, NvmlCallError, open_api

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GpuSlot:
    """A device a probe can use. ``label`` names it in metrics: the NVML index, or the slot
    number of a simulated CPU device under gloo. ``device`` is the CUDA device index the
    worker uses (the NVML index, see the module doc), None under gloo."""

    label: int
    device: int | None


def _visible(env: Mapping[str, str], api: NvmlApi, count: int) -> list[int]:
    """NVML indices named by ``CUDA_VISIBLE_DEVICES`` (indices or GPU UUIDs; parsing stops
    at the first entry that names no GPU, as CUDA's does); all of them when unset."""
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None or raw.strip() in ("all", ""):
        return list(range(count)) if raw is None or raw.strip() == "all" else []
    uuids: dict[str, int] | None = None
    out: list[int] = []
    for token in (t.strip() for t in raw.split(",")):
        index: int | None = None
        if token.isdigit():
            index = int(token) if int(token) < count else None
        elif token.startswith("GPU-"):
            if uuids is None:
                uuids = {}
                for i in range(count):
                    try:
                        uuids[api.uuid(i)] = i
                    except NvmlCallError as exc:
                        log.warning("probe: NVML has no UUID for GPU %s: %s", i, exc)
            index = next((i for u, i in uuids.items() if u.startswith(token)), None)
        if index is None or index in out:
            break
        out.append(index)
    return out


#: nvmlDeviceGetComputeMode's ``NVML_COMPUTEMODE_DEFAULT``: any process may make a context
COMPUTE_MODE_DEFAULT = 0
#: what a GPU not offering the call answers: it has the default mode
_NO_COMPUTE_MODE = ("NOT_SUPPORTED", "FUNCTION_NOT_FOUND")


def kept_for_others(api: NvmlApi, gpu: int) -> bool:
    """Whether ``gpu``'s compute mode keeps it from a probe although nothing runs on it now:
    anything but the default. The NVIDIA device plugin's MPS sharing sets every GPU it shares
    to exclusive-process for as long as its MPS control daemon runs, and the daemon's server
    starts only when the first sharing pod makes a context: a probe holding the GPU then
    would keep every sharing pod from starting (and no probe can run beside the server).
    Prohibited admits no context at all; an unknown mode is taken as not the default. A GPU
    without the call (NOT_SUPPORTED, FUNCTION_NOT_FOUND) has the default mode; any other
    error is raised (the busy check is then unknown: nothing is probed)."""
    try:
        return api.compute_mode(gpu) != COMPUTE_MODE_DEFAULT
    except NvmlCallError as exc:
        if exc.name in _NO_COMPUTE_MODE:
            return False
        raise


@dataclass(frozen=True, slots=True)
class GpuView:
    """One look at the GPUs through NVML: ``labels``, the NVML indices a probe may use (those
    named by ``CUDA_VISIBLE_DEVICES`` when it is set), and ``busy``, those of them running
    compute processes now or whose compute mode is not the default (:func:`kept_for_others`:
    an MPS-shared GPU), None when NVML could not tell."""

    labels: tuple[int, ...]
    busy: frozenset[int] | None
    issues: tuple[ReadIssue, ...] = ()


class GpuViewSampler:
    """Answers :class:`GpuView` from NVML, initialised on the first ``sample()`` and kept.
    ``visible``: the ``CUDA_VISIBLE_DEVICES`` to honour (None: unset, every GPU). Runs in a
    child process in the agent (:func:`isolated_gpu_view`); in-process only in tests."""

    name = "probe-gpus"

    def __init__(
        self, nvml: Callable[[], NvmlApi] | None = None, visible: str | None = None
    ) -> None:
        self._factory: Callable[[], NvmlApi] = nvml or LiveNvml
        self._env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
        self._api: NvmlApi | None = None

    def sample(self) -> GpuView:
        if self._api is None:
            self._api = open_api(self._factory)
        api = self._api
        labels = tuple(_visible(self._env, api, api.device_count()))
        try:
            busy: frozenset[int] | None = frozenset(
                g for g in labels if api.compute_processes(g) or kept_for_others(api, g)
            )
        except NvmlCallError as exc:
            log.debug("probe: NVML cannot tell the busy GPUs: %s", exc)
            busy = None
        return GpuView(labels, busy)

    def close(self) -> None:
        api, self._api = self._api, None
        if api is not None:
            try:
                api.shutdown()
            except NvmlCallError as exc:
                log.debug("probe: nvmlShutdown: %s", exc)


def gpu_view_sampler(visible: str | None = None) -> GpuViewSampler:
    """The child process's factory (:class:`~agent.core.isolation.ChildSpec`)."""
    return GpuViewSampler(visible=visible)


class GpuViewSource(Protocol):
    """A :class:`GpuViewSampler`, in this process or in a child (:func:`isolated_gpu_view`)."""

    def sample(self) -> object: ...

    def close(self) -> None: ...


#: what asking a :class:`GpuViewSource` may raise: NVML's own error, no driver, the child
#: crashed, hung or is backing off, or the sampler raised in the child
VIEW_ERRORS = (NvmlCallError, NoData, SamplerFailure, ChildError)


def isolated_gpu_view(
    env: Mapping[str, str] | None = None,
    *,
    timeout_seconds: float = 10.0,
    start_timeout_seconds: float = 15.0,
    one_shot: bool = False,
    memory_limit: int | None = None,
) -> IsolatedSampler:
    """A :class:`GpuViewSampler` in a supervised child process (started on first use) with
    environment ``env`` (default: this process's), whose ``CUDA_VISIBLE_DEVICES`` it honours;
    ``memory_limit``: the pod's, of which the child's memory ceiling is a share."""
    environ = dict(os.environ if env is None else env)
    return IsolatedSampler(
        GpuViewSampler.name,
        ChildSpec(
            "agent.probe.run.devices:gpu_view_sampler",
            {"visible": environ.get("CUDA_VISIBLE_DEVICES")},
        ),
        timeout_seconds=timeout_seconds,
        start_timeout_seconds=start_timeout_seconds,
        one_shot=one_shot,
        env=environ,
        memory_limit=memory_limit,
    )


def _look(view: GpuViewSource) -> GpuView:
    return expect(view.sample(), GpuView)


def discover_slots(
    backend: str, cpu_slots: int, *, view: GpuViewSource | None = None
) -> tuple[str, tuple[GpuSlot, ...]]:
    """(backend, devices) a probe may use: NCCL on the GPUs NVML sees (those of
    ``CUDA_VISIBLE_DEVICES`` when set) or, for gloo or ``auto`` without GPUs, ``cpu_slots``
    simulated devices. ConfigError when ``nccl`` is asked for and there is no GPU. ``view``
    (default: a child process of its own, closed here) is asked once; NVML failing, or
    crashing its child, reads as no GPU, with the reason in the log line or the error."""
    cpu = tuple(GpuSlot(i, None) for i in range(cpu_slots))
    if backend == "gloo":
        return "gloo", cpu
    why = ""
    labels: tuple[int, ...] = ()
    source = view or isolated_gpu_view()
    try:
        labels = _look(source).labels
    except VIEW_ERRORS as exc:
        why = f" (NVML: {exc})"
    finally:
        if view is None:
            source.close()
    if labels:
        return "nccl", tuple(GpuSlot(i, i) for i in labels)
    if backend == "nccl":
        raise ConfigError(f"--probe.backend nccl: no NVIDIA GPU to probe{why}")
    log.info("probe: no GPU%s; probing %d CPU slots with gloo", why, cpu_slots)
    return "gloo", cpu


#: labels of the GPUs running compute processes now; None when that cannot be told
BusyGpus = Callable[[], frozenset[int] | None]


def no_busy_gpus() -> frozenset[int]:
    """The busy check of simulated CPU slots: never busy."""
    return frozenset()


class NvmlBusyGpus:
    """Busy GPUs by NVML's compute-process lists and compute modes, asked of ``view`` (no
    CUDA context is created). NVML failing, or its child crashing or hanging, is "unknown"
    (None): the service then treats every GPU as busy. Logged once when it starts failing
    and once when it answers again. ``close()`` closes the view."""

    def __init__(self, view: GpuViewSource) -> None:
        self._view = view
        self._lock = threading.Lock()
        self._failing = False

    def __call__(self) -> frozenset[int] | None:
        with self._lock:
            try:
                busy = _look(self._view).busy
                why = "NVML lists no compute processes"
            except VIEW_ERRORS as exc:
                busy, why = None, str(exc)
            if busy is None:
                if not self._failing:
                    log.warning("probe: cannot tell busy GPUs (%s); probing none", why)
                self._failing = True
                return None
            if self._failing:
                log.info("probe: NVML answers compute processes again")
            self._failing = False
            return busy

    def close(self) -> None:
        with self._lock:
            self._view.close()


class GpuLocks:
    """Which devices a probe holds now; acquiring is all or nothing."""

    def __init__(self) -> None:
        self._held: set[int] = set()
        self._lock = threading.Lock()

    def try_acquire(self, labels: Iterable[int]) -> bool:
        want = set(labels)
        with self._lock:
            if want & self._held:
                return False
            self._held |= want
            return True

    def release(self, labels: Iterable[int]) -> None:
        with self._lock:
            self._held -= set(labels)

    def held(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._held)
