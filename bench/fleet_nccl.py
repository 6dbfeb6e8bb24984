"""What the agent reads from a healthy job's NCCL log, in a fleet history
(``bench/fleet_history.py``): the series the NCCL-log alerts read, for every job's pod while
it runs (the week's job churn included), and each node's GPUDirect RDMA path.

Where the values come from:

- **the transports a healthy multi-node job sets up**: the channel lines a real job on
  8-GPU nodes with RDMA HCAs printed at init
  (``tests/fixtures/nccl-logs/nccl-2.2x-sglang-4289.log``, an excerpt of a public issue
  thread with no warning in it, parsed by the agent's own NCCL line parser): NET/IB with
  GPUDirect RDMA (``/GDRDMA``) between nodes, P2P between the node's GPUs. No NET/Socket
  channel, no NET/IB one without GDRDMA. Where the week's job joins its NVLinked GPUs over
  SHM (the planted NVLink bypass) its node's intra-node channels are SHM's. The counts are
  the week's model: one connection per channel and direction, ``CHANNELS_PER_RAIL``
  channels on each of the node's 8 rails and GPU pairs (only whether a count is above 0 is
  judged);
- **the HCAs' NUMA placement**: the healthy DGX tree has four rails and four GPUs on each
  NUMA node; with NCCL giving each GPU its nearest rail (modelled) no NET/IB channel leaves
  its GPU's NUMA node: 0 for each rail;
- **warnings**: none. The recorded healthy jobs (``nccl-2.28.9-h100x4-ddp-p2p.log``, a DDP
  job recorded by this project) print no ``NCCL WARN`` line; every kind is exported at 0, as
  the agent does;
- **GPUDirect RDMA**: the node's path as the agent reads it from a real node's modules
  (``tests/fixtures/procfs-workload/gpudirect/peermem``: ``nvidia_peermem`` loaded).

Only the families the shipped rules read are written (``FAMILIES``), with the catalog's labels
(``exporter/metrics/nccl.py``, ``exporter/metrics/workload.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agent.core.sysfs import Issues, SysfsReader  # noqa: E402
from agent.throughput.nccl import Channel, NcclWarning, parse_nccl_line  # noqa: E402
from agent.throughput.records import WARNING_KINDS  # noqa: E402
from agent.workload.gpudirect import read_gpudirect  # noqa: E402
from exporter.metrics.nccl import CHANNELS, HCA_CHANNELS_OFF_GPU_NUMA, WARNINGS  # noqa: E402
from exporter.metrics.workload import GPUDIRECT_RDMA_AVAILABLE  # noqa: E402

FAMILIES = frozenset(
    {CHANNELS.name, HCA_CHANNELS_OFF_GPU_NUMA.name, WARNINGS.name, GPUDIRECT_RDMA_AVAILABLE.name}
)
FIXTURES = ROOT / "tests" / "fixtures"
JOB_LOG = FIXTURES / "nccl-logs" / "nccl-2.2x-sglang-4289.log"
HEALTHY_LOG = FIXTURES / "nccl-logs" / "nccl-2.28.9-h100x4-ddp-p2p.log"
PEERMEM = FIXTURES / "procfs-workload" / "gpudirect" / "peermem"
#: NCCL's channels per rail and per GPU pair (modelled, as fleet_history's NVLINK_CHANNELS)
CHANNELS_PER_RAIL = 16


def _channels(path: Path) -> list[Channel]:
    out = []
    for line in path.read_text().splitlines():
        parsed = parse_nccl_line(line)
        if parsed is not None and isinstance(parsed.event, Channel):
            out.append(parsed.event)
    return out


def _warnings(path: Path) -> int:
    return sum(
        1
        for line in path.read_text().splitlines()
        if (p := parse_nccl_line(line)) is not None and isinstance(p.event, NcclWarning)
    )


#: (transport, gdr) of the real job's channel lines, network first
JOB_TRANSPORTS = tuple(sorted({(c.transport, c.gdr) for c in _channels(JOB_LOG)}, key=str))
HEALTHY_WARNINGS = _warnings(HEALTHY_LOG)
GPUDIRECT_AVAILABLE = read_gpudirect(
    Issues(SysfsReader(str(PEERMEM / "proc"))), Issues(SysfsReader(str(PEERMEM / "sys")))
).available


def channel_counts(rails: int, gpus: int, bypassed: bool) -> dict[tuple[str, bool], int]:
    """A healthy job's pod on one node: its connections by (transport, GPUDirect RDMA), the
    real job's transports (:data:`JOB_TRANSPORTS`) at the week's channel counts; where
    ``bypassed``, its intra-node ones over SHM."""
    out: dict[tuple[str, bool], int] = {}
    for transport, gdr in JOB_TRANSPORTS:
        if transport.startswith("NET/"):
            out[(transport, gdr)] = 2 * CHANNELS_PER_RAIL * rails
        else:
            out[("SHM" if bypassed else transport, gdr)] = 2 * CHANNELS_PER_RAIL * (gpus - 1)
    return out


def _labels(pairs: Sequence[tuple[str, str]]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(pairs))


def write_job_nccl(
    series: Callable[[str, str, Sequence[float | None]], None],
    who: Sequence[tuple[str, str]],
    rails: Sequence[str],
    gpus: int,
    alive: Sequence[bool],
    *,
    bypassed: bool = False,
) -> None:
    """The NCCL-log series of one job's pod (``who``: instance, job, namespace, pod,
    container, job_name) while ``alive``."""

    def while_alive(v: float) -> list[float | None]:
        return [v if a else None for a in alive]

    for (transport, gdr), n in sorted(channel_counts(len(rails), gpus, bypassed).items()):
        lab = _labels((*who, ("transport", transport), ("gdr", "1" if gdr else "0")))
        series(CHANNELS.name, lab, while_alive(float(n)))
    for dev in rails:
        series(HCA_CHANNELS_OFF_GPU_NUMA.name, _labels((*who, ("device", dev))), while_alive(0.0))
    for kind in WARNING_KINDS:
        series(
            WARNINGS.name,
            _labels((*who, ("kind", kind))),
            while_alive(float(HEALTHY_WARNINGS)),
        )


def write_gpudirect(
    series: Callable[[str, str, Sequence[float | None]], None],
    inst: Sequence[tuple[str, str]],
    up: Sequence[bool],
) -> None:
    """The node's GPUDirect RDMA path (the workload sampler's) while its agent runs."""
    if GPUDIRECT_AVAILABLE is None:
        return
    v = 1.0 if GPUDIRECT_AVAILABLE else 0.0
    series(GPUDIRECT_RDMA_AVAILABLE.name, _labels(inst), [v if u else None for u in up])
