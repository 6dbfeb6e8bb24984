"""Metric specs and rendering for the probe sampler (``agent/probe/sampler.py``; the records
it reports are in ``agent/probe/run/results.py``).

Per-run series carry ``collective``, ``peer``, ``gpu`` and ``peer_gpu``: empty peer and GPUs
for an intra-node probe (all_reduce across the node's idle GPUs), else this node's GPU and the
peer's, both as NVML numbers them (CPU slot numbers under gloo). Bandwidths are per message
size and exported only for sizes measured correctly: a failed run leaves them absent and sets
``fabricscope_probe_success`` to 0. Runs age out (see the service), so a peer that left stops
having series. Counters are keyed by collective and reason only, so their number is bounded
whatever the cluster size.

Churn: a node meets a new peer every round (288 a day at the default 5-minute rounds), and
every series naming the peer is a new series. Below ``--collector.detail=full`` a node-pair
run therefore exports only what localisation, the alerts, the dashboards and explain read:
its success and, at its largest message size, its bus bandwidth (2 ranks: algbw equals
busbw), or its latency; 4 series a round for the default sendrecv + latency, 13 at full.
A node's distinct probe series over a day are then at most 4 per round plus a bounded rest
(intra-node runs, counters), whatever the cluster size.
"""

from __future__ import annotations

from agent.kubernetes.allocation import UNKNOWN_REASONS
from agent.probe.rendezvous.server import REFUSAL_REASONS
from agent.probe.run.results import RUN_REASONS, SKIP_REASONS, ProbeRun, ProbeSnapshot
from exporter.metrics.spec import Families, MetricSpec

COLLECTIVES = ("all_reduce", "latency", "sendrecv")
_RUN = ("collective", "peer", "gpu", "peer_gpu")
_SIZED = (*_RUN, "size_bytes")
_PAIR_FOLD_SIZE = (
    "Below full, a node-pair run (a new peer each round) exports its largest message size "
    "only; intra-node runs every size."
)
_PAIR_FOLD_RUN = (
    "Below full, intra-node runs only (a node-pair run's series would name a new peer each round)."
)

BUSBW = MetricSpec(
    "fabricscope_probe_busbw_bytes_per_second",
    "gauge",
    "Bus bandwidth of the latest probe at this message size (nccl-tests' busbw: algbw x "
    "2(n-1)/n for all_reduce, x 1 for sendrecv), in bytes per second. Absent when that "
    "size failed.",
    _SIZED,
    unit="bytes_per_second",
    fold=_PAIR_FOLD_SIZE,
)
ALGBW = MetricSpec(
    "fabricscope_probe_algbw_bytes_per_second",
    "gauge",
    "Algorithm bandwidth of the latest probe at this message size (size / time of one "
    "operation), in bytes per second. Absent when that size failed.",
    _SIZED,
    unit="bytes_per_second",
    fold="Below full, intra-node runs only: a node-pair run has two ranks, where algbw "
    "equals busbw.",
)
LATENCY = MetricSpec(
    "fabricscope_probe_latency_seconds",
    "gauge",
    "Mean time of one 8-byte all_reduce in the latest latency probe. Absent when it failed.",
    ("peer", "gpu", "peer_gpu"),
    unit="seconds",
)
SUCCESS = MetricSpec(
    "fabricscope_probe_success",
    "gauge",
    "1 if every size of the latest probe measured correctly, else 0 (runs_total says why).",
    _RUN,
)
LAST_RUN = MetricSpec(
    "fabricscope_probe_last_run_timestamp_seconds",
    "gauge",
    "Unix time the latest probe ended.",
    _RUN,
    unit="seconds",
    fold=_PAIR_FOLD_RUN,
)
DURATION = MetricSpec(
    "fabricscope_probe_duration_seconds",
    "gauge",
    "Wall time of the latest probe, worker start to exit (process and NCCL start included).",
    _RUN,
    unit="seconds",
    fold=_PAIR_FOLD_RUN,
)
RUNS = MetricSpec(
    "fabricscope_probe_runs_total",
    "counter",
    "Probes run, by collective and outcome: ok, or the first failure's reason (timeout, "
    "init_failure, peer_unreachable, auth_failure, wrong_result, gpu_busy, crashed).",
    ("collective", "reason"),
)
SKIPPED = MetricSpec(
    "fabricscope_probe_skipped_total",
    "counter",
    "Probes not run, by reason: allocation_unknown (which GPUs pods hold could not be "
    "established, so none is taken: fabricscope_probe_allocation_unknown_total says why), "
    "budget (GPU-time budget spent), gpu_busy (GPUs running compute processes, held by a pod "
    "or by another probe), gpu_unknown (NVML could not tell which GPUs are busy, so none is "
    "taken), no_partner, peer_declined.",
    ("reason",),
)
ALLOCATION_UNKNOWN = MetricSpec(
    "fabricscope_probe_allocation_unknown_total",
    "counter",
    "Times the probe took no GPU because it could not establish which GPUs pods hold, by "
    "reason: kubelet_unavailable (the kubelet's pod-resources call failed, or its socket is "
    "absent on a Kubernetes node), nvml_unavailable (NVML's pass failed, so the kubelet's GPU "
    "ids could not be joined to GPUs), unmapped_device (the kubelet named a GPU id no GPU here "
    "answers to, e.g. a MIG-<uuid>), no_attribution (pod attribution has not answered, or its "
    "last pass failed).",
    ("reason",),
)
GPU_SECONDS = MetricSpec(
    "fabricscope_probe_gpu_seconds_total",
    "counter",
    "GPU time probes held: wall time of each probe times the GPUs it used, in seconds.",
    unit="seconds",
)
MEMBERS = MetricSpec(
    "fabricscope_probe_members",
    "gauge",
    "Nodes in the probe membership (peers file), this node included.",
)
RENDEZVOUS_ACCEPTED = MetricSpec(
    "fabricscope_probe_rendezvous_accepted_total",
    "counter",
    "Peers that authenticated to this node's probe rendezvous and got an answer.",
)
RENDEZVOUS_REFUSED = MetricSpec(
    "fabricscope_probe_rendezvous_refused_total",
    "counter",
    "Connections this node's probe rendezvous refused, by reason: auth_failure (the shared "
    "secret was not proved), disconnected, protocol_error, timeout, too_many_pending.",
    ("reason",),
)

