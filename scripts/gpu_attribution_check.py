#!/usr/bin/env python3
"""Check, on a GPU node, what pod attribution and the probe rely on against nvidia-smi -q.

- ``/proc/driver/nvidia/gpus/*/information`` (how Dynamic Resource Allocation's
  ``/dev/nvidia<minor>`` becomes a GPU): each GPU's device minor, UUID and bus address
  against nvidia-smi's ``Minor Number``, ``GPU UUID`` and bus id;
- NVML's compute mode, which keeps the probe off MPS-shared GPUs, against nvidia-smi's
  ``Compute Mode``, and the probe's busy check: a GPU is busy exactly when nvidia-smi shows
  it running processes or in a mode other than ``Default``.

Prints one row per check (PASS, FAIL, MISSING, SKIP as scripts/gpu_crosscheck.py does) and
exits 1 on any FAIL. Never changes a GPU setting. The MIG enumeration has its own check,
scripts/gpu_mig_check.py.
    python3 scripts/gpu_attribution_check.py [--procfs /proc]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_crosscheck import (
    FAIL,
    MISSING,
    PASS,
    SKIP,
    Check,
    _tree,
    compare,
    format_table,
    run_smi,
    smi_bus_id,
)

#: nvmlComputeMode_t as nvidia-smi -q prints it
COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}


@dataclass(frozen=True, slots=True)
class SmiFacts:
    """What nvidia-smi -q says of one GPU, None where it printed N/A or nothing."""

    pci_bus_id: str
    uuid: str | None
    minor: int | None
    compute_mode: str | None
    runs_processes: bool | None


def parse_facts(text: str) -> tuple[SmiFacts, ...]:
    out = []
    for node in _tree(text).children:
        if node.key != "GPU" or node.value is None:
            continue
        minor = node.get("Minor Number")
        procs = node.find("Processes")
        runs = None if procs is None else (procs.value or "").strip() != "None"
        out.append(
            SmiFacts(
                smi_bus_id(node.value),
                node.get("GPU UUID"),
                int(minor) if minor is not None and minor.isdigit() else None,
                node.get("Compute Mode"),
                runs,
            )
        )
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Ours:
    """What fabricscope read, keyed by PCI address: the driver's minors (minor, uuid), NVML's
    compute mode (None: not answered) and the probe's busy check's verdict."""

    minors: Mapping[str, tuple[int, str | None]]
    compute_modes: Mapping[str, int | None]
    busy: Mapping[str, bool | None]


def attribution_checks(facts: Sequence[SmiFacts], ours: Ours) -> list[Check]:
    out: list[Check] = []
    for f in facts:
        s = f.pci_bus_id
        minor = ours.minors.get(s)
        if minor is None:
            out.append(Check("procfs information", s, "present", "absent", FAIL))
        else:
            out.append(compare("procfs device minor", s, f.minor, minor[0]))
            out.append(compare("procfs uuid", s, f.uuid, minor[1]))
        mode = ours.compute_modes.get(s)
        out.append(
            compare("compute mode", s, f.compute_mode, None if mode is None else _mode(mode))
        )
        want = None
        if f.compute_mode is not None and f.runs_processes is not None:
            want = f.runs_processes or f.compute_mode != "Default"
        out.append(compare("probe busy", s, want, ours.busy.get(s)))
    return out


def _pci(text: str) -> str:
    """NVML's ``00000000:06:00.0`` in the sysfs form (``0000:06:00.0``)."""
    return smi_bus_id(text)


def _mode(mode: int) -> str:
    return COMPUTE_MODES.get(mode, f"unknown({mode})")


def read_ours(procfs: str) -> Ours:  # pragma: no cover - needs a GPU and its driver
    """This node's answers: procfs through the agent's reader, NVML live."""
    from agent.cdi.nvidia import read_gpu_minors
    from agent.core.sysfs import Issues, SysfsReader
    from agent.nvml.api import LiveNvml, NvmlCallError
    from agent.probe.run.devices import GpuViewSampler

    issues = Issues(SysfsReader(procfs))
    minors = {
        g.pci_bus_id: (g.minor, g.uuid) for g in read_gpu_minors(issues).values() if g.pci_bus_id
    }
    for i in issues.items:
        print(f"procfs issue: {i.path}: {i.reason}: {i.detail}")
    api = LiveNvml()
    api.init()
    modes: dict[str, int | None] = {}
    try:
        bus = {g: _pci(api.pci_bus_id(g)) for g in range(api.device_count())}
        for g, b in bus.items():
            try:
                modes[b] = api.compute_mode(g)
            except NvmlCallError as exc:
                print(f"compute mode of GPU {g}: {exc}")
                modes[b] = None
    finally:
        api.shutdown()
    view = GpuViewSampler()
    try:
        seen = view.sample().busy
    finally:
        view.close()
    busy = {b: (None if seen is None else g in seen) for g, b in bus.items()}
    return Ours(minors, modes, busy)


def main(argv: Sequence[str] | None = None) -> int:  # pragma: no cover - needs a GPU
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--procfs", default="/proc", help="procfs root (default /proc)")
    p.add_argument("--nvidia-smi", default="nvidia-smi", help="nvidia-smi binary")
    ns = p.parse_args(argv)
    from agent.nvml.api import NvmlCallError

    try:
        ours = read_ours(ns.procfs)
    except NvmlCallError as exc:
        print(f"gpu_attribution_check: FAIL: NVML: {exc}")
        return 1
    rc, text = run_smi(ns.nvidia_smi, "-q")
    checks = [Check("nvidia-smi -q", "node", f"rc={rc}", "-", FAIL)] if rc != 0 else []
    checks += attribution_checks(parse_facts(text if rc == 0 else ""), ours)
    print(format_table(checks))
    counts = {s: sum(1 for c in checks if c.status == s) for s in (PASS, FAIL, MISSING, SKIP)}
    print(" ".join(f"{k}={v}" for k, v in counts.items()))
    return 1 if counts[FAIL] else 0


if __name__ == "__main__":
    sys.exit(main())
