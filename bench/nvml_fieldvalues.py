"""Measures what one NVML call costs on this machine, single calls against one batched
nvmlDeviceGetFieldValues, and prints what each scoped NVLink field answers next to the
per-link calls (to learn which counter field 163, DL_CRC, is). Run on a GPU node:

    python bench/nvml_fieldvalues.py
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pynvml as n


def timed(fn: Callable[[], object], reps: int = 200) -> float:
    t0 = time.process_time()
    for _ in range(reps):
        fn()
    return (time.process_time() - t0) / reps


def agent_calls() -> dict[str, float | str]:
    """CPU seconds per call of what a steady pass asks beyond the costs above, GPU 0, via
    :class:`agent.nvml.api.LiveNvml`; a call the GPU refuses is reported by its error."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from agent.nvml.api import (
        FI_NVLINK_THROUGHPUT_DATA_RX,
        FI_NVLINK_THROUGHPUT_DATA_TX,
        SCOPE_ALL_LINKS,
        LiveNvml,
        NvmlCallError,
    )

    api = LiveNvml()
    api.init()
    traffic = [
        (FI_NVLINK_THROUGHPUT_DATA_TX, SCOPE_ALL_LINKS),
        (FI_NVLINK_THROUGHPUT_DATA_RX, SCOPE_ALL_LINKS),
    ]
    calls: dict[str, Callable[[], object]] = {
        "cpu_s_per_DeviceCount": api.device_count,
        "cpu_s_per_MigMode": lambda: api.mig_mode(0),
        "cpu_s_per_GpuFabricInfo": lambda: api.gpu_fabric_info(0),
        "cpu_s_FieldValues_2_traffic_all_links": lambda: api.field_values(0, traffic),
        "cpu_s_FieldValues_1_traffic_link0": lambda: api.field_values(
            0, [(FI_NVLINK_THROUGHPUT_DATA_TX, 0)]
        ),
    }
    out: dict[str, float | str] = {}
    for key, fn in calls.items():
        try:
            fn()
        except NvmlCallError as exc:
            out[key] = f"error: {exc.name}"
            continue
        out[key] = timed(fn, 50)
    try:  # the XID poll every pass ends with: a wait of 0 ms that finds nothing
        api.xid_open()
        api.xid_register(0)

        def poll() -> None:
            with contextlib.suppress(NvmlCallError):  # TIMEOUT: nothing queued, as usual
                api.xid_wait(0)

        out["cpu_s_per_EventSetWait_0ms"] = timed(poll, 50)
        api.xid_close()
    except NvmlCallError as exc:
        out["cpu_s_per_EventSetWait_0ms"] = f"error: {exc.name}"
    api.shutdown()
    return out


def main() -> None:
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    out: dict[str, object] = {}
    out["cpu_s_per_NvLinkErrorCounter"] = timed(lambda: n.nvmlDeviceGetNvLinkErrorCounter(h, 0, 2))
    out["cpu_s_per_NvLinkState"] = timed(lambda: n.nvmlDeviceGetNvLinkState(h, 0))
    out["cpu_s_per_PcieReplayCounter"] = timed(lambda: n.nvmlDeviceGetPcieReplayCounter(h))
    out["cpu_s_per_ComputeRunningProcesses"] = timed(
        lambda: n.nvmlDeviceGetComputeRunningProcesses(h)
    )
    out["cpu_s_per_CurrPcieLinkGeneration"] = timed(
        lambda: n.nvmlDeviceGetCurrPcieLinkGeneration(h)
    )
    out["cpu_s_per_CurrPcieLinkWidth"] = timed(lambda: n.nvmlDeviceGetCurrPcieLinkWidth(h))
    out["cpu_s_per_CurrentClocksEventReasons"] = timed(
        lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h)
    )
    out["cpu_s_per_NvLinkVersion"] = timed(lambda: n.nvmlDeviceGetNvLinkVersion(h, 0))
    out["cpu_s_per_NvLinkRemotePciInfo"] = timed(lambda: n.nvmlDeviceGetNvLinkRemotePciInfo(h, 0))
    out["cpu_s_per_RemappedRows"] = timed(lambda: n.nvmlDeviceGetRemappedRows(h))
    # every other call a steady pass makes, through the agent's own adapter (the call the
    # sampler makes, with its structs): where a 2x H200's 10 ms pass went that the costs
    # above do not account for
    out.update(agent_calls())
    scoped = [161, 162, 163, 164, 165, 166]
    one = [(165, 0)]
    links = [(f, link) for link in range(18) for f in scoped]
    gpu_fields = [3, 4, 94, 142, 143, 144, 145]
    out["cpu_s_FieldValues_1"] = timed(lambda: n.nvmlDeviceGetFieldValues(h, one))
    out["cpu_s_FieldValues_108_links"] = timed(lambda: n.nvmlDeviceGetFieldValues(h, links), 50)
    out["cpu_s_FieldValues_7_gpu"] = timed(lambda: n.nvmlDeviceGetFieldValues(h, gpu_fields), 50)
    vals = n.nvmlDeviceGetFieldValues(h, links + [(f, 0) for f in gpu_fields])
    answers = {}
    for v in vals:
        ret = v.nvmlReturn
        val = None
        if ret == 0:
            t = v.valueType
            val = {
                0: v.value.dVal,
                1: v.value.uiVal,
                2: v.value.ulVal,
                3: v.value.ullVal,
                4: v.value.sllVal,
                5: v.value.siVal,
            }.get(t)
        answers[f"{v.fieldId}/{v.scopeId}"] = {"ret": ret, "value": val}
    out["field_answers"] = answers
    per_link = {}
    for link in (0, 1, 17):
        per_link[link] = [n.nvmlDeviceGetNvLinkErrorCounter(h, link, c) for c in range(5)]
    out["per_link_error_counters_0..4"] = per_link
    print(json.dumps(out, indent=1))
    n.nvmlShutdown()


if __name__ == "__main__":
    main()
