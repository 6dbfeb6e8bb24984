"""A node's NVML series as the exporter renders them, its GPUs in an NVLink domain: the real
2x H200 recording replayed through the NVML sampler, its fabric answers edited to the GB200
node's registration (``tests/fixtures/nvml-fabric/gb200-completed.txt``: completed, success,
its cluster UUID) with the clique ID given."""

from __future__ import annotations

from exporter.metrics.exposition import render_text
from tests.nvml.test_nvml_fabric import rendered, with_fabric
from tests.nvml.test_nvml_fixtures import h200x2_recording

#: the GB200 node's cluster UUID (gb200-completed.txt)
GB200_UUID = "9c6f5af3-53bf-49b5-a436-b66766c413c3"


def nvml_exposition(clique: int, uuid: str = GB200_UUID) -> bytes:
    """Both GPUs of the recorded node registered in ``<uuid>.<clique>``, rendered."""
    answer: list[object] = [uuid.replace("-", ""), 0, clique, 3]
    return render_text(rendered(with_fabric(h200x2_recording(), answer, answer)))
