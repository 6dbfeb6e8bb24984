"""What an SRE should act on, from an NVML snapshot."""

from __future__ import annotations

from agent.core.findings import Finding
from agent.nvml.snapshot import FINDING_NVLINK_ERRORS, NvmlGpu, NvmlSnapshot


def generation_degraded_under_load(gpu: NvmlGpu) -> bool | None:
    """Whether a busy GPU's PCIe link runs below its highest generation; ``None`` when it is
    not judged: no compute process (an idle GPU lowers its link speed by design: real
    ``lspci`` of idle RTX 6000 Ada GPUs reads 2.5 GT/s of 16) or a generation unknown.
    Current and maximum come from one NVML pass, with the processes, so the judgement is
    of one moment. NVML's maximum is "possible with this device and system", so a Gen5 GPU
    in a Gen4 slot is not degraded."""
    pcie = gpu.pcie
    if not gpu.compute_processes or pcie.current_generation is None:
        return None
    if pcie.max_generation is None:
        return None
    return pcie.current_generation < pcie.max_generation


def findings(snap: NvmlSnapshot) -> list[Finding]:
    """What an SRE should act on, sorted.

    * ``nvlink_down`` (``gpu0/link3``): a link NVML lists as inactive, on a node that uses
      NVLink (some link of some GPU is up). A node where no link is up at all (PCIe cards
      without bridges) reports none: nothing says it should have NVLink.
    * ``nvlink_errors`` (``gpu0/link3``): a replay, recovery or CRC-flit counter above 0
      (see :attr:`NvLinkErrorCounts.link_errors` for why not crc_data / ecc_data).
    * ``gpu_lost`` (``gpu1``): NVML answered GPU_IS_LOST.
    * ``pcie_link_degraded`` (``gpu0``): current PCIe width below the maximum. Not the
      generation: GPUs drop it at idle by design.
    * ``gpu_pcie_speed_degraded`` (``gpu0``): the generation below the maximum while the GPU
      runs compute processes (:func:`generation_degraded_under_load`).
    * ``row_remap_failure`` (``gpu0``): a row remap failed; the GPU needs service.
    * ``xid`` (``gpu0/xid79``): XID events counted since the agent started.
    """
    out: list[Finding] = []
    node_uses_nvlink = any(link.up for gpu in snap.gpus for link in gpu.nvlinks)
    for gpu in snap.gpus:
        name = f"gpu{gpu.index}"
        where = f"GPU {gpu.index}" + (f" ({gpu.pci_bus_id})" if gpu.pci_bus_id else "")
        if gpu.lost:
            out.append(
                Finding(
                    "gpu_lost",
                    name,
                    f"{where}: NVML answers GPU_IS_LOST (fallen off the bus or inaccessible); "
                    "drain the node and reset or replace the GPU.",
                )
            )
        for link in gpu.nvlinks:
            if node_uses_nvlink and not link.up:
                out.append(
                    Finding(
                        "nvlink_down",
                        f"{name}/link{link.link}",
                        f"{where}: NVLink {link.link} is inactive while other links of this "
                        "node are up; NCCL traffic over it falls back or stalls.",
                    )
                )
            if link.errors.link_errors > 0:
                counts = ", ".join(
                    f"{k}={v}" for k, v in link.errors.items() if k in FINDING_NVLINK_ERRORS and v
                )
                out.append(
                    Finding(
                        "nvlink_errors",
                        f"{name}/link{link.link}",
                        f"{where}: NVLink {link.link} error counters are not zero ({counts}).",
                    )
                )
        pcie = gpu.pcie
        if (
            pcie.current_width is not None
            and pcie.max_width is not None
            and pcie.current_width < pcie.max_width
        ):
            out.append(
                Finding(
                    "pcie_link_degraded",
                    name,
                    f"{where}: PCIe link runs x{pcie.current_width} of x{pcie.max_width}.",
                )
            )
        if generation_degraded_under_load(gpu):
            procs = len(gpu.compute_processes or ())
            out.append(
                Finding(
                    "gpu_pcie_speed_degraded",
                    name,
                    f"{where}: PCIe link at Gen{pcie.current_generation} of "
                    f"Gen{pcie.max_generation} while {procs} compute process(es) run on it; "
                    "a busy GPU holds its highest generation, so host transfers run slower "
                    "(reseat, check the riser and the slot's BIOS speed setting).",
                )
            )
        if gpu.remapped_rows is not None and gpu.remapped_rows.failure:
            out.append(
                Finding(
                    "row_remap_failure",
                    name,
                    f"{where}: a memory row remap failed; the GPU needs service.",
                )
            )
    for xid in snap.xid_errors:
        if xid.count > 0:
            out.append(
                Finding(
                    "xid",
                    f"gpu{xid.gpu}/xid{xid.xid}",
                    f"GPU {xid.gpu} reported XID {xid.xid} {xid.count} time(s) since the "
                    "agent started.",
                )
            )
    return sorted(out)
