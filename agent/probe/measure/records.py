"""The probe's two JSON contracts (pure, no torch): the spec a worker is started with and the
record it prints per measurement.

A worker prints exactly one :class:`ProbeRecord` per message size it was asked for, in the
order of the sizes, one JSON object per line on stdout (:func:`to_json`). A failed
measurement is a record too: ``error`` says why (``reason`` from :data:`REASONS`) and the
numbers are ``null``. :func:`parse_records` reads a worker's stdout and never raises: a
crashed worker can leave half a line, and each bad line is one message, not an exception.

``correct`` is ``true`` when the result was checked and matched, ``false`` when it was
checked and did not (``error.reason == "wrong_result"``: silent data corruption is a
finding), ``null`` when no result was checked (any other failure). For ``kind == "latency"``
``time_seconds`` is the latency (mean time of one 8-byte all_reduce) and the bandwidths are
``null``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeAlias

SCHEMA = "fabricscope-probe/1"
KINDS = ("all_reduce", "sendrecv", "latency")
#: how a worker times: ``host`` is nccl-tests' method (the host clock over a block of
#: back-to-back calls and their completion, blocks of the spec's iterations), ``graph``
#: captures a block of iterations in one CUDA graph and replays it between CUDA events (no
#: per-call launch overhead), ``eager`` calls the collective from Python in a loop between
#: CUDA events; ``auto`` is host over NCCL called directly, both graph and eager and the
#: faster over torch.distributed's NCCL calls, and the eager loop on CPU
TIMINGS = ("auto", "host", "graph", "eager")
BACKENDS = ("nccl", "gloo")
SPEC_BACKENDS = ("auto", *BACKENDS)
REASONS = (
    "timeout",
    "init_failure",
    "peer_unreachable",
    "auth_failure",
    "wrong_result",
    "gpu_busy",
    "crashed",
)

MiB = 1 << 20
GiB = 1 << 30
#: Sizes measured when a spec names none: seconds per probe on a GPU, not minutes, and under
#: 2 GiB of GPU memory per GPU. 8 KiB to 256 KiB cover the latency-bound range (tensor and
#: pipeline parallelism) and cost almost nothing (memory and time go with the largest
#: size). Measured on the H200 x2 machine (peak per GPU, whole process:
#: CUDA context 612 MiB, NCCL, torch, buffers): up to 1 GiB 4649 MiB, up to 256 MiB 2601 MiB,
#: up to 64 MiB 2105 MiB, and 1993 MiB with the worker's NCCL_BUFFSIZE default; busbw at
#: 64 MiB was within 1 % of nccl-tests there (all_reduce 267.1 vs 269.1 GB/s). Larger sizes
#: stay available through the spec (bounded by ``max_memory_bytes``).
KiB = 1 << 10
GPU_DEFAULT_SIZES = (8 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 16 * MiB, 64 * MiB)
#: gloo moves bytes through the CPU: small sizes keep a CPU probe (and CI) fast.
CPU_DEFAULT_SIZES = (64 << 10, 1 * MiB)
#: ``kind == "latency"`` measures an all_reduce of this many bytes (two float32).
LATENCY_SIZE_BYTES = 8
#: Bound on the device (or host) memory one probe's buffers take (two of the message size);
#: the CUDA context and NCCL's own buffers come on top (about 1 GiB more on an H200).
DEFAULT_MAX_MEMORY_BYTES = 1 * GiB
ELEMENT_BYTES = 4  # the probe moves float32
DEFAULT_WARMUP = 5  # nccl-tests' default warm-up and timed iterations
DEFAULT_ITERATIONS = 20
DEFAULT_TIMEOUT_SECONDS = 60.0
#: longest failure detail kept in a record
DETAIL_CHARS = 300

#: (host, CUDA device) of every rank, as the ranks exchange them
Ranks = tuple[tuple[str, int | None], ...]

JsonValue: TypeAlias = bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"] | None


class SpecError(ValueError):
    """A worker spec is malformed; the message names the field and what is wrong."""


class RecordError(ValueError):
    """A record line is malformed; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class ProbeError:
    """Why a measurement failed: ``reason`` from :data:`REASONS`, ``detail`` one line."""

    reason: str
    detail: str

    def __post_init__(self) -> None:
        if self.reason not in REASONS:
            raise RecordError(f"error reason {self.reason!r} is not one of {', '.join(REASONS)}")


