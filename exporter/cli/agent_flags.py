"""The flags every sampler-reading command shares (``--path.*``, ``--log.*``: agent, topo,
snapshot), the samplers' own flags (agent and snapshot), the agent's Kubernetes flags, and
:func:`config_from_args`, which turns the parsed flags into an
:class:`~agent.config.AgentConfig` (with :mod:`~exporter.cli.probe_flags`,
:mod:`~exporter.cli.ras_flags` and :mod:`~exporter.cli.throughput_flags`). Light to import:
no sampler machinery."""

from __future__ import annotations

import argparse
import os
import re
import shlex

from agent.config import (
    DEFAULT_CDI_DIR,
    DEFAULT_OFF,
    DEFAULT_POD_RESOURCES_SOCKET,
    DEFAULT_SAMPLING_INTERVAL,
    DEFAULT_SAMPLING_TIMEOUT,
    ETHTOOL_ROTATION,
    NVML_INTERVALS,
    PERFQUERY_MODES,
    SAMPLER_NAMES,
    AgentConfig,
    ExpectedRate,
    IbPeerSettings,
    InfinibandSettings,
    KubernetesSettings,
    NetdevSettings,
    NvmlSettings,
    Paths,
    Sampling,
    format_duration,
    parse_expected_rate,
)
from agent.core.errors import ConfigError
from agent.core.logsetup import LEVELS
from exporter.cli import probe_flags, ras_flags, throughput_flags
from exporter.cli.argtypes import byte_size_or_zero, count, count_or_zero, positive_duration
from exporter.metrics.spec import DETAILS


def _regex(value: str) -> re.Pattern[str]:
    try:
        return re.compile(value)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"invalid regular expression {value!r}: {exc}") from exc


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--path.sysfs",
        dest="path_sysfs",
        default="/sys",
        metavar="DIR",
        help="sysfs mount point (default: %(default)s)",
    )
    p.add_argument(
        "--path.procfs",
        dest="path_procfs",
        default="/proc",
        metavar="DIR",
        help="procfs mount point (default: %(default)s)",
    )
    p.add_argument("--log.level", dest="log_level", choices=LEVELS, default="info")
    p.add_argument("--log.format", dest="log_format", choices=("text", "json"), default="text")


