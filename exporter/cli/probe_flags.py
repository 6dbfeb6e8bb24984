"""The probe's flags: ``fabricscope agent --probe ...`` (the probe service, off by default;
:func:`settings_from_args` turns them into :class:`~agent.config.ProbeSettings`), the
``fabricscope probe`` command's own parser (its body is :mod:`exporter.cli.probe`), the device
flags both share, and their argument types. Light to import: no probe machinery."""

from __future__ import annotations

import argparse
from pathlib import Path

from agent.config import DEFAULT_PROBE_PORT, PROBE_BACKENDS, PROBE_KINDS, ProbeSettings
from agent.core.errors import ConfigError
from agent.core.logsetup import LEVELS
from exporter.cli.argtypes import (
    Parser,
    byte_size,
    count,
    count_or_zero,
    duration,
    positive,
    positive_duration,
)


def parse_size(text: str) -> int:
    """A message size in every byte-size flag's syntax (:func:`byte_size`: ``65536``,
    ``64KiB``/``64Ki`` powers of 1024, ``64KB``/``64K`` powers of 1000), a multiple of 4."""
    from agent.probe.measure.records import ELEMENT_BYTES  # not at import: --help stays light

    value = byte_size(text)
    if value % ELEMENT_BYTES:
        raise argparse.ArgumentTypeError(f"size {text!r} is not a positive multiple of 4 bytes")
    return value


def parse_sizes(text: str) -> tuple[int, ...]:
    return tuple(parse_size(t) for t in text.split(",") if t.strip())


def parse_kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [k for k in kinds if k not in PROBE_KINDS]
    if not kinds or bad:
        raise argparse.ArgumentTypeError(
            f"collectives must be some of {', '.join(PROBE_KINDS)}, got {text!r}"
        )
    return kinds


