"""GPU-to-GPU NVLink connectivity from an NVML snapshot: the ``NV#`` cells of
``nvidia-smi topo -m``, computed from each link's far end. Pure; joins nothing else yet.
"""

from __future__ import annotations

from collections import Counter

from agent.nvml.snapshot import NvmlSnapshot


def nvlink_matrix(snap: NvmlSnapshot) -> dict[tuple[int, int], int]:
    """Active NVLinks between GPU ``i`` and GPU ``j`` (``i != j``), for every pair that has
    any, in both orders: ``{(0, 1): 18, (1, 0): 18}`` is ``NV18``.

    * A link whose far end is another GPU of this snapshot (matched by PCI address; far end
      type GPU or not reported) counts for that pair.
    * Links to NVSwitches join one switch fabric (as on HGX boards, where all NVSwitches of
      the baseboard form one fabric): two GPUs with ``a`` and ``b`` active switch links get
      ``min(a, b)``, which is what ``nvidia-smi topo -m`` prints for them (NV18 on HGX H100,
      NV12 on HGX A100).
    * Down links, lost GPUs and far ends that are neither (unknown address, IBM NPU) count
      for nothing.
    """
    by_bus = {g.pci_bus_id: g.index for g in snap.gpus if g.pci_bus_id is not None}
    direct: Counter[tuple[int, int]] = Counter()
    switch_links: Counter[int] = Counter()
    for gpu in snap.gpus:
        for link in gpu.nvlinks:
            if not link.up:
                continue
            if link.remote_device_type == "NVSwitch":
                switch_links[gpu.index] += 1
            elif link.remote_device_type in (None, "GPU") and link.remote_pci_bus_id in by_bus:
                peer = by_bus[link.remote_pci_bus_id]
                if peer != gpu.index:
                    direct[(gpu.index, peer)] += 1
    out: dict[tuple[int, int], int] = {}
    for (i, j), n in direct.items():
        # each side counts its own end: take the larger in case one side could not say
        out[(i, j)] = max(n, direct.get((j, i), 0))
        out[(j, i)] = out[(i, j)]
    for i in switch_links:
        for j in switch_links:
            if i != j:
                out[(i, j)] = out.get((i, j), 0) + min(switch_links[i], switch_links[j])
    return dict(sorted(out.items()))


def nvlinks_by_address(snap: NvmlSnapshot) -> dict[tuple[str, str], int]:
    """:func:`nvlink_matrix` keyed by the two GPUs' PCI addresses (sysfs form), so it joins
    with the PCI topology, which numbers GPUs by address, not by NVML index."""
    address = {g.index: g.pci_bus_id for g in snap.gpus if g.pci_bus_id is not None}
    return {
        (address[i], address[j]): n
        for (i, j), n in nvlink_matrix(snap).items()
        if i in address and j in address
    }