def add_kubernetes(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Kubernetes pod attribution")
    g.add_argument(
        "--kubelet.pod-resources-socket",
        dest="pod_resources_socket",
        default=DEFAULT_POD_RESOURCES_SOCKET,
        metavar="PATH",
        help="the kubelet's pod-resources socket; empty: not used (default: %(default)s)",
    )
    g.add_argument(
        "--path.cdi",
        dest="path_cdi",
        default=DEFAULT_CDI_DIR,
        metavar="DIR",
        help="the directory of CDI specs, where DRA drivers describe the devices they "
        "prepared for ResourceClaims: GPUs, MIG slices and RDMA devices of claims are "
        "resolved through them; empty: by device name only (default: %(default)s)",
    )
    g.add_argument(
        "--kubernetes.node-name",
        dest="node_name",
        default=os.environ.get("NODE_NAME", ""),
        metavar="NAME",
        help="this node's name: turns on the /proc cgroup fallback with an API-server pod "
        "watch (default: $NODE_NAME; empty: off)",
    )


#: where the agent keeps the PMA counts that must outlive it (a hostPath in Kubernetes)
DEFAULT_STATE_FILE = "/var/lib/fabricscope/infiniband-counters.json"


def add_agent_state(p: argparse.ArgumentParser) -> None:
    """The serving agent's own flags about what it keeps across restarts."""
    p.add_argument(
        "--infiniband.state-file",
        dest="infiniband_state_file",
        default=DEFAULT_STATE_FILE,
        metavar="FILE",
        help="where the agent keeps what its PMA counters must carry across a restart (what "
        "--infiniband.reset-saturated has cleared, the counters read 64-bit): put it on a "
        "volume that outlives the container, or a restart shows as a counter reset; written "
        "only once a port has something to keep; empty: nothing kept (default: %(default)s)",
    )


def _expected_rate(text: str) -> ExpectedRate:
    try:
        return parse_expected_rate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_samplers(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("samplers")
    g.add_argument(
        "--infiniband.expected-rate",
        dest="infiniband_expected_rates",
        type=_expected_rate,
        action="append",
        default=[],
        metavar="DEVICE_GLOB[:PORT]=GBPS",
        help="the rate RDMA ports of this node class should run at, e.g. 'mlx5_*=400' "
        "(repeatable; first match wins): an ACTIVE port below it is a port_rate_degraded "
        "finding (comparison=expected), beside its own history and its peers",
    )
    g.add_argument(
        "--infiniband.perfquery",
        dest="infiniband_perfquery",
        choices=PERFQUERY_MODES,
        default="auto",
        help="also read InfiniBand ports' PMA counters with perfquery: 64-bit error counters "
        "and PortXmitWait where the HCA advertises them (PortCountersExtended), under the same "
        "names; auto: the ports whose /dev/infiniband/umad* the agent can open, on: every "
        "ACTIVE one (a command prefix opens it), off: sysfs only (default: %(default)s)",
    )
    g.add_argument(
        "--infiniband.command-prefix",
        dest="infiniband_command_prefix",
        default="",
        metavar="COMMAND",
        help="words put before every perfquery the infiniband sampler runs (split like a "
        "shell: 'sudo -n', a wrapper, 'ibsim-run' for the simulator; default: none)",
    )
    g.add_argument(
        "--infiniband.reset-saturated",
        dest="infiniband_reset_saturated",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="clear a narrow PMA counter (4-32 bits) near its maximum with perfquery and keep "
        "counting, as OpenSM's perfmgr does, where no 64-bit copy exists: the exported "
        "counter stays monotonic; every other reader of the port's counters sees them drop "
        "to 0 (default: off)",
    )
    g.add_argument(
        "--nvml.link-error-rotation",
        dest="nvml_link_error_rotation",
        type=count,
        default=18,
        metavar="PASSES",
        help="read each NVLink's replay/recovery/CRC-flit counters every PASSES passes "
        "(about 0.85 ms CPU per link read on an H200; default: %(default)s)",
    )
    g.add_argument(
        "--nvml.slow-error-rotation",
        dest="nvml_slow_error_rotation",
        type=count,
        default=72,
        metavar="PASSES",
        help="read each NVLink's crc_data/ecc_data counters every PASSES passes "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--collector.detail",
        dest="collector_detail",
        choices=DETAILS,
        default="default",
        help="how much to export: minimal (what the shipped alerts, dashboards and explain "
        "read), default (also diagnostic counters; almost-always-0 booleans and facts every "
        "link shares folded), full (every series, unfolded); docs/metrics.md says what each "
        "level drops (default: %(default)s)",
    )
    g.add_argument(
        "--agent.memory-limit",
        dest="memory_limit",
        type=byte_size_or_zero,
        default=0,
        metavar="BYTES",
        help="the container's memory limit, exported as fabricscope_agent_memory_limit_bytes "
        "for the alert that warns before the agent reaches it; each supervised child gets its "
        "share of it as a memory ceiling the kernel enforces (docs/install.md#security; the "
        "chart passes its limit; default: 0, none: each child gets a fixed ceiling)",
    )
    g.add_argument(
        "--nvml.isolate",
        dest="nvml_isolate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run NVML in a supervised child process: a crash or hang in the driver library "
        "costs a pass, counted, never /metrics (default: on; off only to debug)",
    )
    for name in SAMPLER_NAMES:
        on = name not in DEFAULT_OFF
        g.add_argument(
            f"--sampler.{name}",
            dest=f"sampler_{name}",
            action=argparse.BooleanOptionalAction,
            default=on,
            help=f"enable the {name} sampler (default: {'on' if on else 'off'})",
        )
    g.add_argument(
        "--ibpeer.command-prefix",
        dest="ibpeer_command_prefix",
        default="",
        metavar="COMMAND",
        help="words put before every smpquery/perfquery the ibpeer sampler runs (split like a "
        "shell: 'ibsim-run' for the simulator, a wrapper; default: none)",
    )
    g.add_argument(
        "--ibpeer.tool-timeout",
        dest="ibpeer_tool_timeout",
        type=positive_duration,
        default=2.0,
        metavar="DURATION",
        help="an smpquery/perfquery call running longer is killed and fails the ibpeer pass "
        "(default: 2s)",
    )
    g.add_argument(
        "--ibpeer.interval",
        dest="ibpeer_interval",
        type=positive_duration,
        default=60.0,
        metavar="DURATION",
        help="time between two ibpeer passes; each reads the switch ports' counters (default: 1m)",
    )
    g.add_argument(
        "--ibpeer.topology-interval",
        dest="ibpeer_topology_interval",
        type=positive_duration,
        default=300.0,
        metavar="DURATION",
        help="time between two reads of who is cabled where: each port's neighbour, the "
        "uplinks' far ends (default: 5m)",
    )
    g.add_argument(
        "--ibpeer.uplinks-max",
        dest="ibpeer_uplinks_max",
        type=count_or_zero,
        default=8,
        metavar="N",
        help="the most leaf-switch uplinks this node reads, its share of its leaves' uplinks "
        "(0: none; default: 8)",
    )
    g.add_argument(
        "--ibpeer.spine-links",
        dest="ibpeer_spine_links",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="also read the port tables of the spines those uplinks land on and export "
        "their cables to other switches: the core tier of a three-tier fabric, for "
        "`fabricscope topology` (default: off)",
    )
    g.add_argument(
        "--sampling.interval",
        dest="sampling_interval",
        type=positive_duration,
        default=DEFAULT_SAMPLING_INTERVAL,
        metavar="DURATION",
        help="time between two passes of each sampler: 15s, 1m30s, or seconds (default: 15s)",
    )
    g.add_argument(
        "--nvml.interval",
        dest="nvml_interval",
        type=positive_duration,
        default=None,
        metavar="DURATION",
        help="time between two NVML passes (default: twice --sampling.interval, 30s at its "
        "default)",
    )
    g.add_argument(
        "--sampling.timeout",
        dest="sampling_timeout",
        type=positive_duration,
        default=None,
        metavar="DURATION",
        help="a pass running longer is abandoned and counted (default: "
        f"{format_duration(DEFAULT_SAMPLING_TIMEOUT)}, or the interval when that is shorter)",
    )
    g.add_argument(
        "--netdev.include",
        dest="netdev_include",
        type=_regex,
        default=None,
        metavar="REGEX",
        help="also sample interfaces whose name matches (RDMA-associated "
        "interfaces are always sampled)",
    )
    g.add_argument(
        "--netdev.ethtool-include",
        dest="netdev_ethtool_include",
        type=_regex,
        default=None,
        metavar="REGEX",
        help="ethtool statistics to export (default: PFC/pause, discards, "
        "out-of-buffer, PHY errors; see docs/metrics.md)",
    )
    g.add_argument(
        "--netdev.ethtool",
        dest="netdev_ethtool",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="read ethtool statistics at all (default: on)",
    )
    g.add_argument(
        "--netdev.ethtool-rotation",
        dest="netdev_ethtool_rotation",
        type=count,
        default=ETHTOOL_ROTATION,
        metavar="PASSES",
        help="read each interface's ethtool statistics every PASSES passes, the last answer "
        "standing between (each read costs the driver its whole set; default: %(default)s)",
    )


def config_from_args(ns: argparse.Namespace) -> AgentConfig:
    enabled = frozenset(n for n in SAMPLER_NAMES if getattr(ns, f"sampler_{n}"))
    timeout = ns.sampling_timeout
    interval = ns.sampling_interval
    if getattr(ns, "once", False) or ns.command == "snapshot":
        # one pass, no next one (--sampling.interval is refused there): only the timeout
        timeout = DEFAULT_SAMPLING_TIMEOUT if timeout is None else timeout
        interval = max(interval, timeout)
    elif timeout is None:  # not given: follows the interval
        timeout = min(DEFAULT_SAMPLING_TIMEOUT, interval)
    try:
        sampling = Sampling(enabled, interval, timeout, getattr(ns, "memory_limit", 0) or None)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    return AgentConfig(
        paths=Paths(ns.path_sysfs, ns.path_procfs),
        sampling=sampling,
        netdev=NetdevSettings(
            ns.netdev_include,
            ns.netdev_ethtool_include,
            ns.netdev_ethtool,
            ns.netdev_ethtool_rotation,
        ),
        probe=probe_flags.settings_from_args(ns),
        ibpeer=_ibpeer_settings(ns),
        ras=ras_flags.settings_from_args(ns),
        nvml=NvmlSettings(
            ns.nvml_link_error_rotation,
            ns.nvml_slow_error_rotation,
            isolate=ns.nvml_isolate,
            interval_seconds=_nvml_interval(ns, interval),
        ),
        infiniband=_infiniband_settings(ns),
        throughput=throughput_flags.settings_from_args(ns),
        kubernetes=KubernetesSettings(
            pod_resources_socket=getattr(ns, "pod_resources_socket", None) or None,
            node_name=getattr(ns, "node_name", None) or None,
            cdi_dir=getattr(ns, "path_cdi", DEFAULT_CDI_DIR) or None,
        ),
    )


def _nvml_interval(ns: argparse.Namespace, interval: float) -> float:
    """``--nvml.interval``; not given, twice the sampling interval."""
    given: float | None = getattr(ns, "nvml_interval", None)
    return given if given is not None else NVML_INTERVALS * interval


def _infiniband_settings(ns: argparse.Namespace) -> InfinibandSettings:
    try:
        prefix = tuple(shlex.split(getattr(ns, "infiniband_command_prefix", "")))
    except ValueError as exc:
        raise ConfigError(f"--infiniband.command-prefix: {exc}") from exc
    try:
        return InfinibandSettings(
            tuple(getattr(ns, "infiniband_expected_rates", ())),
            perfquery=getattr(ns, "infiniband_perfquery", "auto"),
            command_prefix=prefix,
            reset_saturated=getattr(ns, "infiniband_reset_saturated", False),
            state_file=getattr(ns, "infiniband_state_file", None) or None,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def _ibpeer_settings(ns: argparse.Namespace) -> IbPeerSettings:
    try:
        prefix = tuple(shlex.split(getattr(ns, "ibpeer_command_prefix", "")))
    except ValueError as exc:
        raise ConfigError(f"--ibpeer.command-prefix: {exc}") from exc
    return IbPeerSettings(
        prefix,
        getattr(ns, "ibpeer_tool_timeout", 2.0),
        getattr(ns, "ibpeer_interval", 60.0),
        getattr(ns, "ibpeer_topology_interval", 300.0),
        getattr(ns, "ibpeer_uplinks_max", 8),
        # the neighbours' 64-bit data counters are exported at full detail only
        extended_counters=getattr(ns, "collector_detail", "default") == "full",
        spine_links=getattr(ns, "ibpeer_spine_links", False),
    )
