"""A RAS ``STATUS`` answer in JSON (``SET FORMAT json``, NCCL 2.28.7 and later) as frozen
records. Pure: bytes in, :class:`RasAnswer` out, or :class:`MalformedAnswer` with a
one-line reason.

The answer is NCCL's raw dump of what its RAS threads gathered from every process of the
job (NCCL leaves the interpretation to the client)::

    {"nccl_version": "2.28.9", "cuda_runtime_version": ..., "cuda_driver_version": ...,
     "timestamp": "YYYY-MM-DD HH:MM:SS", "communicators_count": N,
     "communicators": [{"hash": "0x..", "secondary_hash": "0x..:0x..", "size": S,
                        "ranks_count": R, "missing_ranks_count": M,
                        "ranks": [{"rank", "host", "pid", "cuda_dev", "nvml_dev",
                                   "status": {"init_state", "async_error",
                                              "finalize_called", "destroy_flag",
                                              "abort_flag"},
                                   "collective_counts": {"Broadcast": n, ...}}],
                        "missing_ranks": [{"rank", "host", "pid", "cuda_dev", "nvml_dev",
                                           "status": {"unresponsive",
                                                      "considered_dead"}}]}],
     "ras": {"collection_time_sec": t, "timeouts_count": k}}

``ranks`` are the ranks whose process answered this gather; ``missing_ranks`` the others:
``unresponsive`` when their process sent no data (stopped, hung, unreachable),
``considered_dead`` once RAS has failed to reach the process for 60 s x
``NCCL_RAS_TIMEOUT_FACTOR``. A missing rank that is neither was reachable but no longer (or
not yet) a member of that communicator (init or teardown). ``host`` is the IP address of
the process's bootstrap interface (``"unknown"`` and pid -1 when RAS could not tell);
``pid`` is as the process sees itself (its own PID namespace); ``nvml_dev`` is the GPU's
NVML index, unique on a node (``cuda_dev`` depends on ``CUDA_VISIBLE_DEVICES``).
``collective_counts`` are the collective operations each rank has *launched* (enqueued by
the host) per collective type (NCCL 2.28 counts Broadcast, Reduce, AllGather,
ReduceScatter and AllReduce; sends and receives are not counted). ``init_state`` and
``async_error`` are ``ncclResult_t`` values: 0 success, 7 in progress, anything else an
error (:data:`NCCL_RESULTS`).

A known defect: NCCL 2.28.7-2.28.9 (at least) write no comma between a missing rank's
``"nvml_dev": N`` and its ``"status"`` (recorded from a real 2.28.9 job: every answer with a
missing rank is invalid JSON, healthy ones are valid). An answer JSON refuses is repaired
of that one defect, and only that (one linear pass of a pattern with bounded repetition,
nothing else rewritten), then parsed again; :attr:`RasAnswer.repaired` says so.

Bounds: the caller caps the bytes (:mod:`agent.ras.wire`) and ``json.loads`` is linear, but
the objects it builds are not bounded by the byte count: ``{},`` (3 bytes) becomes a dict
and a list slot (72 bytes), ``[[]],`` 30 times its size, ``1.5,`` 8 times, and one
``\\ud83d\\ude00`` escape makes a whole string 4 bytes a character. So before anything is
decoded, :func:`decoded_bytes_bound` counts what the bytes can build (containers, values,
strings, escapes: a few C-speed passes, nothing allocated) and prices each at what CPython
spends on it at most; an answer whose bound passes ``max_decoded_bytes`` is refused whole
(:class:`OversizedAnswer`) without being decoded. NCCL's own answers (indented, ASCII, about
546 bytes a rank entry) price at 5 to 6 times their size, the amplifying shapes at 9 to 70
times, and the default budget is 6 times the answer's size. After decoding, every value's
type and range is checked, strings are short and of a known shape, and the number of
communicators, ranks and collective types is capped, so nothing an answer holds can grow
what leaves this module beyond its size.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

#: ``ncclResult_t`` names, by value (NCCL's nccl.h): the kinds of ``async_error``
NCCL_RESULTS: dict[int, str] = {
    0: "success",
    1: "unhandled_cuda_error",
    2: "system_error",
    3: "internal_error",
    4: "invalid_argument",
    5: "invalid_usage",
    6: "remote_error",
    7: "in_progress",
}
#: the error kinds exported (every ``ncclResult_t`` but success and in progress, and
#: ``other`` for a value this table does not know)
ERROR_KINDS: tuple[str, ...] = (
    "internal_error",
    "invalid_argument",
    "invalid_usage",
    "other",
    "remote_error",
    "system_error",
    "unhandled_cuda_error",
)
NCCL_SUCCESS = 0
NCCL_IN_PROGRESS = 7

#: most communicators, ranks per communicator list, and collective types one answer may hold
MAX_COMMUNICATORS = 65_536
MAX_RANKS = 1 << 20
MAX_COLLECTIVE_TYPES = 16
_HASH = re.compile(r"0x[0-9a-f]{1,16}")
_SECONDARY = re.compile(r"0x[0-9a-f]{1,16}:0x[0-9a-f]{1,16}")
_FUNC = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")
_VERSION = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,4}[A-Za-z0-9.+_-]{0,32}")
#: NCCL 2.28's missing comma in a missing rank's entry (see the module docstring)
_MISSING_COMMA = re.compile(rb'("nvml_dev": -?[0-9]{1,4})(\r?\n[ ]{0,64}"status": \{)')
UNKNOWN_HOST = "unknown"
_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
_COUNT_MAX = (1 << 64) - 1


class MalformedAnswer(ValueError):  # noqa: N818 - a reason, reported as data
    """The answer is not a RAS JSON status of the shape NCCL writes; the message says where."""


class OversizedAnswer(MalformedAnswer):
    """The answer would decode into more memory than ``max_decoded_bytes`` allows."""


#: what CPython spends at most (64-bit, 3.11-3.13), in bytes, on what one byte of JSON opens:
#: a container (``{`` or ``[``: an empty dict 64, a list 56, a small dict 184 plus its slots),
#: a value or member (``,`` or ``:``: a list slot or dict entry, and a float's 24 or an
#: int's 28-32 bytes), a quote (half a string: 49 bytes of header and its characters)
_PER_CONTAINER = 160
_PER_VALUE = 32
_PER_QUOTE = 20
#: the default budget: an answer may price at most this many times its size (NCCL's indented
#: answers, recorded and synthetic, price at 5.1 to 5.8, a tiny one more; the amplifying
#: shapes at 9 to 70), and at least :data:`MIN_DECODED_BYTES` whatever its size
DECODED_PER_ANSWER_BYTE = 6
MIN_DECODED_BYTES = 1 << 16


def decoded_bytes_bound(data: bytes | bytearray) -> int:
    """An upper bound of the memory ``json.loads(data)`` builds, from counts alone (a few
    linear passes over ``data``, nothing decoded): each container, value and string priced
    at what CPython spends on it at most, plus the text itself. A ``\\u`` escape may widen
    a string to 4 bytes a character, so one (NCCL writes none) prices the whole text at 4
    bytes a byte; a byte outside ASCII (NCCL writes none) at 4 as well."""
    containers = data.count(b"{") + data.count(b"[")
    values = data.count(b",") + data.count(b":")
    quotes = data.count(b'"')
    text = len(data)
    if b"\\u" in data or not data.isascii():
        text *= 4
    return _PER_CONTAINER * containers + _PER_VALUE * values + _PER_QUOTE * quotes + text


@dataclass(frozen=True, slots=True)
class RasRank:
    """A rank whose process answered: its identity, state and collective counts
    (``counts``: (collective type, operations launched), in the answer's order)."""

    rank: int
    host: str
    pid: int
    cuda_dev: int
    nvml_dev: int
    init_state: int
    async_error: int
    finalize_called: bool
    destroy_flag: bool
    abort_flag: bool
    counts: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        """Collective operations launched, all types together."""
        return sum(n for _, n in self.counts)


@dataclass(frozen=True, slots=True)
class RasMissingRank:
    """A rank this gather got no data about (see the module docstring)."""

    rank: int
    host: str
    pid: int
    cuda_dev: int
    nvml_dev: int
    unresponsive: bool
    considered_dead: bool


@dataclass(frozen=True, slots=True)
class RasCommunicator:
    """One communicator: ``key`` is ``hash/secondary_hash`` (unique, where ``hash`` alone
    almost always is); ``size`` its rank count."""

    key: str
    size: int
    ranks: tuple[RasRank, ...]
    missing: tuple[RasMissingRank, ...]


@dataclass(frozen=True, slots=True)
class RasAnswer:
    """One job-wide status. ``collection_seconds``: how long RAS took to gather it;
    ``timeouts``: gather legs that timed out (a process that did not answer in time)."""

    nccl_version: str
    communicators: tuple[RasCommunicator, ...]
    collection_seconds: float
    timeouts: int
    #: the answer had NCCL 2.28's missing comma and was repaired (module docstring)
    repaired: bool = False


# -- field readers ---------------------------------------------------------------------------


def _obj(value: object, where: str) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise MalformedAnswer(f"{where} is not an object")
    return cast("Mapping[str, object]", value)


def _list(obj: Mapping[str, object], key: str, where: str, limit: int) -> list[object]:
    value = obj.get(key)
    if not isinstance(value, list):
        raise MalformedAnswer(f"{where}.{key} is not a list")
    if len(value) > limit:
        raise MalformedAnswer(f"{where}.{key} has {len(value)} entries (at most {limit})")
    return value


def _int(
    obj: Mapping[str, object], key: str, where: str, lo: int = _INT_MIN, hi: int = _INT_MAX
) -> int:
    value = obj.get(key)
    # bool is an int subclass: true is not a count
    if not isinstance(value, int) or isinstance(value, bool):
        raise MalformedAnswer(f"{where}.{key} is not an integer")
    if not lo <= value <= hi:
        raise MalformedAnswer(f"{where}.{key} = {value} is out of range")
    return value


def _bool(obj: Mapping[str, object], key: str, where: str) -> bool:
    value = obj.get(key)
    if not isinstance(value, bool):
        raise MalformedAnswer(f"{where}.{key} is not a boolean")
    return value


def _text(obj: Mapping[str, object], key: str, where: str, shape: re.Pattern[str]) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or shape.fullmatch(value) is None:
        raise MalformedAnswer(f"{where}.{key} is not of the expected form")
    return value


def parse_host(value: object, where: str) -> str:
    """An IPv4 or IPv6 address in its canonical text form, or ``unknown``."""
    if value == UNKNOWN_HOST:
        return UNKNOWN_HOST
    if not isinstance(value, str) or len(value) > 45:
        raise MalformedAnswer(f"{where}.host is not an address")
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise MalformedAnswer(f"{where}.host is not an address") from None


def _counts(value: object, where: str) -> tuple[tuple[str, int], ...]:
    counts = _obj(value, f"{where}.collective_counts")
    if len(counts) > MAX_COLLECTIVE_TYPES:
        raise MalformedAnswer(f"{where}.collective_counts has {len(counts)} types")
    out = []
    for name in counts:
        if _FUNC.fullmatch(name) is None:
            raise MalformedAnswer(f"{where}.collective_counts has a key of unexpected form")
        out.append((name, _int(counts, name, f"{where}.collective_counts", 0, _COUNT_MAX)))
    return tuple(out)


def _rank(value: object, where: str) -> RasRank:
    r = _obj(value, where)
    status = _obj(r.get("status"), f"{where}.status")
    sw = f"{where}.status"
    return RasRank(
        rank=_int(r, "rank", where, 0),
        host=parse_host(r.get("host"), where),
        pid=_int(r, "pid", where, -1),
        cuda_dev=_int(r, "cuda_dev", where, -128, 127),
        nvml_dev=_int(r, "nvml_dev", where, -128, 127),
        init_state=_int(status, "init_state", sw, -8, 15),
        async_error=_int(status, "async_error", sw, -8, 15),
        finalize_called=_bool(status, "finalize_called", sw),
        destroy_flag=_bool(status, "destroy_flag", sw),
        abort_flag=_bool(status, "abort_flag", sw),
        counts=_counts(r.get("collective_counts"), where),
    )


def _missing(value: object, where: str) -> RasMissingRank:
    r = _obj(value, where)
    status = _obj(r.get("status"), f"{where}.status")
    return RasMissingRank(
        rank=_int(r, "rank", where, 0),
        host=parse_host(r.get("host"), where),
        pid=_int(r, "pid", where, -1),
        cuda_dev=_int(r, "cuda_dev", where, -128, 127),
        nvml_dev=_int(r, "nvml_dev", where, -128, 127),
        unresponsive=_bool(status, "unresponsive", f"{where}.status"),
        considered_dead=_bool(status, "considered_dead", f"{where}.status"),
    )


def _communicator(value: object, where: str) -> RasCommunicator:
    c = _obj(value, where)
    key = f"{_text(c, 'hash', where, _HASH)}/{_text(c, 'secondary_hash', where, _SECONDARY)}"
    size = _int(c, "size", where, 0, MAX_RANKS)
    ranks = tuple(
        _rank(r, f"{where}.ranks[{i}]") for i, r in enumerate(_list(c, "ranks", where, MAX_RANKS))
    )
    missing = tuple(
        _missing(r, f"{where}.missing_ranks[{i}]")
        for i, r in enumerate(_list(c, "missing_ranks", where, MAX_RANKS))
    )
    if len(ranks) + len(missing) > max(size, 0) and size:
        raise MalformedAnswer(f"{where} lists more ranks than its size {size}")
    return RasCommunicator(key, size, ranks, missing)


def _reject_constant(name: str) -> object:
    raise MalformedAnswer(f"the answer holds {name}, which JSON does not allow")


def _load(data: bytes | bytearray) -> object:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedAnswer("the answer is not UTF-8") from None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise MalformedAnswer("the answer nests too deep") from None
    except json.JSONDecodeError as exc:
        raise MalformedAnswer(f"not JSON: {exc.msg} at byte {exc.pos}") from None


def parse_status(data: bytes | bytearray, max_decoded_bytes: int | None = None) -> RasAnswer:
    """A RAS JSON status; :class:`MalformedAnswer` for anything else (not UTF-8, not JSON
    even once NCCL 2.28's missing comma is repaired, ``NaN``, nesting too deep, a field
    missing, of another type or out of range), :class:`OversizedAnswer` (before anything is
    decoded) when :func:`decoded_bytes_bound` passes ``max_decoded_bytes`` (by default
    :data:`DECODED_PER_ANSWER_BYTE` times the answer's size, whatever its shape)."""
    budget = (
        max(DECODED_PER_ANSWER_BYTE * len(data), MIN_DECODED_BYTES)
        if max_decoded_bytes is None
        else max_decoded_bytes
    )
    bound = decoded_bytes_bound(data)
    if bound > budget:
        raise OversizedAnswer(
            f"the answer's {len(data)} bytes could decode into {bound >> 20} MiB "
            f"(at most {budget >> 20} MiB)"
        )
    repaired = False
    try:
        doc = _load(data)
    except MalformedAnswer as first:
        fixed, n = _MISSING_COMMA.subn(rb"\1,\2", data)
        if not n:
            raise
        try:
            doc = _load(fixed)
        except MalformedAnswer:
            raise first from None
        repaired = True
    top = _obj(doc, "answer")
    version = _text(top, "nccl_version", "answer", _VERSION)
    comms = tuple(
        _communicator(c, f"communicators[{i}]")
        for i, c in enumerate(_list(top, "communicators", "answer", MAX_COMMUNICATORS))
    )
    ras = _obj(top.get("ras"), "answer.ras")
    seconds = ras.get("collection_time_sec")
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or not 0 <= seconds < 1e6:
        raise MalformedAnswer("answer.ras.collection_time_sec is not a duration")
    return RasAnswer(
        nccl_version=version,
        communicators=comms,
        collection_seconds=float(seconds),
        timeouts=_int(ras, "timeouts_count", "answer.ras", 0),
        repaired=repaired,
    )


def error_kind(value: int) -> str | None:
    """The exported kind of an ``ncclResult_t`` (None: success or in progress)."""
    if value in (NCCL_SUCCESS, NCCL_IN_PROGRESS):
        return None
    name = NCCL_RESULTS.get(value)
    return name if name in ERROR_KINDS else "other"
