"""The devices a probe may use on this node, and which of them it may use now: discovery
(NCCL on the GPUs NVML sees, else gloo on simulated CPU slots), busy checks (GPUs running
compute processes, GPUs the kubelet gave to pods) and the per-device locks that keep two
probes off one device.

GPU numbering: a slot's ``label`` is the NVML index (workers run with
``CUDA_DEVICE_ORDER=PCI_BUS_ID``, see :mod:`agent.probe.service`); under gloo it is the slot
number ``0 .. cpu_slots - 1``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from agent.errors import ConfigError
from agent.nvml_api import LiveNvml, NvmlApi, NvmlCallError

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


def discover_slots(
    backend: str,
    cpu_slots: int,
    *,
    nvml: Callable[[], NvmlApi] | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[str, tuple[GpuSlot, ...]]:
    """(backend, devices) a probe may use: NCCL on the GPUs NVML sees (those of
    ``CUDA_VISIBLE_DEVICES`` when set) or, for gloo or ``auto`` without GPUs, ``cpu_slots``
    simulated devices. ConfigError when ``nccl`` is asked for and there is no GPU."""
    cpu = tuple(GpuSlot(i, None) for i in range(cpu_slots))
    if backend == "gloo":
        return "gloo", cpu
    why = ""
    labels: list[int] = []
    try:
        api = (nvml or LiveNvml)()
        api.init()
        try:
            labels = _visible(os.environ if env is None else env, api, api.device_count())
        finally:
            api.shutdown()
    except NvmlCallError as exc:
        why = f" (NVML: {exc})"
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
    """Busy GPUs by NVML's compute-process lists (no CUDA context is created). NVML failing
    is "unknown" (None): the service then treats every GPU as busy."""

    def __init__(self, labels: Sequence[int], nvml: Callable[[], NvmlApi] | None = None) -> None:
        self._labels = tuple(labels)
        self._factory: Callable[[], NvmlApi] = nvml or LiveNvml
        self._api: NvmlApi | None = None
        self._lock = threading.Lock()
        self._failing = False

    def __call__(self) -> frozenset[int] | None:
        with self._lock:
            try:
                if self._api is None:
                    api = self._factory()
                    api.init()
                    self._api = api
                busy = frozenset(g for g in self._labels if self._api.compute_processes(g))
            except NvmlCallError as exc:
                if not self._failing:
                    log.warning("probe: cannot tell busy GPUs (%s); probing none", exc)
                self._failing = True
                return None
            if self._failing:
                log.info("probe: NVML answers compute processes again")
            self._failing = False
            return busy

    def close(self) -> None:
        with self._lock:
            if self._api is not None:
                try:
                    self._api.shutdown()
                except NvmlCallError as exc:
                    log.debug("probe: nvmlShutdown: %s", exc)
                self._api = None


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


class UnionBusy:
    """GPUs busy by either check; unknown (None) when the first cannot tell. ``close`` is
    passed on to the first (NVML's handle)."""

    def __init__(self, first: BusyGpus, second: Callable[[], frozenset[int]]) -> None:
        self._first = first
        self._second = second

    def __call__(self) -> frozenset[int] | None:
        a = self._first()
        return None if a is None else a | self._second()

    def close(self) -> None:
        close = getattr(self._first, "close", None)
        if callable(close):
            close()
