"""The ``ras`` sampler's flags (``fabricscope agent --ras.*``) and the
:class:`~agent.config.RasSettings` they make. Light to import: no RAS machinery."""

from __future__ import annotations

import argparse

from agent.config import (
    RAS_LEADER_POLICIES,
    RasEndpointFlag,
    RasSettings,
    format_bytes,
    parse_ras_endpoint,
)
from agent.core.errors import ConfigError
from exporter.cli.argtypes import byte_size, count, positive_duration, whole_seconds


def _endpoint(text: str) -> RasEndpointFlag:
    try:
        return parse_ras_endpoint(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_agent_flags(p: argparse.ArgumentParser) -> None:
    d = RasSettings()
    g = p.add_argument_group(
        "NCCL RAS: hung and straggling jobs, as NCCL's own RAS service sees them "
        "(docs/throughput.md)"
    )
    g.add_argument(
        "--ras.interval",
        dest="ras_interval",
        type=positive_duration,
        default=d.interval_seconds,
        metavar="DURATION",
        help="time between two queries of one job; each gathers from every process of the "
        "job (default: 30s)",
    )
    g.add_argument(
        "--ras.timeout",
        dest="ras_timeout",
        type=positive_duration,
        default=d.deadline_seconds,
        metavar="DURATION",
        help="one query's whole time: connecting, the handshake, NCCL's gather, the answer "
        "(default: 15s)",
    )
    g.add_argument(
        "--ras.gather-timeout",
        dest="ras_gather_timeout",
        type=whole_seconds,
        default=d.ras_timeout_seconds,
        metavar="DURATION",
        help="what NCCL is told each leg of its gather may take (its TIMEOUT command; the "
        "whole gather may take this plus 5s x NCCL_RAS_TIMEOUT_FACTOR; whole seconds, as "
        "NCCL takes it) (default: %(default)ss)",
    )
    g.add_argument(
        "--ras.max-answer-bytes",
        dest="ras_max_answer_bytes",
        type=byte_size,
        default=d.max_answer_bytes,
        metavar="SIZE",
        help="the largest answer read (16MiB, 16Mi, 16M or plain bytes); a larger one fails "
        f"the query, counted as too_large (default: {format_bytes(d.max_answer_bytes)}, about "
        "30,000 ranks' entries)",
    )
    g.add_argument(
        "--ras.leader",
        dest="ras_leader",
        choices=RAS_LEADER_POLICIES,
        default=d.leader,
        help="which node asks a job: rank0, the node of its rank-0 process (its launcher's "
        "RANK, OMPI_COMM_WORLD_RANK ...; or a pod annotated fabricscope.io/nccl-ras-leader: "
        "'true'); always, every node with a process of the job (default: %(default)s)",
    )
    g.add_argument(
        "--ras.endpoint",
        dest="ras_endpoints",
        type=_endpoint,
        action="append",
        default=[],
        metavar="IP:PORT[=JOB]",
        help="also ask the RAS service at IP:PORT every pass, job_name JOB (repeatable; an "
        "address, never a name): bare metal, or a job whose endpoint cannot be found",
    )
    g.add_argument(
        "--ras.lag-answers",
        dest="ras_lag_answers",
        type=count,
        default=d.lag_answers,
        metavar="N",
        help="answers in a row a rank must be behind its communicator's most advanced rank "
        "to be named lagging (default: %(default)s)",
    )
    g.add_argument(
        "--ras.max-named-ranks",
        dest="ras_max_named",
        type=count,
        default=d.max_named_ranks,
        metavar="N",
        help="ranks named per job (dead, unresponsive, lagging, in that order) "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--ras.isolate",
        dest="ras_isolate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="query and parse in a supervised child process: a job's answer is untrusted "
        "(default: on; off only to debug)",
    )


def settings_from_args(ns: argparse.Namespace) -> RasSettings:
    try:
        return RasSettings(
            interval_seconds=getattr(ns, "ras_interval", 30.0),
            deadline_seconds=getattr(ns, "ras_timeout", 15.0),
            ras_timeout_seconds=getattr(ns, "ras_gather_timeout", 5),
            max_answer_bytes=getattr(ns, "ras_max_answer_bytes", 16 << 20),
            leader=getattr(ns, "ras_leader", "rank0"),
            endpoints=tuple(getattr(ns, "ras_endpoints", ())),
            lag_answers=getattr(ns, "ras_lag_answers", 4),
            max_named_ranks=getattr(ns, "ras_max_named", 8),
            isolate=getattr(ns, "ras_isolate", True),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
