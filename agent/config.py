"""The agent's configuration: frozen dataclasses grouped by meaning, units in field docs.

Built once by the CLI from flags; passed to the parts that need it; never mutated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: A duration as Prometheus writes one (``15s``, ``1m30s``, ``6h``, ``2d``, ``500ms``: integer
#: amounts, units from the largest down, each at most once), or plain seconds (``15``, ``0.5``).
_DURATION = re.compile(
    r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$"
)
_DURATION_UNITS = (365 * 86400.0, 7 * 86400.0, 86400.0, 3600.0, 60.0, 1.0, 0.001)
_SECONDS = re.compile(r"^\d+(?:\.\d*)?$|^\.\d+$")


def parse_duration(text: str) -> float:
    """``"1m30s"`` -> ``90.0``; ``"15"`` -> ``15.0`` (plain seconds). One syntax for every
    duration flag of every command. ValueError for anything else (negative, empty, ``1.5h``,
    units out of order)."""
    t = text.strip()
    if _SECONDS.match(t):
        return float(t)
    m = _DURATION.match(t)
    if not t or m is None:
        raise ValueError(f"not a duration: {text!r} (e.g. 15s, 1m30s, 6h, 2d, or plain seconds)")
    return sum(int(g) * unit for g, unit in zip(m.groups(), _DURATION_UNITS, strict=True) if g)


#: A byte size: plain bytes (``16777216``), or an integer with a unit: SI (``k``/``K``, ``M``,
#: ``G``, ``T``, with or without ``B``: powers of 1000) or IEC (``Ki``, ``Mi``, ``Gi``, ``Ti``,
#: with or without ``B``: powers of 1024), as Kubernetes quantities and ``ls -h`` write them.
_BYTES = re.compile(r"^(\d{1,20})\s*(?:([kKMGT])(i?)B?|B)?$")
_BYTE_UNITS = {"k": 1, "K": 1, "M": 2, "G": 3, "T": 4}


def parse_bytes(text: str) -> int:
    """``"16MiB"``, ``"16Mi"`` -> ``16777216``; ``"16M"``, ``"16MB"`` -> ``16000000``;
    ``"4096"`` -> ``4096``. One syntax for every byte-size flag of every command. ValueError
    for anything else (negative, fractions, ``16 MiBs``, empty)."""
    m = _BYTES.match(text.strip())
    if m is None:
        raise ValueError(
            f"not a byte size: {text!r} (e.g. 16MiB, 16Mi, 16M, 512KiB, or plain bytes)"
        )
    number, unit, iec = m.groups()
    if unit is None:
        return int(number)
    scale: int = (1024 if iec else 1000) ** _BYTE_UNITS[unit]
    return int(number) * scale


def format_bytes(n: int) -> str:
    """``16777216`` -> ``"16MiB"``; ``16000000`` -> ``"16MB"``; ``1001`` -> ``"1001B"``: how
    a byte size is shown back (the unit, IEC or SI, that writes it shortest)."""
    best = f"{n}B"
    units = (
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
        (10**12, "TB"),
        (10**9, "GB"),
        (10**6, "MB"),
        (10**3, "kB"),
    )
    for unit, name in units:
        if n and n % unit == 0:
            best = min(best, f"{n // unit}{name}", key=len)
    return best


def format_duration(seconds: float) -> str:
    """``90.0`` -> ``"1m30s"``; ``0.5`` -> ``"500ms"``: how a duration is shown back."""
    if seconds <= 0:
        return "0s"
    ms = round(seconds * 1000)
    out = ""
    for unit, name in ((86400000, "d"), (3600000, "h"), (60000, "m"), (1000, "s"), (1, "ms")):
        if ms >= unit:
            out += f"{ms // unit}{name}"
            ms %= unit
    return out


#: The sampling timeout when ``--sampling.timeout`` is not given: this, or the interval when
#: that is shorter (a pass must end before the next one starts).
DEFAULT_SAMPLING_TIMEOUT = 10.0
#: the sampling interval when ``--sampling.interval`` is not given
DEFAULT_SAMPLING_INTERVAL = 15.0

#: Every sampler, in the order they are listed in ``--help``.
SAMPLER_NAMES = (
    "attribution",
    "ibpeer",
    "infiniband",
    "netdev",
    "nvml",
    "pci",
    "ras",
    "throughput",
    "workload",
)
#: Samplers that run only when asked for (none today: ibpeer, which needs infiniband-diags and
#: the umad device, has no data without them and runs by default)
DEFAULT_OFF: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Paths:
    """Roots every read hangs off (``--path.sysfs``, ``--path.procfs``)."""

    sysfs: str = "/sys"
    procfs: str = "/proc"


@dataclass(frozen=True, slots=True)
class Sampling:
    """How often and how long samplers run.

    ``interval_seconds``: time between the starts of two passes of one sampler.
    ``timeout_seconds``: a pass running longer is abandoned and counted as a timeout.
    ``memory_limit_bytes``: the container's memory limit (``--agent.memory-limit``; None:
    unknown), of which each supervised child gets its share as a memory ceiling
    (:mod:`agent.core.ceiling`).
    """

    enabled: frozenset[str] = frozenset(SAMPLER_NAMES) - DEFAULT_OFF
    interval_seconds: float = DEFAULT_SAMPLING_INTERVAL
    timeout_seconds: float = 10.0
    memory_limit_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.interval_seconds <= 0:
            raise ValueError("sampling interval must be positive")
        if not self.timeout_seconds > 0:
            raise ValueError("sampling timeout must be positive")
        if self.timeout_seconds > self.interval_seconds:
            raise ValueError(
                f"--sampling.timeout {format_duration(self.timeout_seconds)} is longer than "
                f"--sampling.interval {format_duration(self.interval_seconds)}: a pass must "
                "end before the next one starts"
            )
        unknown = self.enabled - set(SAMPLER_NAMES)
        if unknown:
            raise ValueError(f"unknown samplers: {', '.join(sorted(unknown))}")


#: the netdev sampler reads each interface's ethtool statistics every this many passes
ETHTOOL_ROTATION = 2


@dataclass(frozen=True, slots=True)
class NetdevSettings:
    """Which interfaces and ethtool statistics the netdev sampler exports.

    ``include``: regex of extra interface names (RDMA-associated ones are always included).
    ``ethtool_include``: regex of ethtool statistic names; None means the sampler's default.
    ``ethtool``: read ethtool statistics at all.
    ``ethtool_rotation``: read each interface's ethtool statistics every this many passes
    (three ioctls, each costing the driver its whole set of statistics; the last answer
    stands between).
    """

    include: re.Pattern[str] | None = None
    ethtool_include: re.Pattern[str] | None = None
    ethtool: bool = True
    ethtool_rotation: int = ETHTOOL_ROTATION

    def __post_init__(self) -> None:
        if self.ethtool_rotation < 1:
            raise ValueError("the ethtool rotation must be >= 1")


@dataclass(frozen=True, slots=True)
class ExpectedRate:
    """One ``--infiniband.expected-rate DEVICE_GLOB[:PORT]=RATE``: the rate (bytes/second)
    the RDMA ports whose device name matches the glob (``mlx5_*``; and port, when given)
    should run at on this class of node."""

    device: str
    port: int | None
    bytes_per_second: int


_EXPECTED_RATE = re.compile(
    r"^(?P<device>[A-Za-z0-9_*?\[\]!.-]{1,64})(?::(?P<port>[0-9]{1,3}))?="
    r"(?P<gbps>[0-9]{1,5}(?:\.[0-9]{1,3})?)\s*(?:G|Gb/s|Gbps|Gb/sec)?$"
)


def parse_expected_rate(text: str) -> ExpectedRate:
    """``"mlx5_*=400"`` or ``"mlx5_[0-9]:1=400Gb/s"`` -> an :class:`ExpectedRate` (the rate in
    Gb/s, as ``ibstat`` prints it). Raises ValueError with the form expected."""
    m = _EXPECTED_RATE.match(text.strip())
    if m is None:
        raise ValueError(
            f"expected DEVICE_GLOB[:PORT]=RATE_GBPS like mlx5_*=400, got {text.strip()[:60]!r}"
        )
    gbps_text = m.group("gbps")
    whole, _, frac = gbps_text.partition(".")
    bps = int(whole) * 125_000_000 + int((frac + "000")[:3]) * 125_000
    if bps <= 0:
        raise ValueError(
            f"DEVICE_GLOB[:PORT]=RATE_GBPS needs a rate above 0 Gb/s, got {text.strip()[:60]!r}"
        )
    port = m.group("port")
    return ExpectedRate(m.group("device"), int(port) if port is not None else None, bps)


#: ``--infiniband.perfquery``: which InfiniBand ports' PMA counters are read with perfquery
PERFQUERY_MODES = ("auto", "on", "off")


@dataclass(frozen=True, slots=True)
class InfinibandSettings:
    """The infiniband sampler. ``expected_rates``: per-node-class expectations of port
    rates, first match wins (``--infiniband.expected-rate``; empty: no such comparison).

    ``perfquery``: read the InfiniBand ports' PMA counters with perfquery as well as sysfs
    (64-bit where the HCA keeps them; see ``agent/infiniband/pma.py``): ``auto``, the ports
    whose ``/dev/infiniband/umad*`` device the agent can open; ``on``, every ACTIVE one (a
    command prefix such as ``sudo -n`` or the simulator's ``ibsim-run`` opens it); ``off``.
    ``command_prefix``: argv put before perfquery. ``reset_saturated``: clear narrow PMA
    counters near their maximum and keep counting (what OpenSM's perfmgr does; every other
    reader of those counters sees them drop to 0).
    """

    expected_rates: tuple[ExpectedRate, ...] = ()
    perfquery: str = "auto"
    command_prefix: tuple[str, ...] = ()
    reset_saturated: bool = False
    #: where the PMA step keeps what must outlive the agent (``agent/infiniband/memory.py``;
    #: ``--infiniband.state-file``); ``None``: nothing kept (one-shot commands)
    state_file: str | None = None

    def __post_init__(self) -> None:
        if self.perfquery not in PERFQUERY_MODES:
            raise ValueError(f"--infiniband.perfquery must be one of {', '.join(PERFQUERY_MODES)}")
        if self.reset_saturated and self.perfquery == "off":
            raise ValueError(
                "--infiniband.reset-saturated clears counters with perfquery: it needs "
                "--infiniband.perfquery=auto or on"
            )


#: The probe's rendezvous port when ``--probe.listen-address`` names none (the metrics port
#: 10118 plus one).
DEFAULT_PROBE_PORT = 10119
PROBE_BACKENDS = ("auto", "nccl", "gloo")
PROBE_KINDS = ("all_reduce", "sendrecv", "latency")


@dataclass(frozen=True, slots=True)
class ProbeSettings:
    """The NCCL probe (``--probe.*``; docs in ``agent/probe/run/service.py``). Off unless enabled.

    ``peers_file``: hostfile of the nodes that probe each other (None: intra-node probes only).
    ``secret_file``: the shared secret peers prove (required with a peers file or a listen
    address). ``listen_address``: ``HOST[:PORT]`` the rendezvous binds, this node's address
    (port default :data:`DEFAULT_PROBE_PORT`); None: no rendezvous (no cross-node probes).
    ``node_id``: this node's name in the peers file (default: the listen host).
    ``round_seconds``: length of a pairing round. ``intra_seconds``: time between intra-node
    probes (0: none). ``timeout_seconds``: hard limit of one probe (its workers are killed).
    ``budget``: fraction of the node's GPU time probes may use (0 < budget <= 1).
    ``budget_window_seconds``: the span the budget may be spent in at once (a burst).
    ``backend``: auto (NCCL when NVML sees GPUs, else gloo), nccl or gloo. ``sizes``: message
    sizes in bytes (empty: the backend's defaults). ``pair_kinds``: collectives of a node-pair
    probe, each its own worker run. ``force``: probe GPUs that run compute processes too.
    ``cpu_slots``: simulated devices under gloo. ``max_age_seconds``: results older than this
    are dropped (None: 3 rounds for node pairs, 3 intra intervals for intra-node results).
    ``max_memory_bytes``: memory one measurement may allocate (two buffers of a size).
    ``kubernetes_selector``: label selector of the agent pods that probe each other, the
    Kubernetes membership source (exclusive with ``peers_file``); ``kubernetes_namespace``:
    their namespace (default: the service account's).
    """

    enabled: bool = False
    peers_file: str | None = None
    secret_file: str | None = None
    listen_address: str | None = None
    node_id: str | None = None
    round_seconds: float = 300.0
    intra_seconds: float = 3600.0
    timeout_seconds: float = 60.0
    budget: float = 0.01
    budget_window_seconds: float = 3600.0
    backend: str = "auto"
    sizes: tuple[int, ...] = ()
    pair_kinds: tuple[str, ...] = ("sendrecv", "latency")
    force: bool = False
    cpu_slots: int = 2
    max_age_seconds: float | None = None
    max_memory_bytes: int = 1 << 30  # worker buffers; measured peak on an H200 in records.py
    iterations: int = 20
    warmup: int = 5
    kubernetes_selector: str | None = None
    kubernetes_namespace: str | None = None

    def __post_init__(self) -> None:
        problems = []
        if not self.round_seconds > 0:
            problems.append("round seconds must be positive")
        if not self.intra_seconds >= 0:
            problems.append("intra-node interval must be >= 0 (0: off)")
        if not self.timeout_seconds > 0:
            problems.append("probe timeout must be positive")
        if not 0 < self.budget <= 1:
            problems.append("probe budget must be a fraction in (0, 1]")
        if not self.budget_window_seconds > 0:
            problems.append("probe budget window must be positive")
        if self.backend not in PROBE_BACKENDS:
            problems.append(f"probe backend must be one of {', '.join(PROBE_BACKENDS)}")
        if any(s <= 0 or s % 4 for s in self.sizes):
            problems.append("probe sizes must be positive multiples of 4 bytes")
        if not self.pair_kinds or any(k not in PROBE_KINDS for k in self.pair_kinds):
            problems.append(f"probe pair kinds must be some of {', '.join(PROBE_KINDS)}")
        if self.cpu_slots < 1:
            problems.append("probe CPU slots must be >= 1")
        if self.max_age_seconds is not None and not self.max_age_seconds > 0:
            problems.append("probe max age must be positive")
        if self.max_memory_bytes <= 0 or self.iterations < 1 or self.warmup < 0:
            problems.append("probe memory bound and iterations must be positive")
        if (self.peers_file or self.listen_address) and not self.secret_file:
            problems.append(
                "--probe.secret-file is required with --probe.peers-file or "
                "--probe.listen-address (peers must authenticate)"
            )
        if self.peers_file and not self.listen_address:
            problems.append(
                "--probe.listen-address HOST[:PORT] is required with --probe.peers-file "
                "(this node's address, where peers reach its probe rendezvous)"
            )
        if self.kubernetes_selector:
            if self.peers_file:
                problems.append(
                    "--probe.kubernetes-selector and --probe.peers-file are two membership "
                    "sources: give one"
                )
            if not self.listen_address or not self.secret_file:
                problems.append(
                    "--probe.kubernetes-selector needs --probe.listen-address (this node's "
                    "address) and --probe.secret-file"
                )
        if problems:
            raise ValueError("; ".join(problems))


#: the NVML sampler's interval when ``--nvml.interval`` is not given, in sampling intervals:
#: 30 s at the default 15 s, the chart's scrape interval and dcgm-exporter's default
NVML_INTERVALS = 2


@dataclass(frozen=True, slots=True)
class NvmlSettings:
    """How often the NVML sampler runs, and re-reads NVLink error counters, in passes.

    ``interval_seconds``: time between two NVML passes (default twice the sampling interval,
    30 s: the chart's scrape interval; a pass every 15 s costs twice the CPU, most of the
    agent's at 8 GPUs, for values half of which no scrape would see).

    Reading a link's counters costs about 0.85 ms of CPU per link on an H200 (the driver asks
    the GPU's firmware), so each pass reads a rotating share: replay/recovery/CRC-flit of the
    links with ``link % link_error_rotation == pass % link_error_rotation``, crc_data/ecc_data
    likewise with ``slow_error_rotation``. Larger values: less CPU, older counters (at the
    default 30 s NVML interval: 18 -> 9 min, 72 -> 36 min). Measured on 2 H200s: 18/72 cost
    4.7 ms per steady pass (18.8 ms extrapolated to 8 GPUs), 6/36 cost 12.5 ms (50 ms).
    """

    link_error_rotation: int = 18
    slow_error_rotation: int = 72
    #: run the live NVML sampler in a supervised child process (agent/core/isolation.py), so a
    #: crash or hang in the driver library costs a pass, not the agent
    isolate: bool = True
    interval_seconds: float = NVML_INTERVALS * DEFAULT_SAMPLING_INTERVAL

    def __post_init__(self) -> None:
        if self.link_error_rotation < 1 or self.slow_error_rotation < 1:
            raise ValueError("NVML error-counter rotations must be >= 1")
        if not self.interval_seconds > 0:
            raise ValueError("NVML interval must be positive")


DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_CDI_DIR = "/var/run/cdi"


@dataclass(frozen=True, slots=True)
class KubernetesSettings:
    """Pod attribution (``attribution`` sampler) on a Kubernetes node.

    ``pod_resources_socket``: the kubelet's pod-resources socket (None: not used).
    ``node_name``: this node's name; turns on the cgroup fallback and its API-server pod watch
    (None: off; the flag defaults to ``$NODE_NAME``, which the DaemonSet sets).
    ``cdi_dir``: the directory of CDI specs, where DRA drivers describe the devices they
    prepared for ResourceClaims (None: claims are resolved by device name only).
    """

    pod_resources_socket: str | None = DEFAULT_POD_RESOURCES_SOCKET
    node_name: str | None = None
    cdi_dir: str | None = DEFAULT_CDI_DIR


DEFAULT_POD_LOGS = "/var/log/pods"


@dataclass(frozen=True, slots=True)
class ThroughputFile:
    """One ``--throughput.file PATH[=JOB]``: a path or glob, and the job name its series
    carry (None: ``--throughput.job``, else the file's stem)."""

    pattern: str
    job: str | None = None


@dataclass(frozen=True, slots=True)
class ThroughputSettings:
    """The throughput sampler (``agent/throughput``): which logs it reads.

    ``files``: plain log files (``--throughput.file``). ``job``: job name for files given
    without ``=JOB``. ``pod_logs``: the kubelet's pod log directory (``--path.pod-logs``).
    ``pods``: ``gpu`` (pods holding a GPU of this node) or ``all``; ``namespaces`` and
    ``selector`` (a label selector) narrow it. ``max_line_bytes``: longest line read; longer
    ones are skipped and counted. ``initial_bytes``: how far before the end of an already
    written log reading starts. ``isolate``: read and parse logs in a supervised child
    process (:mod:`agent.core.isolation`), never in the process serving ``/metrics``.
    ``stream_cpu_seconds``: CPU time one stream may take in one pass; past it the stream's
    rest waits for the next pass, counted (not with ``--once``). ``max_open_files``: log
    files open at once, within a pass too; the least recently read beyond it is closed and
    reopened at its offset.
    """

    files: tuple[ThroughputFile, ...] = ()
    job: str | None = None
    pod_logs: str = DEFAULT_POD_LOGS
    pods: str = "gpu"
    namespaces: tuple[str, ...] = ()
    selector: str | None = None
    max_line_bytes: int = 1 << 20
    initial_bytes: int = 1 << 20
    isolate: bool = True
    stream_cpu_seconds: float = 0.5
    max_open_files: int = 256

    def __post_init__(self) -> None:
        if self.stream_cpu_seconds <= 0 or self.max_open_files < 1:
            raise ValueError("throughput stream CPU budget and open files must be positive")
        if self.pods not in ("gpu", "all"):
            raise ValueError("throughput pods must be gpu or all")
        if self.max_line_bytes < 1024 or self.initial_bytes < 0:
            raise ValueError("throughput max line bytes must be >= 1024, initial bytes >= 0")


@dataclass(frozen=True, slots=True)
class IbPeerSettings:
    """The ``ibpeer`` sampler (``agent/ibpeer``): how it runs infiniband-diags.

    ``command_prefix``: argv put in front of every tool (``ibsim-run`` for the simulator, a
    wrapper, ``sudo -n``); empty: the tools are run directly. ``tool_timeout_seconds``: one
    tool call running longer is killed with its process group and fails the pass.
    ``interval_seconds``: time between two passes (the switch ports' counters are read every
    pass). ``topology_interval_seconds``: time between two reads of who is cabled where (each
    local port's neighbour, the uplinks' far ends). ``uplinks_max``: the most leaf uplinks
    this node reads (its share of its leaves' uplinks, see ``agent/ibpeer/fabric.py``; 0:
    none). ``extended_counters``: read PortCountersExtended too (the 64-bit data and packet
    counters only ``--collector.detail=full`` exports): a second query per switch.
    ``spine_links``: read the port tables of the spines the uplinks this node reads land on,
    and export their cables to other switches (the core tier, for the fabric map).
    """

    command_prefix: tuple[str, ...] = ()
    tool_timeout_seconds: float = 2.0
    interval_seconds: float = 60.0
    topology_interval_seconds: float = 300.0
    uplinks_max: int = 8
    extended_counters: bool = False
    spine_links: bool = False

    def __post_init__(self) -> None:
        if not self.tool_timeout_seconds > 0:
            raise ValueError("ibpeer tool timeout must be positive")
        if not self.interval_seconds > 0 or not self.topology_interval_seconds > 0:
            raise ValueError("ibpeer intervals must be positive")
        if self.uplinks_max < 0:
            raise ValueError("ibpeer uplinks-max must be >= 0")


RAS_LEADER_POLICIES = ("rank0", "always")
#: where NCCL's RAS service answers unless NCCL_RAS_ADDR says otherwise (localhost)
RAS_DEFAULT_PORT = 28028
#: a job name given with ``--ras.endpoint ...=JOB`` (the job_name label)
_JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def parse_hostport(text: str, default_port: int = RAS_DEFAULT_PORT) -> tuple[str, int]:
    """``"10.0.0.1:28028"``, ``"[fd00::1]:28028"``, ``"localhost:28028"``, ``"10.0.0.1"`` ->
    (host, port), the host as written (an address or a name), as ``NCCL_RAS_ADDR`` is
    written. ValueError otherwise."""
    t = text.strip()
    if not t or len(t) > 300:
        raise ValueError("an address is empty or too long")
    if t.startswith("["):
        host, sep, rest = t[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"bad address {t[:60]!r}")
        port_text = rest[1:]
    elif t.count(":") == 1:
        host, _, port_text = t.partition(":")
    else:
        host, port_text = t, ""
    if port_text and not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5):
        raise ValueError(f"bad port in {t[:60]!r}")
    port = int(port_text) if port_text else default_port
    if not host or not 0 < port < 65536:
        raise ValueError(f"bad address {t[:60]!r}")
    return host, port


def parse_ras_endpoint(text: str) -> RasEndpointFlag:
    """``--ras.endpoint HOST:PORT[=JOB]``: an IP address (never a name: nothing is
    resolved), a port, an optional job name. ValueError with the form expected."""
    import ipaddress

    where, sep, job = text.partition("=")
    host, port = parse_hostport(where)
    try:
        host = str(ipaddress.ip_address(host))
    except ValueError:
        raise ValueError(
            f"expected IP:PORT[=JOB] like 127.0.0.1:28028=train, got {text.strip()[:60]!r} "
            "(an address, not a name: nothing is resolved)"
        ) from None
    job = job.strip()
    if sep and not _JOB_NAME.match(job):
        raise ValueError(f"job name {job[:60]!r}: letters, digits, '_', '.', '-' (63 at most)")
    return RasEndpointFlag(host, port, job)


@dataclass(frozen=True, slots=True)
class RasEndpointFlag:
    """One ``--ras.endpoint HOST:PORT[=JOB]``: a RAS service asked every pass."""

    host: str
    port: int
    job_name: str = ""


@dataclass(frozen=True, slots=True)
class RasSettings:
    """The ``ras`` sampler (``agent/ras``): NCCL's RAS service of the jobs on this node.

    ``interval_seconds``: time between two queries of one job (each is a job-wide gather).
    ``deadline_seconds``: one query's whole time (connect, handshake, NCCL's gather, the
    answer); ``ras_timeout_seconds``: what NCCL is told each leg of its gather may take
    (its ``TIMEOUT`` command; its whole gather takes up to this plus
    5 s x ``NCCL_RAS_TIMEOUT_FACTOR``). ``max_answer_bytes``: the largest answer read.
    ``leader``: ``rank0`` (the node of the job's rank-0 process asks) or ``always`` (this
    node asks every job it has a process of). ``endpoints``: asked whatever the rest says.
    ``lag_answers``: answers in a row a rank must be behind to be named lagging;
    ``max_named_ranks``: ranks named per job. ``isolate``: query and parse in a supervised
    child process (a job's answer is untrusted input).
    """

    interval_seconds: float = 30.0
    deadline_seconds: float = 15.0
    ras_timeout_seconds: int = 5
    max_answer_bytes: int = 16 << 20
    leader: str = "rank0"
    endpoints: tuple[RasEndpointFlag, ...] = ()
    lag_answers: int = 4
    max_named_ranks: int = 8
    isolate: bool = True

    def __post_init__(self) -> None:
        problems = []
        if self.leader not in RAS_LEADER_POLICIES:
            problems.append(f"--ras.leader must be one of {', '.join(RAS_LEADER_POLICIES)}")
        if not 0 < self.deadline_seconds < self.interval_seconds:
            problems.append(
                f"--ras.timeout {format_duration(self.deadline_seconds)} must be positive and "
                f"shorter than --ras.interval {format_duration(self.interval_seconds)}"
            )
        if not 1 <= self.ras_timeout_seconds < self.deadline_seconds:
            problems.append(
                "--ras.gather-timeout must be at least 1s and shorter than --ras.timeout"
            )
        if self.max_answer_bytes < 4096:
            problems.append("--ras.max-answer-bytes must be at least 4096")
        if self.lag_answers < 1 or self.max_named_ranks < 0:
            problems.append("--ras.lag-answers must be >= 1, --ras.max-named-ranks >= 0")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True, slots=True)
class AgentConfig:
    paths: Paths = field(default_factory=Paths)
    sampling: Sampling = field(default_factory=Sampling)
    netdev: NetdevSettings = field(default_factory=NetdevSettings)
    probe: ProbeSettings = field(default_factory=ProbeSettings)
    kubernetes: KubernetesSettings = field(default_factory=KubernetesSettings)
    nvml: NvmlSettings = field(default_factory=NvmlSettings)
    infiniband: InfinibandSettings = field(default_factory=InfinibandSettings)
    throughput: ThroughputSettings = field(default_factory=ThroughputSettings)
    ibpeer: IbPeerSettings = field(default_factory=IbPeerSettings)
    ras: RasSettings = field(default_factory=RasSettings)
