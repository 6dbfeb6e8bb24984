"""Whether the node has a kernel path for GPUDirect RDMA: RDMA NICs reading and writing GPU
memory directly.

The path exists when ``nvidia_peermem`` (or the legacy ``nv_peer_mem``) is loaded
(``module/<name>`` in sysfs; ``/proc/modules`` when sysfs has no ``module`` directory), or
through DMA-BUF when the NVIDIA *open* GPU kernel module is loaded
(``/proc/driver/nvidia/version``) on Linux 5.12 or later (``/proc/sys/kernel/osrelease``).
DMA-BUF also needs NIC driver and rdma-core support and an NCCL that uses it (2.19+); those
are not checked. The answer is a :class:`~agent.workload.records.GpuDirect`.
"""

from __future__ import annotations

import re

from agent.core.sysfs import Issues
from agent.workload.records import GpuDirect, NvidiaModule

PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")


def parse_modules(text: str) -> frozenset[str]:
    """Names of the modules ``/proc/modules`` lists as ``Live`` (lines ``name size refcount
    deps state address``; kernels without the state column count as live)."""
    out = set()
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if len(fields) >= 5 and fields[4] != "Live":
            continue
        out.add(fields[0])
    return frozenset(out)


def parse_nvidia_version(text: str) -> bool:
    """Whether ``/proc/driver/nvidia/version`` is the open GPU kernel module's
    (``NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05 ...``) rather than
    the proprietary one's (``NVRM version: NVIDIA UNIX x86_64 Kernel Module  515.76 ...``)."""
    first = text.splitlines()[0] if text.strip() else ""
    if not first.startswith("NVRM version:"):
        raise ValueError("no NVRM version line")
    return "Open Kernel Module" in first


def parse_kernel_release(text: str) -> tuple[int, int]:
    """``"6.8.0-45-generic"`` -> (6, 8)."""
    m = re.match(r"\s*([0-9]+)\.([0-9]+)", text)
    if m is None:
        raise ValueError("not a kernel release")
    return int(m.group(1)), int(m.group(2))


def _peermem_from_sysfs(issues: Issues) -> tuple[bool, str | None]:
    sys = issues.reader
    live = [
        m
        for m in PEERMEM_MODULES
        if sys.is_dir(f"module/{m}")
        # a module still loading ("coming") or unloading ("going") serves no one
        and issues.read_optional(f"module/{m}/initstate", str.strip) in (None, "live")
    ]
    return bool(live), (live[0] if live else None)


def read_gpudirect(proc_issues: Issues, sys_issues: Issues) -> GpuDirect:
    """The node's GPUDirect RDMA state (see the module docstring). ``proc_issues`` reads
    through the procfs reader, ``sys_issues`` through the sysfs one."""
    proc = proc_issues.reader
    loaded: bool | None
    module: str | None = None
    if sys_issues.reader.is_dir("module"):
        loaded, module = _peermem_from_sysfs(sys_issues)
    elif proc.exists("modules"):
        names = proc_issues.read("modules", parse_modules)
        if names is None:
            loaded = None
        else:
            live = [m for m in PEERMEM_MODULES if m in names]
            loaded, module = bool(live), (live[0] if live else None)
    else:
        loaded = False  # no loadable modules at all (CONFIG_MODULES=n): no peer-memory client
    flavour: NvidiaModule | None = "absent"
    if proc.exists("driver/nvidia/version"):
        is_open = proc_issues.read("driver/nvidia/version", parse_nvidia_version)
        flavour = None if is_open is None else "open" if is_open else "proprietary"
    kernel = proc_issues.read_optional("sys/kernel/osrelease", parse_kernel_release)
    return GpuDirect(loaded, module, flavour, kernel)
