"""Metric specs and rendering for the ``ras`` sampler: a job's state as NCCL's own RAS service
reports it (agent/ras), exported by the one node that asks each job.

Every job series carries ``namespace`` and ``job_name`` (the job's pods': annotation
``fabricscope.io/job``, else their controller; empty on bare metal unless
``--ras.endpoint IP:PORT=JOB``) and ``ras_endpoint`` (the address asked). No series carries a
rank, except ``fabricscope_nccl_ras_rank_info`` and ``..._rank_collectives_behind``, which
name at most ``--ras.max-named-ranks`` (8) ranks per job: the dead, unresponsive and lagging
ones. A job of any size is a fixed number of series plus those.

The node a named rank runs on: its ``host`` is the address of the rank's bootstrap
interface; ``fabricscope_nccl_ras_node_address_info`` (every node's own addresses) turns it
into that node's ``instance``::

    fabricscope_nccl_ras_rank_info
      * on (host) group_left (node) label_replace(
          topk by (host) (1, fabricscope_nccl_ras_node_address_info), "node", "$1",
          "instance", "(.*)")
"""

from __future__ import annotations

from collections import Counter

from agent.ras.parse import ERROR_KINDS
from agent.ras.sampler import RasSnapshot
from agent.ras.track import RANK_STATES
from agent.ras.wire import QUERY_ERRORS
from exporter.metrics.spec import Families, MetricSpec

_P = "fabricscope_nccl_ras_"
_J = ("namespace", "job_name", "ras_endpoint")
_LATEST = " As of the latest answer; absent while the job does not answer."

UP = MetricSpec(
    _P + "up",
    "gauge",
    "1 when the job's RAS service answered this node's latest query, 0 when the query "
    "failed (fabricscope_nccl_ras_query_errors_total says why).",
    _J,
)
QUERY_ERRORS_TOTAL = MetricSpec(
    _P + "query_errors_total",
    "counter",
    "RAS queries that produced no answer, by reason: malformed (not a RAS JSON status), "
    "oversized (an answer that could decode into more than 6 times its size in memory, "
    "refused before decoding), protocol (an unexpected handshake or another protocol "
    "version), refused (nothing listens there), reset (the connection reset or closed "
    "before the answer ended), timeout (--ras.timeout passed), too_large (past "
    "--ras.max-answer-bytes), unsupported (the job's NCCL is older than 2.28.7 and has no "
    "JSON output).",
    (*_J, "reason"),
)
REPAIRED = MetricSpec(
    _P + "repaired_answers_total",
    "counter",
    "Answers that were invalid JSON for NCCL 2.28's known defect (no comma between a "
    "missing rank's nvml_dev and status, seen in every 2.28.9 answer with a missing rank) "
    "and were repaired of that one defect.",
    _J,
    detail="default",
)
QUERY_DURATION = MetricSpec(
    _P + "query_duration_seconds",
    "gauge",
    "Wall time of the latest query: connecting, the handshake, NCCL's job-wide gather and "
    "reading the answer.",
    _J,
    "seconds",
    detail="default",
)
GATHER_DURATION = MetricSpec(
    _P + "gather_duration_seconds",
    "gauge",
    "How long NCCL's RAS took to gather the answer from every process of the job "
    "(its collection_time_sec)." + _LATEST,
    _J,
    "seconds",
    detail="default",
)
GATHER_TIMEOUTS = MetricSpec(
    _P + "gather_timeouts",
    "gauge",
    "Legs of NCCL's gather that timed out (a process that did not answer in time; its "
    "timeouts_count)." + _LATEST,
    _J,
    detail="default",
)
INFO = MetricSpec(
    _P + "info",
    "gauge",
    "The NCCL version the job's RAS service reports, value 1." + _LATEST,
    (*_J, "version"),
)
RANKS = MetricSpec(
    _P + "ranks",
    "gauge",
    "The job's GPUs (a process's host, pid and NVML device, once however many "
    "communicators it is in) by state: responsive (its process answered), unresponsive (its "
    "process sent no data to the gather: stopped, hung or unreachable), dead (RAS has failed "
    "to reach it for 60 s x NCCL_RAS_TIMEOUT_FACTOR and gave up)." + _LATEST,
    (*_J, "state"),
)
COMMUNICATORS = MetricSpec(
    _P + "communicators",
    "gauge",
    "NCCL communicators of the job." + _LATEST,
    _J,
)
MISMATCHED = MetricSpec(
    _P + "mismatched_communicators",
    "gauge",
    "Communicators whose answering ranks have launched different numbers of collectives. "
    "Common for an instant in a healthy job (collectives outpace the gather); a rank behind "
    "answer after answer is named lagging." + _LATEST,
    _J,
)
SPREAD = MetricSpec(
    _P + "collective_count_spread",
    "gauge",
    "The largest gap, in collective operations launched (all types together), between the "
    "most and the least advanced answering rank of one of the job's communicators." + _LATEST,
    _J,
)
UNCHANGED = MetricSpec(
    _P + "counts_unchanged_seconds",
    "gauge",
    "Seconds since any rank's collective counts last changed (counted from the first answer "
    "the agent saw, and again after the agent or its RAS child restarts). Counts that stop on "
    "every rank while ranks lag or stop answering are a hang." + _LATEST,
    _J,
    "seconds",
)
ASYNC_ERRORS = MetricSpec(
    _P + "async_error_ranks",
    "gauge",
    "Ranks whose communicator holds an asynchronous NCCL error (what ncclCommGetAsyncError "
    "would return), by kind: internal_error, invalid_argument, invalid_usage, remote_error "
    "(a peer failed), system_error (a socket or system call), unhandled_cuda_error, other; 0 "
    "for every kind without one." + _LATEST,
    (*_J, "kind"),
)
RANK_INFO = MetricSpec(
    _P + "rank_info",
    "gauge",
    "A rank worth naming, value 1: state dead, unresponsive or lagging (behind its "
    "communicator's most advanced rank in --ras.lag-answers answers in a row); rank is its "
    "number in the largest communicator it is in, host the address of its bootstrap "
    "interface, pid as the process sees itself, gpu its NVML index on its node. pci_bus_id "
    "and pod are filled when the rank runs on this node. At most --ras.max-named-ranks per "
    "job, the dead first." + _LATEST,
    (*_J, "rank", "state", "host", "pid", "gpu", "pci_bus_id", "pod"),
)
RANK_BEHIND = MetricSpec(
    _P + "rank_collectives_behind",
    "gauge",
    "Collective operations a lagging rank is behind its communicator's most advanced rank "
    "(the ranks of fabricscope_nccl_ras_rank_info with state lagging)." + _LATEST,
    (*_J, "rank"),
)
ENDPOINT_PROCESSES = MetricSpec(
    _P + "endpoint_processes",
    "gauge",
    "GPU processes of this node by what the agent does about their job's RAS service: "
    "queried (this node asks), other_node (the node of the job's rank-0 process asks), "
    "no_leader (no launcher rank readable and no pod marked to ask), not_reachable (on a "
    "pod's loopback: the job did not opt in with NCCL_RAS_ADDR or the fabricscope.io/"
    "nccl-ras-port annotation), disabled (NCCL_RAS_ENABLE is not 1), shared (several jobs on "
    "one endpoint). ras_endpoint is empty where there is none to reach.",
    (*_J, "state"),
)
NODE_ADDRESS = MetricSpec(
    _P + "node_address_info",
    "gauge",
    "An IP address of this node's host network (real interfaces only: no loopback, "
    "link-local, container bridge or CNI interface), value 1: joins a rank's host to the "
    "node it runs on.",
    ("host", "netdev"),
)
SKIPPED = MetricSpec(
    _P + "skipped_passes_total",
    "counter",
    "Passes that did not ask this job's RAS service because this node had more than 16 to "
    "ask: each pass asks the 16 asked longest ago, so every job is asked at least once every "
    "ceil(jobs / 16) passes; between its queries a job's other series are its latest "
    "query's.",
    _J,
)
QUERIES = MetricSpec(
    _P + "queries_total",
    "counter",
    "RAS queries this agent made, answered or not.",
    detail="default",
)
QUERY_CPU = MetricSpec(
    _P + "query_cpu_seconds_total",
    "counter",
    "CPU time the agent's RAS child spent on its queries (the conversation, parsing, tracking).",
    (),
    "seconds",
    detail="default",
)

