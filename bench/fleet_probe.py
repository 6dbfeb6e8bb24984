"""The NCCL probe's series in a fleet history (``bench/fleet_history.py``), as a healthy fleet
running the probe at the chart's default settings exports them.

What the chart's defaults do (``probe`` in the chart's values, ``ProbeSettings``): a pairing
round every 5 minutes (``ROUND``) with a node-pair ``sendrecv`` and ``latency`` probe between
two nodes' idle GPUs, an intra-node ``all_reduce`` across a node's idle GPUs every hour
(``INTRA``) at the six default GPU sizes (8 KiB to 64 MiB), results aging out after three
rounds (pairs) or three intervals (intra-node). The probe takes only idle GPUs: a node whose
GPUs run the job's pods probes nothing (the skip is counted, ``gpu_busy``). So in the week the
probe runs on the nodes with no job at the time (between two jobs, before and after a drain,
the event windows' nodes, which run none), and those pair up with each other each round.
Nodes with a planted fault do not probe (the faults' probe signature is not modelled: this
is the healthy background).

Where the values come from:

- **intra-node busbw**: the in-place ``busbw`` of a real ``all_reduce_perf`` log on one node
  of 8 GPUs (``tests/fixtures/nccl-tests/microsoft-superbenchmark/nccl_allreduce.log``,
  8x A100-SXM4-40GB) at the probe's default sizes;
- **node-pair busbw** (the largest size only, below full detail): the fixture's compute rail
  rate, ``400 Gb/sec (4X NDR)`` as the agent parses it (50 GB/s). Modelled: no recorded
  two-node sendrecv; the rules judge a pair against the fleet's median and a series
  against its own, so the spread matters, not the level;
- **run-to-run spread**: each run within +-2 % of its level, the H200s' measured 1-2 %
  run-to-run jitter (docs/probe.md);
- **failures**: none. No healthy fleet's probe failure rate was found, and a node that leaves
  (a reboot, a drain) leaves the membership before its next round: modelled.

Only the families the shipped rules read are written (``FAMILIES``), with the catalog's
labels (``exporter/metrics/probe.py``).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agent.config import ProbeSettings  # noqa: E402
from agent.infiniband.parse import parse_rate  # noqa: E402
from agent.probe.measure.records import GPU_DEFAULT_SIZES  # noqa: E402
from agent.probe.run.results import RUN_REASONS  # noqa: E402
from exporter.metrics.probe import BUSBW, COLLECTIVES, RUNS, SUCCESS  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from fleet_plan import NodePlan, Plan  # noqa: E402
from fleet_states import DGX, GPUS, RAILS  # noqa: E402
from probe_accuracy import parse_nccl_tests  # noqa: E402

FAMILIES = frozenset({BUSBW.name, RUNS.name, SUCCESS.name})
_DEFAULTS = ProbeSettings()
ROUND = _DEFAULTS.round_seconds
INTRA = _DEFAULTS.intra_seconds
PAIR_KINDS = _DEFAULTS.pair_kinds
PAIR_AGE = 3 * ROUND  # results age out after three rounds
INTRA_AGE = 3 * INTRA
JITTER = 0.02
ALL_REDUCE_LOG = (
    ROOT / "tests" / "fixtures" / "nccl-tests" / "microsoft-superbenchmark" / "nccl_allreduce.log"
)
#: bytes/s at each default size: the recorded 8-GPU all_reduce's in-place busbw (GB/s)
INTRA_BUSBW = {
    size: row.busbw_gbps * 1e9
    for size, row in parse_nccl_tests(ALL_REDUCE_LOG.read_text()).items()
    if size in GPU_DEFAULT_SIZES
}
#: bytes/s of a node-pair sendrecv at the largest size: the compute rail's rate (modelled)
PAIR_BUSBW = float(
    parse_rate((DGX / "class" / "infiniband" / RAILS[0] / "ports" / "1" / "rate").read_text())
)
PAIR_SIZE = max(GPU_DEFAULT_SIZES)


@dataclass(frozen=True, slots=True)
class PairRun:
    """One end's result of a node-pair round: from ``at`` (its end) with ``peer``."""

    at: float
    peer: str
    gpu: str
    peer_gpu: str
    busbw: float


def _job_alive(n: NodePlan, t: float) -> bool:
    if n.next_job and t >= n.next_job[0]:
        return True
    return bool(n.job) and n.job_start <= t and (n.job_gone is None or t < n.job_gone)