@dataclass(frozen=True, slots=True)
class ProbeRecord:
    """One measurement (or one failed attempt) at one message size.

    ``time_seconds`` is the mean time of one iteration of the timed loop (averaged over
    ranks, as nccl-tests does), ``algbw``/``busbw`` are in bytes per second
    (:mod:`agent.probe.measure.formulas`). ``ranks`` is ``(host, CUDA device or None on CPU)`` per
    rank, empty when the process group never formed. ``peer``/``src``/``dst`` are the labels
    the spec carried, passed through unchanged.
    """

    kind: str
    backend: str
    world_size: int
    size_bytes: int
    iterations: int
    warmup: int
    time_seconds: float | None
    algbw_bytes_per_second: float | None
    busbw_bytes_per_second: float | None
    correct: bool | None
    error: ProbeError | None
    peer: str = ""
    src: str = ""
    dst: str = ""
    ranks: tuple[tuple[str, int | None], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise RecordError(f"kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.backend not in BACKENDS:
            raise RecordError(f"backend {self.backend!r} is not one of {', '.join(BACKENDS)}")
        if self.world_size < 1:
            raise RecordError(f"world_size {self.world_size} < 1")
        if self.size_bytes < 0 or self.iterations < 0 or self.warmup < 0:
            raise RecordError("size_bytes, iterations and warmup must be >= 0")
        for name, value in (
            ("time_seconds", self.time_seconds),
            ("algbw_bytes_per_second", self.algbw_bytes_per_second),
            ("busbw_bytes_per_second", self.busbw_bytes_per_second),
        ):
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise RecordError(f"{name} {value!r} is not a finite number >= 0")
        if (self.error is None) != (self.correct is True):
            raise RecordError("a record is correct exactly when it has no error")
        wrong = self.error is not None and self.error.reason == "wrong_result"
        if wrong != (self.correct is False):
            raise RecordError("correct is false exactly when the error reason is wrong_result")
        if self.error is None and self.time_seconds is None:
            raise RecordError("a successful record has a time")
        if self.ranks and len(self.ranks) != self.world_size:
            raise RecordError(f"{len(self.ranks)} ranks listed for world_size {self.world_size}")

    @property
    def reason(self) -> str | None:
        """The failure reason, or None for a good measurement."""
        return None if self.error is None else self.error.reason


def _as_json(rec: ProbeRecord) -> dict[str, JsonValue]:
    error: JsonValue = (
        None if rec.error is None else {"reason": rec.error.reason, "detail": rec.error.detail}
    )
    return {
        "schema": SCHEMA,
        "kind": rec.kind,
        "backend": rec.backend,
        "world_size": rec.world_size,
        "ranks": [[host, device] for host, device in rec.ranks],
        "peer": rec.peer,
        "src": rec.src,
        "dst": rec.dst,
        "size_bytes": rec.size_bytes,
        "iterations": rec.iterations,
        "warmup": rec.warmup,
        "time_seconds": rec.time_seconds,
        "algbw_bytes_per_second": rec.algbw_bytes_per_second,
        "busbw_bytes_per_second": rec.busbw_bytes_per_second,
        "correct": rec.correct,
        "error": error,
    }


def to_json(rec: ProbeRecord) -> str:
    """The record as one line of JSON (no newline in it; keys in schema order)."""
    return json.dumps(_as_json(rec), separators=(",", ":"), allow_nan=False, ensure_ascii=True)


def _reject_constant(name: str) -> JsonValue:
    raise RecordError(f"{name} is not a JSON number")


def _loads(text: str) -> JsonValue:
    value: JsonValue = json.loads(text, parse_constant=_reject_constant)
    return value


def _get(obj: Mapping[str, JsonValue], key: str) -> JsonValue:
    if key not in obj:
        raise RecordError(f"missing {key!r}")
    return obj[key]


def _str(obj: Mapping[str, JsonValue], key: str) -> str:
    value = _get(obj, key)
    if not isinstance(value, str):
        raise RecordError(f"{key} is {value!r}, not a string")
    return value


def _int(obj: Mapping[str, JsonValue], key: str) -> int:
    value = _get(obj, key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecordError(f"{key} is {value!r}, not an integer")
    return value


def _opt_float(obj: Mapping[str, JsonValue], key: str) -> float | None:
    value = _get(obj, key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RecordError(f"{key} is {value!r}, not a number")
    return float(value)


def _opt_bool(obj: Mapping[str, JsonValue], key: str) -> bool | None:
    value = _get(obj, key)
    if value is not None and not isinstance(value, bool):
        raise RecordError(f"{key} is {value!r}, not true/false/null")
    return value


def _ranks(value: JsonValue) -> tuple[tuple[str, int | None], ...]:
    if not isinstance(value, list):
        raise RecordError(f"ranks is {value!r}, not a list")
    out: list[tuple[str, int | None]] = []
    for item in value:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
            raise RecordError(f"ranks entry {item!r} is not [host, device]")
        device = item[1]
        if device is not None and (isinstance(device, bool) or not isinstance(device, int)):
            raise RecordError(f"ranks entry {item!r}: device is not an integer or null")
        out.append((item[0], device))
    return tuple(out)


def _error(value: JsonValue) -> ProbeError | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RecordError(f"error is {value!r}, not an object or null")
    return ProbeError(reason=_str(value, "reason"), detail=_str(value, "detail"))


def record_from_json(obj: JsonValue) -> ProbeRecord:
    """One decoded JSON value as a record; raises :class:`RecordError` when malformed."""
    if not isinstance(obj, dict):
        raise RecordError("not a JSON object")
    schema = obj.get("schema")
    if schema != SCHEMA:
        raise RecordError(f"schema is {schema!r}, not {SCHEMA!r}")
    return ProbeRecord(
        kind=_str(obj, "kind"),
        backend=_str(obj, "backend"),
        world_size=_int(obj, "world_size"),
        ranks=_ranks(_get(obj, "ranks")),
        peer=_str(obj, "peer"),
        src=_str(obj, "src"),
        dst=_str(obj, "dst"),
        size_bytes=_int(obj, "size_bytes"),
        iterations=_int(obj, "iterations"),
        warmup=_int(obj, "warmup"),
        time_seconds=_opt_float(obj, "time_seconds"),
        algbw_bytes_per_second=_opt_float(obj, "algbw_bytes_per_second"),
        busbw_bytes_per_second=_opt_float(obj, "busbw_bytes_per_second"),
        correct=_opt_bool(obj, "correct"),
        error=_error(_get(obj, "error")),
    )


def _excerpt(line: str, limit: int = 60) -> str:
    return repr(line if len(line) <= limit else line[:limit] + "...")


def parse_records(text: str) -> tuple[list[ProbeRecord], list[str]]:
    """Records from a worker's stdout, and one message per line that is not a valid record
    (``"line 3: not JSON: ..."``). Blank lines are ignored. Never raises."""
    records: list[ProbeRecord] = []
    problems: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        try:
            obj = _loads(line)
        except (ValueError, RecursionError) as exc:
            reason = str(exc) if isinstance(exc, RecordError) else "not JSON"
            problems.append(f"line {number}: {reason}: {_excerpt(line)}")
            continue
        try:
            records.append(record_from_json(obj))
        except RecordError as exc:
            problems.append(f"line {number}: {exc}")
    return records, problems


def detail_of(exc: BaseException) -> str:
    """One line for a record's ``detail``: the exception's type and first message line."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}".strip()
    return text if len(text) <= DETAIL_CHARS else text[: DETAIL_CHARS - 3] + "..."


# --- the worker spec -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What one worker process measures (``python -m agent.probe.measure.worker --spec JSON``).

    ``rank``/``world_size``/``master_addr``/``master_port``: the torch.distributed TCP
    rendezvous (rank 0 listens on ``master_addr:master_port``; port 0 is only for
    :func:`agent.probe.measure.launch.run_local`, which picks a free one). ``backend``: ``auto`` is
    NCCL when torch sees CUDA, gloo otherwise. ``devices``: CUDA device index per local
    rank; this worker uses ``devices[local_rank]`` (``local_rank`` defaults to ``rank``;
    no devices: the device index is the local rank). ``sizes``: message sizes in bytes,
    multiples of 4 (empty: the backend's defaults; ``latency`` defaults to 8 bytes).
    ``timeout_seconds`` bounds the rendezvous and each collective. ``timing``: one of
    :data:`TIMINGS`. ``max_seconds_per_size``: the cap on adaptive timing per size
    (:mod:`agent.probe.measure.timing`; 0: the fixed method, ``warmup`` then one block of
    ``iterations``; None: the backend's default, adaptive on GPUs, fixed on CPU).
    ``max_memory_bytes`` bounds what one measurement allocates (two buffers of the message
    size): a larger size gets an ``init_failure`` record and no allocation.
    ``peer``/``src``/``dst`` are labels copied into every record; ``host`` names this node
    in ``ranks`` (default: hostname).
    """

    kind: str
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    backend: str = "auto"
    local_rank: int | None = None
    devices: tuple[int, ...] = ()
    sizes: tuple[int, ...] = ()
    warmup: int = DEFAULT_WARMUP
    iterations: int = DEFAULT_ITERATIONS
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES
    timing: str = "auto"
    max_seconds_per_size: float | None = None
    peer: str = ""
    src: str = ""
    dst: str = ""
    host: str = ""

    def __post_init__(self) -> None:
        problems = spec_problems(self)
        if problems:
            raise SpecError("; ".join(problems))


def spec_problems(spec: WorkerSpec) -> list[str]:
    """Every reason the spec is unusable (empty when it is fine)."""
    out: list[str] = []
    if spec.kind not in KINDS:
        out.append(f"kind {spec.kind!r} is not one of {', '.join(KINDS)}")
    if spec.backend not in SPEC_BACKENDS:
        out.append(f"backend {spec.backend!r} is not one of {', '.join(SPEC_BACKENDS)}")
    if spec.world_size < 1:
        out.append(f"world_size {spec.world_size} < 1")
    if spec.kind == "sendrecv" and spec.world_size < 2 and spec.backend != "nccl":
        # NCCL sends to the same rank (a copy on one GPU: the one-GPU timing check of
        # bench/probe_accuracy.py); gloo has no send to itself
        out.append("sendrecv needs world_size >= 2 (1 only under backend nccl)")
    if not 0 <= spec.rank < max(spec.world_size, 1):
        out.append(f"rank {spec.rank} is not in [0, world_size)")
    if spec.local_rank is not None and spec.local_rank < 0:
        out.append(f"local_rank {spec.local_rank} < 0")
    if not spec.master_addr:
        out.append("master_addr is empty")
    if not 0 <= spec.master_port <= 65535:
        out.append(f"master_port {spec.master_port} is not in [0, 65535]")
    if any(d < 0 for d in spec.devices):
        out.append(f"devices {list(spec.devices)} has a negative index")
    if spec.devices and spec_local_rank(spec) >= len(spec.devices):
        out.append(f"local_rank {spec_local_rank(spec)} has no entry in devices")
    bad_sizes = [s for s in spec.sizes if s <= 0 or s % ELEMENT_BYTES]
    if bad_sizes:
        out.append(f"sizes {bad_sizes} are not positive multiples of {ELEMENT_BYTES} bytes")
    if spec.warmup < 0:
        out.append(f"warmup {spec.warmup} < 0")
    if spec.iterations < 1:
        out.append(f"iterations {spec.iterations} < 1")
    if not (math.isfinite(spec.timeout_seconds) and spec.timeout_seconds > 0):
        out.append(f"timeout_seconds {spec.timeout_seconds} is not > 0")
    if spec.max_memory_bytes <= 0:
        out.append(f"max_memory_bytes {spec.max_memory_bytes} is not > 0")
    if spec.timing not in TIMINGS:
        out.append(f"timing {spec.timing!r} is not one of {', '.join(TIMINGS)}")
    cap = spec.max_seconds_per_size
    if cap is not None and not (math.isfinite(cap) and cap >= 0):
        out.append(f"max_seconds_per_size {cap} is not a number >= 0")
    return out


def spec_local_rank(spec: WorkerSpec) -> int:
    """The rank of this worker among the workers on its node."""
    return spec.rank if spec.local_rank is None else spec.local_rank


def spec_device(spec: WorkerSpec) -> int:
    """The CUDA device index this worker uses when the backend is NCCL."""
    local = spec_local_rank(spec)
    return spec.devices[local] if spec.devices else local


def resolve_sizes(spec: WorkerSpec, backend: str) -> tuple[int, ...]:
    """The sizes a worker measures, in order: the spec's, else the kind's and backend's."""
    if spec.sizes:
        return spec.sizes
    if spec.kind == "latency":
        return (LATENCY_SIZE_BYTES,)
    return GPU_DEFAULT_SIZES if backend == "nccl" else CPU_DEFAULT_SIZES


def memory_needed_bytes(size_bytes: int) -> int:
    """Memory one measurement of ``size_bytes`` allocates: two buffers (send and receive for
    sendrecv; the all_reduce buffer plus the same again as headroom for the result check,
    which nccl-tests' out-of-place layout also spends)."""
    return 2 * size_bytes


def failure_record(
    spec: WorkerSpec, backend: str, size: int, reason: str, detail: str, *, ranks: Ranks = ()
) -> ProbeRecord:
    """The record of a size that was not measured."""
    return ProbeRecord(
        kind=spec.kind,
        backend=backend,
        world_size=spec.world_size,
        size_bytes=size,
        iterations=spec.iterations,
        warmup=spec.warmup,
        time_seconds=None,
        algbw_bytes_per_second=None,
        busbw_bytes_per_second=None,
        correct=None,
        error=ProbeError(reason, detail),
        peer=spec.peer,
        src=spec.src,
        dst=spec.dst,
        ranks=ranks,
    )


_SPEC_FIELDS = (
    "kind",
    "rank",
    "world_size",
    "master_addr",
    "master_port",
    "backend",
    "local_rank",
    "devices",
    "sizes",
    "warmup",
    "iterations",
    "timeout_seconds",
    "max_memory_bytes",
    "timing",
    "max_seconds_per_size",
    "peer",
    "src",
    "dst",
    "host",
)
_SPEC_REQUIRED = ("kind", "rank", "world_size", "master_addr", "master_port")


def spec_to_json(spec: WorkerSpec) -> str:
    """The spec as one line of JSON, as :func:`parse_spec` reads it."""
    obj: dict[str, JsonValue] = {
        "kind": spec.kind,
        "rank": spec.rank,
        "world_size": spec.world_size,
        "master_addr": spec.master_addr,
        "master_port": spec.master_port,
        "backend": spec.backend,
        "local_rank": spec.local_rank,
        "devices": list(spec.devices),
        "sizes": list(spec.sizes),
        "warmup": spec.warmup,
        "iterations": spec.iterations,
        "timeout_seconds": spec.timeout_seconds,
        "max_memory_bytes": spec.max_memory_bytes,
        "timing": spec.timing,
        "max_seconds_per_size": spec.max_seconds_per_size,
        "peer": spec.peer,
        "src": spec.src,
        "dst": spec.dst,
        "host": spec.host,
    }
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


def _spec_int(key: str, value: JsonValue) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{key} is {value!r}, not an integer")
    return value


def _spec_int_list(key: str, value: JsonValue) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise SpecError(f"{key} is {value!r}, not a list of integers")
    return tuple(_spec_int(f"{key} entry", v) for v in value)


def parse_spec(text: str) -> WorkerSpec:
    """A spec from its JSON text; raises :class:`SpecError` naming every problem found
    (unknown keys included, so a misspelt field is not silently a default)."""
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise SpecError(f"spec is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise SpecError("spec is not a JSON object")
    unknown = sorted(set(obj) - set(_SPEC_FIELDS))
    if unknown:
        raise SpecError(f"unknown spec field(s): {', '.join(unknown)}")
    missing = [k for k in _SPEC_REQUIRED if k not in obj]
    if missing:
        raise SpecError(f"missing spec field(s): {', '.join(missing)}")
    kind = obj["kind"]
    master_addr = obj["master_addr"]
    strings: dict[str, str] = {}
    for key in ("backend", "timing", "peer", "src", "dst", "host"):
        if key in obj:
            value = obj[key]
            if not isinstance(value, str):
                raise SpecError(f"{key} is {value!r}, not a string")
            strings[key] = value
    if not isinstance(kind, str) or not isinstance(master_addr, str):
        raise SpecError("kind and master_addr must be strings")
    timeout = obj.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise SpecError(f"timeout_seconds is {timeout!r}, not a number")
    local_rank = obj.get("local_rank")
    cap = obj.get("max_seconds_per_size")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int | float)):
        raise SpecError(f"max_seconds_per_size is {cap!r}, not a number or null")
    return WorkerSpec(
        kind=kind,
        rank=_spec_int("rank", obj["rank"]),
        world_size=_spec_int("world_size", obj["world_size"]),
        master_addr=master_addr,
        master_port=_spec_int("master_port", obj["master_port"]),
        backend=strings.get("backend", "auto"),
        local_rank=None if local_rank is None else _spec_int("local_rank", local_rank),
        devices=_spec_int_list("devices", obj.get("devices", [])),
        sizes=_spec_int_list("sizes", obj.get("sizes", [])),
        warmup=_spec_int("warmup", obj.get("warmup", DEFAULT_WARMUP)),
        iterations=_spec_int("iterations", obj.get("iterations", DEFAULT_ITERATIONS)),
        timeout_seconds=float(timeout),
        max_memory_bytes=_spec_int(
            "max_memory_bytes", obj.get("max_memory_bytes", DEFAULT_MAX_MEMORY_BYTES)
        ),
        timing=strings.get("timing", "auto"),
        max_seconds_per_size=None if cap is None else float(cap),
        peer=strings.get("peer", ""),
        src=strings.get("src", ""),
        dst=strings.get("dst", ""),
        host=strings.get("host", ""),
    )