SPECS: tuple[MetricSpec, ...] = (
    UP,
    QUERY_ERRORS_TOTAL,
    REPAIRED,
    QUERY_DURATION,
    GATHER_DURATION,
    GATHER_TIMEOUTS,
    INFO,
    RANKS,
    COMMUNICATORS,
    MISMATCHED,
    SPREAD,
    UNCHANGED,
    ASYNC_ERRORS,
    RANK_INFO,
    RANK_BEHIND,
    ENDPOINT_PROCESSES,
    NODE_ADDRESS,
    SKIPPED,
    QUERIES,
    QUERY_CPU,
)


def render(snap: RasSnapshot, out: Families) -> None:
    # unreachable processes come one group per pod: a job's pods add up under one series
    counts: Counter[tuple[str, str, str, str]] = Counter()
    for ep in snap.endpoints:
        counts[(ep.namespace, ep.job_name, ep.label, ep.state)] += len(ep.processes)
    for labels, n in sorted(counts.items()):
        out.add(ENDPOINT_PROCESSES, n, *labels)
    for a in snap.addresses:
        out.add(NODE_ADDRESS, 1, a.address, a.netdev)
    out.add(QUERIES, snap.queries_total)
    out.add(QUERY_CPU, snap.query_cpu_seconds_total)
    for job in snap.jobs:
        j = (job.namespace, job.job_name, job.endpoint)
        out.add(SKIPPED, job.skipped_total, *j)
        if not job.asked:  # not asked yet (more than 16 to ask): nothing else to say
            continue
        out.add(UP, job.status is not None, *j)
        errors = dict(job.errors_total)
        for reason in QUERY_ERRORS:
            out.add(QUERY_ERRORS_TOTAL, errors.get(reason, 0), *j, reason)
        out.add(REPAIRED, job.repaired_total, *j)
        out.add(QUERY_DURATION, job.query_seconds, *j)
        st = job.status
        if st is None:
            continue
        out.add(INFO, 1, *j, st.nccl_version)
        out.add(GATHER_DURATION, st.collection_seconds, *j)
        out.add(GATHER_TIMEOUTS, st.timeouts, *j)
        for state in RANK_STATES:
            out.add(RANKS, st.rank_count(state), *j, state)
        out.add(COMMUNICATORS, st.communicators, *j)
        out.add(MISMATCHED, st.mismatched_communicators, *j)
        out.add(SPREAD, st.count_spread, *j)
        out.add(UNCHANGED, st.counts_unchanged_seconds, *j)
        kinds = dict(st.async_error_ranks)
        for kind in ERROR_KINDS:
            out.add(ASYNC_ERRORS, kinds.get(kind, 0), *j, kind)
        for r in st.named:
            rank = str(r.rank)
            out.add(
                RANK_INFO,
                1,
                *j,
                rank,
                r.state,
                r.host,
                str(r.pid),
                str(r.gpu),
                r.pci_bus_id,
                r.pod,
            )
            if r.state == "lagging":
                out.add(RANK_BEHIND, r.behind, *j, rank)
