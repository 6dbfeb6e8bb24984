"""The NVIDIA driver's procfs files that name GPUs and MIG slices by device minor.

A container is given a GPU as the device node ``/dev/nvidia<minor>`` and a MIG slice as that
node plus two capability nodes ``/dev/nvidia-caps/nvidia-cap<m>`` (its GPU instance's and its
compute instance's). The minor is the driver's number, not NVML's index (they differ on
real machines), so it is joined through the driver's own files below ``--path.procfs``:

``driver/nvidia/gpus/<pci address>/information``
    one per GPU: ``Device Minor``, ``GPU UUID``, ``Bus Location`` among others (recorded on
    an H200 with driver 580.159.04: ``tests/fixtures/nvidia-procfs``).
``driver/nvidia-caps/mig-minors``
    one line per capability, ``gpu<minor>/gi<gi>/ci<ci>/access <cap minor>`` (and
    ``gpu<minor>/gi<gi>/access``, ``config``, ``monitor``), as NVIDIA's MIG user guide
    describes it.

Reading (``read_*``) and parsing (``parse_*``) are separate; parsers are pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.core.sysfs import Issues

GPUS_DIR = "driver/nvidia/gpus"
MIG_MINORS = "driver/nvidia-caps/mig-minors"
#: GPUs one node may list (a bound for a hostile or broken procfs)
MAX_GPUS = 256
MAX_MIG_LINES = 16384

_MIG_LINE = re.compile(r"^gpu(\d+)/gi(\d+)/(?:ci(\d+)/)?access\s+(\d+)$")


@dataclass(frozen=True, slots=True)
class GpuMinor:
    """One GPU as the driver numbers it: ``/dev/nvidia<minor>``."""

    minor: int
    uuid: str | None
    pci_bus_id: str | None


@dataclass(frozen=True, slots=True)
class MigCapability:
    """What one ``/dev/nvidia-caps/nvidia-cap<cap>`` grants: a GPU instance (``ci`` None) or
    a compute instance of the GPU with driver minor ``gpu_minor``."""

    cap: int
    gpu_minor: int
    gi: int
    ci: int | None


def parse_information(text: str) -> GpuMinor:
    """One ``gpus/<pci>/information`` file; ValueError without a ``Device Minor``."""
    fields = {}
    for line in text.splitlines()[:64]:
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    minor = fields.get("Device Minor", "")
    if not minor.isdigit():
        raise ValueError(f"no Device Minor ({minor[:40]!r})")
    uuid = fields.get("GPU UUID") or None
    bus = fields.get("Bus Location", "").lower() or None
    return GpuMinor(int(minor), uuid, bus)


def parse_mig_minors(text: str) -> tuple[MigCapability, ...]:
    """The GPU- and compute-instance capabilities of ``mig-minors`` (other lines skipped)."""
    out = []
    for line in text.splitlines()[:MAX_MIG_LINES]:
        m = _MIG_LINE.match(line.strip())
        if m:
            ci = int(m.group(3)) if m.group(3) is not None else None
            out.append(MigCapability(int(m.group(4)), int(m.group(1)), int(m.group(2)), ci))
    return tuple(out)


def read_gpu_minors(issues: Issues) -> dict[int, GpuMinor]:
    """Every GPU the driver lists, by minor; empty when the driver is not loaded (or procfs
    is not the host's)."""
    reader = issues.reader
    try:
        entries = reader.listdir(GPUS_DIR)[:MAX_GPUS]
    except OSError:
        return {}  # no NVIDIA driver here: a fact, not a read problem
    out = {}
    for entry in entries:
        g = issues.read(f"{GPUS_DIR}/{entry}/information", parse_information)
        if g is not None:
            out[g.minor] = g
    return out


def read_mig_capabilities(issues: Issues) -> dict[int, MigCapability]:
    """MIG capabilities by capability minor; empty without MIG (the file is absent)."""
    caps = issues.read_optional(MIG_MINORS, parse_mig_minors)
    return {c.cap: c for c in caps or ()}