def add_device_flags(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument(
        "--probe.backend",
        dest="probe_backend",
        choices=PROBE_BACKENDS,
        default="auto",
        help="auto: NCCL when NVML sees GPUs, else gloo on CPU (default: %(default)s)",
    )
    p.add_argument(
        "--probe.sizes",
        dest="probe_sizes",
        type=parse_sizes,
        default=(),
        metavar="LIST",
        help="message sizes, e.g. 1MiB,64MiB,256MiB (default: 8KiB,64KiB,256KiB,1MiB,16MiB,"
        "64MiB on GPUs, 64KiB,1MiB on CPU)",
    )
    p.add_argument(
        "--probe.timeout",
        dest="probe_timeout",
        type=positive_duration,
        default=60.0,
        metavar="DURATION",
        help="hard limit of one probe; its workers are killed after it (default: 1m)",
    )
    p.add_argument(
        "--probe.force",
        dest="probe_force",
        action=argparse.BooleanOptionalAction,
        help="also probe GPUs that run compute processes",
    )
    p.add_argument(
        "--probe.cpu-slots",
        dest="probe_cpu_slots",
        type=count,
        default=2,
        metavar="N",
        help="simulated devices under gloo (default: %(default)s)",
    )


def add_probe_parser(sub: argparse._SubParsersAction[Parser]) -> None:
    p = sub.add_parser(
        "probe",
        help="run one NCCL probe now (intra-node, against a peer, or a GPU-pair matrix)",
        description="Run one probe now and print it as nccl-tests does: intra-node over the "
        "local idle GPUs (2 gloo ranks on a CPU-only host), or against a peer's running agent "
        "(--peer), or every GPU pair with a peer (--matrix). `fabricscope probe plan --help` "
        "simulates the cross-node schedule.",
    )
    p.add_argument("--peer", default=None, metavar="HOST[:PORT]", help="a peer's agent")
    p.add_argument(
        "--secret-file",
        "--probe.secret-file",
        dest="secret_file",
        default=None,
        metavar="FILE",
        help="the shared probe secret (with --peer)",
    )
    p.add_argument(
        "--matrix",
        action=argparse.BooleanOptionalAction,
        help="sendrecv of every (local GPU, remote GPU) pair with --peer, at 256MiB on GPUs "
        "(1MiB on CPU) unless --probe.sizes; writes --csv and --png",
    )
    p.add_argument(
        "--collectives",
        type=parse_kinds,
        default=("all_reduce", "sendrecv"),
        metavar="LIST",
        help="what to measure (default: all_reduce,sendrecv; the matrix measures sendrecv)",
    )
    p.add_argument(
        "--peer-gpus",
        type=count,
        default=None,
        metavar="N",
        help="GPUs of the peer for --matrix (default: as many as here)",
    )
    p.add_argument(
        "--node-id",
        default=None,
        metavar="NAME",
        help="this host's name to the peer (default: the host name)",
    )
    p.add_argument("--iterations", type=count, default=20, help="timed iterations (20)")
    p.add_argument("--warmup", type=count_or_zero, default=5, help="untimed iterations first (5)")
    p.add_argument(
        "--csv", type=Path, default=Path("fabricscope-matrix.csv"), help="matrix CSV output"
    )
    p.add_argument(
        "--png", type=Path, default=Path("fabricscope-matrix.png"), help="matrix heatmap output"
    )
    add_device_flags(p)
    p.add_argument("--log.level", dest="log_level", choices=LEVELS, default="warning")
    p.add_argument("--log.format", dest="log_format", choices=("text", "json"), default="text")
    plan_sub = p.add_subparsers(dest="probe_command", required=False, metavar="{plan}")
    # prefix "+": every argument after `plan` goes to the plan's own parser, --help included
    plan = plan_sub.add_parser(
        "plan", add_help=False, prefix_chars="+", help="simulate the cross-node schedule"
    )
    plan.add_argument("plan_args", nargs=argparse.REMAINDER)


# --- the agent's flags -----------------------------------------------------------------------


def add_agent_flags(parser: argparse.ArgumentParser) -> None:
    """``fabricscope agent --probe ...``: the probe service (off by default)."""
    g = parser.add_argument_group("probe (NCCL bandwidth probes; off unless --probe)")
    g.add_argument(
        "--probe",
        dest="probe_enabled",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="run probes on a schedule: intra-node, and node pairs with --probe.peers-file "
        "(default: off; never with --once)",
    )
    g.add_argument(
        "--probe.peers-file",
        dest="probe_peers_file",
        default=None,
        metavar="FILE",
        help="hostfile of the nodes that probe each other, one per line (re-read on change)",
    )
    g.add_argument(
        "--probe.kubernetes-selector",
        dest="probe_kubernetes_selector",
        default=None,
        metavar="SELECTOR",
        help="probe the nodes of the agent pods matching this label selector (Kubernetes "
        "membership; instead of --probe.peers-file), e.g. app.kubernetes.io/name=fabricscope",
    )
    g.add_argument(
        "--probe.kubernetes-namespace",
        dest="probe_kubernetes_namespace",
        default=None,
        metavar="NS",
        help="namespace of those pods (default: this pod's service-account namespace)",
    )
    g.add_argument(
        "--probe.secret-file",
        dest="probe_secret_file",
        default=None,
        metavar="FILE",
        help="shared secret peers prove to each other (mode 0600, 16+ bytes); required "
        "with a peers file or a listen address",
    )
    g.add_argument(
        "--probe.listen-address",
        dest="probe_listen_address",
        default=None,
        metavar="HOST[:PORT]",
        help=f"this node's address for the probe rendezvous (default port {DEFAULT_PROBE_PORT})",
    )
    g.add_argument(
        "--probe.node-id",
        dest="probe_node_id",
        default=None,
        metavar="NAME",
        help="this node's name in the peers file (default: the listen host)",
    )
    g.add_argument(
        "--probe.round-seconds",
        dest="probe_round_seconds",
        type=positive_duration,
        default=300.0,
        metavar="DURATION",
        help="length of a pairing round (default: 5m; `fabricscope probe plan` assumes it too)",
    )
    g.add_argument(
        "--probe.intra-seconds",
        dest="probe_intra_seconds",
        type=duration,
        default=3600.0,
        metavar="DURATION",
        help="time between intra-node probes; 0: none (default: 1h)",
    )
    g.add_argument(
        "--probe.budget",
        dest="probe_budget",
        type=positive,
        default=0.01,
        metavar="FRACTION",
        help="fraction of the node's GPU time probes may use (default: %(default)s)",
    )
    g.add_argument(
        "--probe.pair-kinds",
        dest="probe_pair_kinds",
        type=parse_kinds,
        default=("sendrecv", "latency"),
        metavar="LIST",
        help="collectives of a node-pair probe (default: sendrecv,latency)",
    )
    g.add_argument(
        "--probe.max-age",
        dest="probe_max_age",
        type=positive_duration,
        default=None,
        metavar="DURATION",
        help="drop results older than this (default: 3 rounds; 3 intervals intra-node)",
    )
    add_device_flags(g)


def settings_from_args(ns: argparse.Namespace) -> ProbeSettings:
    """ProbeSettings from the agent's flags (the defaults for a command without them)."""
    if not hasattr(ns, "probe_enabled"):
        return ProbeSettings()
    try:
        return ProbeSettings(
            enabled=ns.probe_enabled,
            peers_file=ns.probe_peers_file,
            secret_file=ns.probe_secret_file,
            listen_address=ns.probe_listen_address,
            node_id=ns.probe_node_id,
            round_seconds=ns.probe_round_seconds,
            intra_seconds=ns.probe_intra_seconds,
            timeout_seconds=ns.probe_timeout,
            budget=ns.probe_budget,
            backend=ns.probe_backend,
            sizes=ns.probe_sizes,
            pair_kinds=ns.probe_pair_kinds,
            force=ns.probe_force,
            cpu_slots=ns.probe_cpu_slots,
            max_age_seconds=ns.probe_max_age,
            kubernetes_selector=ns.probe_kubernetes_selector,
            kubernetes_namespace=ns.probe_kubernetes_namespace,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