SPECS: tuple[MetricSpec, ...] = (
    BUSBW,
    ALGBW,
    LATENCY,
    SUCCESS,
    LAST_RUN,
    DURATION,
    RUNS,
    SKIPPED,
    ALLOCATION_UNKNOWN,
    GPU_SECONDS,
    MEMBERS,
    RENDEZVOUS_ACCEPTED,
    RENDEZVOUS_REFUSED,
)


def render(snap: ProbeSnapshot, out: Families) -> None:
    for run in snap.runs:
        _render_run(run, out, pair_fold=out.folds and bool(run.peer))
    totals = {(c, r): n for c, r, n in snap.runs_total}
    for collective in sorted({*COLLECTIVES, *(c for c, _ in totals)}):
        for reason in RUN_REASONS:
            out.add(RUNS, totals.get((collective, reason), 0), collective, reason)
    skipped = dict(snap.skipped_total)
    for reason in SKIP_REASONS:
        out.add(SKIPPED, skipped.get(reason, 0), reason)
    unknown = dict(snap.allocation_unknown_total)
    for reason in UNKNOWN_REASONS:
        out.add(ALLOCATION_UNKNOWN, unknown.get(reason, 0), reason)
    out.add(GPU_SECONDS, snap.gpu_seconds_total)
    out.add(MEMBERS, snap.members)
    if snap.rendezvous is not None:
        out.add(RENDEZVOUS_ACCEPTED, snap.rendezvous.accepted_total)
        for reason in REFUSAL_REASONS:
            out.add(RENDEZVOUS_REFUSED, snap.rendezvous.refused(reason), reason)


def _render_run(run: ProbeRun, out: Families, *, pair_fold: bool) -> None:
    """One run's series; ``pair_fold``: a node-pair run below full detail (module doc)."""
    labels = run.key
    out.add(SUCCESS, run.reason is None, *labels)
    if not pair_fold:
        out.add(LAST_RUN, run.finished_at, *labels)
        out.add(DURATION, run.duration_seconds, *labels)
    largest = max((rec.size_bytes for rec in run.records), default=0)
    for rec in run.records:
        if rec.error is not None:
            continue
        if run.collective == "latency":
            out.add(LATENCY, rec.time_seconds, run.peer, run.gpu, run.peer_gpu)
            continue
        if pair_fold and rec.size_bytes != largest:
            continue
        size = str(rec.size_bytes)
        out.add(BUSBW, rec.busbw_bytes_per_second, *labels, size)
        if not pair_fold:
            out.add(ALGBW, rec.algbw_bytes_per_second, *labels, size)