def idle(n: NodePlan, t: float) -> bool:
    """Whether ``n``'s agent runs and none of its GPUs runs a job's pod at ``t``."""
    return not n.is_down(t) and not _job_alive(n, t)


def pair_rounds(p: Plan, seed: int) -> dict[str, list[PairRun]]:
    """Each node's node-pair results over the history: every round, the nodes idle then (and
    through the round) paired at random, one idle GPU each side."""
    rng = random.Random(f"{seed}-probe")
    faulty = {f.node for f in p.faults}
    out: dict[str, list[PairRun]] = {n.name: [] for n in p.nodes}
    t = 0.0
    while t + ROUND <= p.seconds:
        ready = [
            n.name for n in p.nodes if n.name not in faulty and idle(n, t) and idle(n, t + ROUND)
        ]
        rng.shuffle(ready)
        for a, b in zip(ready[0::2], ready[1::2], strict=False):
            ga, gb = str(rng.randrange(GPUS)), str(rng.randrange(GPUS))
            at = t + rng.uniform(5, ROUND / 2)  # when the run ended within the round
            bw = PAIR_BUSBW * (1 + rng.uniform(-JITTER, JITTER))
            out[a].append(PairRun(at, b, ga, gb, bw))
            out[b].append(PairRun(at, a, gb, ga, bw))
        t += ROUND
    return out


def _labels(pairs: Sequence[tuple[str, str]]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(pairs))


def write_probe(
    series: Callable[[str, str, Sequence[float | None]], None],
    n: NodePlan,
    pairs: Sequence[PairRun],
    *,
    times: Sequence[float],
    up: Sequence[bool],
    boots: Sequence[float],
    rng: random.Random,
    faulty: bool,
) -> None:
    """``n``'s probe series at ``times`` (``up``: its agent runs; ``boots``: when it started):
    its node-pair results while they are fresh, its hourly intra-node all_reduce, and the run
    counters (every collective and reason, as the agent exports them; a reboot resets them)."""
    inst = (("instance", n.name), ("job", "fabricscope"))
    intra: list[tuple[float, dict[int, float]]] = []
    if not faulty:
        t = rng.uniform(0, INTRA)
        while t < times[-1]:
            if idle(n, t):
                intra.append(
                    (t, {s: v * (1 + rng.uniform(-JITTER, JITTER)) for s, v in INTRA_BUSBW.items()})
                )
            t += INTRA

    def fresh(at: float, age: float, i: int) -> bool:
        return up[i] and boots[i] <= at <= times[i] < at + age

    for r in pairs:
        key = (("peer", r.peer), ("gpu", r.gpu), ("peer_gpu", r.peer_gpu))
        alive = [fresh(r.at, PAIR_AGE, i) for i in range(len(times))]
        if not any(alive):
            continue
        for kind in PAIR_KINDS:
            lab = _labels((("collective", kind), *key, *inst))
            series(SUCCESS.name, lab, [1.0 if a else None for a in alive])
        lab = _labels((("collective", "sendrecv"), *key, ("size_bytes", str(PAIR_SIZE)), *inst))
        series(BUSBW.name, lab, [r.busbw if a else None for a in alive])
    empty = (("peer", ""), ("gpu", ""), ("peer_gpu", ""))
    intra_key = (("collective", "all_reduce"), *empty)
    latest: list[dict[int, float] | None] = []
    for i, t in enumerate(times):
        runs = [v for at, v in intra if fresh(at, INTRA_AGE, i) and at <= t]
        latest.append(runs[-1] if runs else None)
    if any(v is not None for v in latest):
        ok = [None if v is None else 1.0 for v in latest]
        series(SUCCESS.name, _labels((*intra_key, *inst)), ok)
        for size in sorted(INTRA_BUSBW):
            series(
                BUSBW.name,
                _labels((*intra_key, ("size_bytes", str(size)), *inst)),
                [None if v is None else v[size] for v in latest],
            )
    # runs by collective and outcome since the agent started: every run here passed
    ends = {
        "all_reduce": [at for at, _ in intra],
        **{k: [r.at for r in pairs] for k in PAIR_KINDS},
    }
    for collective in COLLECTIVES:
        done = ends.get(collective, [])
        for reason in RUN_REASONS:
            vals: list[float | None] = []
            for i, t in enumerate(times):
                if not up[i]:
                    vals.append(None)
                    continue
                ok = sum(1 for at in done if boots[i] <= at <= t) if reason == "ok" else 0
                vals.append(float(ok))
            lab = _labels((("collective", collective), ("reason", reason), *inst))
            series(RUNS.name, lab, vals)
