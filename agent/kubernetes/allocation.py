"""Which GPUs of this node pods hold, as far as it can be established, for the probe that
must never run on one of them.

Fail closed: an allocation that cannot be established is not an empty one. The answer is
either the GPU indices pods hold (allocated by the kubelet, or seen using them) or why it
cannot be told, one of :data:`UNKNOWN_REASONS`:

``kubelet_unavailable``
    the kubelet's pod-resources ``List`` failed this pass, or its socket is absent on a
    Kubernetes node (a node name to watch pods of is set): a pod that holds GPUs but has
    not started using them yet (loading data, waiting on its peers) is visible nowhere else.
``nvml_unavailable``
    the kubelet named GPUs, but NVML's pass failed, so their ids could not be joined to GPU
    indices.
``unmapped_device``
    the kubelet named a GPU id that no GPU of this node answers to: a ``MIG-<uuid>`` (from
    R470 drivers on, it does not name its parent GPU), a UUID NVML does not list, an id in
    another format.
``no_attribution``
    pod attribution has not answered yet, or its last pass failed or timed out.

Kept free of the kubelet client and the API watch, so that the probe can import it cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass

#: why the GPUs pods hold cannot be told (the ``reason`` label of the probe's refusals)
UNKNOWN_REASONS = ("kubelet_unavailable", "no_attribution", "nvml_unavailable", "unmapped_device")


@dataclass(frozen=True, slots=True)
class GpuAllocation:
    """``gpus``: the NVML indices of the GPUs pods hold; ``unknown``: None when ``gpus`` is
    the whole answer, else why it cannot be told (then no GPU may be taken)."""

    gpus: frozenset[int] = frozenset()
    unknown: str | None = None

    def __post_init__(self) -> None:
        if self.unknown is not None and self.unknown not in UNKNOWN_REASONS:
            raise ValueError(f"unknown allocation reason {self.unknown!r}")
