"""A node's NVML series as the exporter renders them, its GPUs in an NVLink domain: the real
2x H200 recording replayed through the NVML sampler, its fabric answers edited to the GB200
node's registration (``tests/fixtures/nvml-fabric/gb200-completed.txt``: completed, success,
its cluster UUID) with the clique ID given."""

from __future__ import annotations

import copy

from agent.nvml.record import ReplayNvml, call_key
from agent.nvml.sampler import NvmlSampler
from exporter.metrics import nvml as nvml_metrics
from exporter.metrics.exposition import render_text
from exporter.metrics.spec import Families
from tests.nvml.test_nvml_fixtures import h200x2_recording

#: the GB200 node's cluster UUID (gb200-completed.txt)
GB200_UUID = "9c6f5af3-53bf-49b5-a436-b66766c413c3"


def nvml_exposition(clique: int, uuid: str = GB200_UUID) -> bytes:
    """Both GPUs of the recorded node registered in ``<uuid>.<clique>``, rendered."""
    rec = copy.deepcopy(h200x2_recording())
    calls = rec["calls"]
    assert isinstance(calls, dict)
    for gpu in (0, 1):
        calls[call_key("nvmlDeviceGetGpuFabricInfoV", gpu)] = {
            "value": [uuid.replace("-", ""), 0, clique, 3]
        }
    sampler = NvmlSampler(lambda: ReplayNvml(rec))
    try:
        snap = sampler.sample()
    finally:
        sampler.close()
    out = Families("default")
    nvml_metrics.render(snap, out)
    return render_text(out)
