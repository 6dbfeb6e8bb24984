"""Measures what one NVML call costs on this machine, single calls against one batched
nvmlDeviceGetFieldValues, and prints what each scoped NVLink field answers next to the
per-link calls (to learn which counter field 163, DL_CRC, is). Run on a GPU node:

    python bench/nvml_fieldvalues.py
"""

from __future__ import annotations

import json
import time

import pynvml as n


def timed(fn, reps: int = 200) -> float:  # type: ignore[no-untyped-def]
    t0 = time.process_time()
    for _ in range(reps):
        fn()
    return (time.process_time() - t0) / reps


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
