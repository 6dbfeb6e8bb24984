"""Probe rendezvous messages: the guest's :class:`Offer` and the host's :class:`Answer`.

Each is strict JSON with exactly its fields, validated on construction (ValueError) and on
receipt (:class:`agent.probe.rendezvous.wire.ProtocolError`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import ClassVar

from agent.probe.rendezvous.wire import NODE_ID, ProtocolError

KINDS = ("all_reduce", "sendrecv", "latency")
BACKENDS = ("nccl", "gloo")
#: why a host may decline an offer (probe failure reasons, see ``agent.probe``)
DECLINE_REASONS = ("gpu_busy", "init_failure")

_PROBE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_MAX_SIZES = 64
_MAX_SIZE_BYTES = 1 << 36


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not allowed")


def _unique_pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _load_object(data: bytes, what: str, fields: tuple[str, ...]) -> dict[str, object]:
    """Strict JSON object with exactly ``fields``; ProtocolError otherwise."""
    try:
        doc: object = json.loads(
            data.decode("utf-8"),
            object_pairs_hook=_unique_pairs,
            parse_constant=_reject_constant,
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ProtocolError(f"{what} is not a JSON object")
    missing = sorted(set(fields) - set(doc))
    extra = sorted(set(doc) - set(fields))
    if missing or extra:
        raise ProtocolError(f"{what}: missing fields {missing}, unexpected fields {extra}")
    return {str(k): v for k, v in doc.items()}


def _as_int(doc: dict[str, object], key: str) -> int:
    value = doc[key]
    if type(value) is not int:  # bool is an int subclass: refuse it
        raise ProtocolError(f"field {key} must be an integer")
    return value


def _as_str(doc: dict[str, object], key: str) -> str:
    value = doc[key]
    if not isinstance(value, str):
        raise ProtocolError(f"field {key} must be a string")
    return value


def _as_opt_int(doc: dict[str, object], key: str) -> int | None:
    return None if doc[key] is None else _as_int(doc, key)


def _as_opt_str(doc: dict[str, object], key: str) -> str | None:
    return None if doc[key] is None else _as_str(doc, key)


def _dump(doc: dict[str, object]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class Offer:
    """What the guest proposes to measure with the host.

    ``sizes_bytes``: message sizes, each 1 B..64 GiB, at most 64 of them.
    ``iterations``/``warmup``: timed and untimed iterations per size.
    ``world_size`` is 2; the host is rank 0 (it runs the torch store) and ``guest_rank`` 1.
    Construction validates every field (ValueError).
    """

    probe_id: str
    kind: str
    backend: str
    sizes_bytes: tuple[int, ...]
    iterations: int
    warmup: int
    world_size: int = 2
    guest_rank: int = 1

    _FIELDS: ClassVar[tuple[str, ...]] = (
        "probe_id",
        "kind",
        "backend",
        "sizes_bytes",
        "iterations",
        "warmup",
        "world_size",
        "guest_rank",
    )

    def __post_init__(self) -> None:
        if not _PROBE_ID.match(self.probe_id):
            raise ValueError("probe_id must be 1-128 of [A-Za-z0-9._:-], starting alphanumeric")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}")
        if not 1 <= len(self.sizes_bytes) <= _MAX_SIZES or not all(
            type(s) is int and 1 <= s <= _MAX_SIZE_BYTES for s in self.sizes_bytes
        ):
            raise ValueError(f"sizes_bytes must be 1-{_MAX_SIZES} sizes of 1..2**36 bytes")
        if not 1 <= self.iterations <= 100_000:
            raise ValueError("iterations must be 1..100000")
        if not 0 <= self.warmup <= 10_000:
            raise ValueError("warmup must be 0..10000")
        if self.world_size != 2:
            raise ValueError("world_size must be 2")
        if self.guest_rank != 1:
            raise ValueError("guest_rank must be 1 (the host is rank 0)")

    def to_json(self) -> bytes:
        return _dump(
            {
                "probe_id": self.probe_id,
                "kind": self.kind,
                "backend": self.backend,
                "sizes_bytes": list(self.sizes_bytes),
                "iterations": self.iterations,
                "warmup": self.warmup,
                "world_size": self.world_size,
                "guest_rank": self.guest_rank,
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> Offer:
        """Parse and validate a received offer; ProtocolError if anything is off."""
        doc = _load_object(data, "offer", cls._FIELDS)
        sizes = doc["sizes_bytes"]
        if not isinstance(sizes, list) or not all(type(s) is int for s in sizes):
            raise ProtocolError("field sizes_bytes must be a list of integers")
        try:
            return cls(
                probe_id=_as_str(doc, "probe_id"),
                kind=_as_str(doc, "kind"),
                backend=_as_str(doc, "backend"),
                sizes_bytes=tuple(int(s) for s in sizes),
                iterations=_as_int(doc, "iterations"),
                warmup=_as_int(doc, "warmup"),
                world_size=_as_int(doc, "world_size"),
                guest_rank=_as_int(doc, "guest_rank"),
            )
        except ValueError as exc:
            raise ProtocolError(f"offer: {exc}") from None


@dataclass(frozen=True, slots=True)
class Answer:
    """The host's reply to an offer, for the same ``probe_id``.

    Accepted: ``master_addr``/``master_port`` are where the host's rank-0 torch store
    listens (a port the host reserved for this probe); ``reason`` is None. Declined:
    ``reason`` is one of ``DECLINE_REASONS`` and the address and port are None.
    """

    probe_id: str
    accepted: bool
    master_addr: str | None = None
    master_port: int | None = None
    reason: str | None = None

    _FIELDS: ClassVar[tuple[str, ...]] = (
        "probe_id",
        "accepted",
        "master_addr",
        "master_port",
        "reason",
    )

    def __post_init__(self) -> None:
        if not _PROBE_ID.match(self.probe_id):
            raise ValueError("probe_id must be 1-128 of [A-Za-z0-9._:-], starting alphanumeric")
        if self.accepted:
            if self.master_addr is None or not NODE_ID.match(self.master_addr):
                raise ValueError("an accepted answer needs master_addr, a host name or address")
            if self.master_port is None or not 1 <= self.master_port <= 65535:
                raise ValueError("an accepted answer needs master_port 1..65535")
            if self.reason is not None:
                raise ValueError("an accepted answer has no reason")
        else:
            if self.reason not in DECLINE_REASONS:
                raise ValueError(f"a declined answer needs reason {' or '.join(DECLINE_REASONS)}")
            if self.master_addr is not None or self.master_port is not None:
                raise ValueError("a declined answer has no master address or port")

    @classmethod
    def accept(cls, probe_id: str, master_addr: str, master_port: int) -> Answer:
        return cls(probe_id, True, master_addr, master_port, None)

    @classmethod
    def decline(cls, probe_id: str, reason: str) -> Answer:
        return cls(probe_id, False, None, None, reason)

    def to_json(self) -> bytes:
        return _dump(
            {
                "probe_id": self.probe_id,
                "accepted": self.accepted,
                "master_addr": self.master_addr,
                "master_port": self.master_port,
                "reason": self.reason,
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> Answer:
        """Parse and validate a received answer; ProtocolError if anything is off."""
        doc = _load_object(data, "answer", cls._FIELDS)
        accepted = doc["accepted"]
        if not isinstance(accepted, bool):
            raise ProtocolError("field accepted must be a boolean")
        try:
            return cls(
                probe_id=_as_str(doc, "probe_id"),
                accepted=accepted,
                master_addr=_as_opt_str(doc, "master_addr"),
                master_port=_as_opt_int(doc, "master_port"),
                reason=_as_opt_str(doc, "reason"),
            )
        except ValueError as exc:
            raise ProtocolError(f"answer: {exc}") from None
