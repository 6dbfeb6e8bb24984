"""NVML recordings built from the MIG transcripts in tests/fixtures/nvml-mig (what people
pasted into public issue threads: ``nvidia-smi -L``, an NVML enumeration program's output,
the head of ``nvidia-smi``), so every UUID, GPU instance id, profile and slot answer the
tests replay is read from a transcript, never typed into a test.

What a transcript says becomes an answer as follows; what it does not say is left out of
the recording, and the replay (not strict) answers it NOT_SUPPORTED, i.e. absent:

- ``GPU <n>: <name> (UUID: <uuid>)``: ``nvmlDeviceGetName(n)``, ``nvmlDeviceGetUUID(n)``.
- ``  MIG <profile> Device <k>: (UUID: <uuid>)`` under GPU n: the MIG device in NVML slot k
  (``nvidia-smi -L`` numbers them as NVML's nvmlDeviceGetMigDeviceHandleByIndex does: the
  go-nvml transcript shows both for the same three devices), its UUID, and its name
  ``<GPU name> MIG <profile>`` (the form NVML names MIG devices in); GPU n's MIG mode
  current and pending enabled (nvidia-smi lists MIG devices only under a GPU in MIG mode;
  no transcript shows a pending change).
- ``MIG COUNT <c>``: nvmlDeviceGetMaxMigDeviceCount of the GPU; without that line, 7 (an
  A100's MIG device slots, NVIDIA's MIG user guide).
- ``MIG ID <g>`` then ``MIG UUID <uuid>``: that MIG device's nvmlDeviceGetGpuInstanceId.
- ``... MIG index <k> of GPU Index <n> Not Found``: slot k answers NOT_FOUND.
- ``Driver Version: <v>``, a ``| ... 00000000:86:00.0 ...`` row: driver, GPU 0's PCI address.
"""

from __future__ import annotations

import re
from pathlib import Path

from agent.nvml.api import ERROR_CODES
from agent.nvml.record import FORMAT, JsonValue, call_key, mig_key

MIG_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvml-mig"
#: an A100's MIG device slots (NVIDIA MIG user guide: up to seven MIG devices per GPU)
A100_SLOTS = 7

_GPU = re.compile(r"^GPU (\d+): (.+) \(UUID: (GPU-[0-9a-f-]+)\)$")
_MIG = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[0-9a-f-]+)\)$")
_COUNT = re.compile(r"^MIG COUNT (\d+)$")
_GI = re.compile(r"^MIG ID (\d+)$")
_GI_UUID = re.compile(r"^MIG UUID (MIG-[0-9a-f-]+)$")
_NOT_FOUND = re.compile(r"MIG index\s+(\d+) of GPU Index (\d+) Not Found")
_DRIVER = re.compile(r"Driver Version: (\S+)")
_BUS = re.compile(r"\| (0{8}:[0-9A-F]{2}:[0-9A-F]{2}\.\d) ")


def transcript_recording(name: str) -> dict[str, JsonValue]:
    """The recording a transcript in tests/fixtures/nvml-mig stands for."""
    text = (MIG_FIXTURES / name).read_text()
    calls: dict[str, JsonValue] = {
        "nvmlInit()": {"value": None},
        "nvmlShutdown()": {"value": None},
        "nvmlEventSetCreate()": {"value": None},
        "nvmlEventSetFree()": {"value": None},
        # the constant of the pynvml in use, not a node's answer: 12 links is every A100's
        "NVML_NVLINK_MAX_LINKS()": {"value": 12},
    }
    gpus: dict[int, str] = {}
    slots: dict[int, int] = {}
    gi_pending: int | None = None
    gi_of: dict[str, int] = {}
    mig_slot: dict[str, tuple[int, int]] = {}
    gpu = -1
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        if m := _GPU.match(line):
            gpu = int(m.group(1))
            gpus[gpu] = m.group(2)
            calls[call_key("nvmlDeviceGetName", gpu)] = {"value": m.group(2)}
            calls[call_key("nvmlDeviceGetUUID", gpu)] = {"value": m.group(3)}
        elif m := _MIG.match(line):
            slot, uuid = int(m.group(2)), m.group(3)
            calls[call_key("nvmlDeviceGetMigMode", gpu)] = {"value": [1, 1]}
            calls[mig_key("nvmlDeviceGetUUID", gpu, slot)] = {"value": uuid}
            calls[mig_key("nvmlDeviceGetName", gpu, slot)] = {
                "value": f"{gpus[gpu]} MIG {m.group(1)}"
            }
            mig_slot[uuid] = (gpu, slot)
        elif m := _COUNT.match(line):
            slots[max(gpu, 0)] = int(m.group(1))
        elif m := _GI.match(line):
            gi_pending = int(m.group(1))
        elif (m := _GI_UUID.match(line)) and gi_pending is not None:
            gi_of[m.group(1)] = gi_pending
            gi_pending = None
        elif m := _NOT_FOUND.search(line):
            key = mig_key("nvmlDeviceGetUUID", int(m.group(2)), int(m.group(1)))
            calls[key] = {"error": "NOT_FOUND", "code": ERROR_CODES["NOT_FOUND"]}
        elif m := _DRIVER.search(line):
            calls["nvmlSystemGetDriverVersion()"] = {"value": m.group(1)}
        if m := _BUS.search(line):
            calls[call_key("nvmlDeviceGetPciInfo", 0)] = {"value": m.group(1)}
    calls["nvmlDeviceGetCount()"] = {"value": len(gpus)}
    for g in gpus:
        if call_key("nvmlDeviceGetMigMode", g) in calls:
            count = slots.get(g, A100_SLOTS)
            calls[call_key("nvmlDeviceGetMaxMigDeviceCount", g)] = {"value": count}
    for uuid, gi in gi_of.items():
        g, slot = mig_slot[uuid]
        calls[mig_key("nvmlDeviceGetGpuInstanceId", g, slot)] = {"value": gi}
    return {
        "format": FORMAT,
        "recorded_at_unix": 0,
        "host": {"transcript": name},
        "calls": calls,
        "events": [],
    }
