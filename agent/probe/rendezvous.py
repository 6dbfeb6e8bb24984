"""Probe rendezvous: two agents prove a shared secret to each other, then agree on a probe.

The lower-ranked node of a scheduled pair (the *host*) runs a :class:`RendezvousServer` on its
probe port; the other (the *guest*) calls :func:`propose`. Only after both sides have proved
the secret, and the host has answered the guest's :class:`Offer`, does either side start a
torch worker. The secret never crosses the wire and nothing derived from it is logged.

Wire protocol, version 1 (TCP; all integers big-endian)::

    frame   = u32 length | u8 version (=1) | u8 type | body      length = 2 + len(body)
              length outside 2..65536 -> refused before the body is read
    lp(x)   = u16 len(x) | x                                   unambiguous concatenation
    HMAC    = HMAC-SHA256;  C = lp(b"fabricscope-probe/1")

    1 HELLO      guest -> host   nonce_g[32] | lp(guest_id)
    2 CHALLENGE  host -> guest   nonce_h[32] | proof_h[32] | lp(host_id)
    3 OFFER      guest -> host   proof_g[32] | mac[32] | offer JSON
    4 ANSWER     host -> guest   mac[32] | answer JSON
    5 ERROR      either way      reason (ASCII): auth_failure | busy | protocol_error | timeout

    proof_h = HMAC(secret, C | lp(b"host")  | nonce_h | nonce_g | lp(host_id) | lp(guest_id))
    proof_g = HMAC(secret, C | lp(b"guest") | nonce_g | nonce_h | lp(host_id) | lp(guest_id))
    K       = HMAC(secret, C | lp(b"session") | nonce_h | nonce_g | lp(host_id) | lp(guest_id))
    mac     = HMAC(K, lp(b"offer") | offer JSON)   or   HMAC(K, lp(b"answer") | answer JSON)

The host proves first, so a guest detects an impostor host before it sends anything that
depends on the secret. Each side checks the other's proof over both fresh 32-byte nonces
with :func:`hmac.compare_digest`; role tags stop a proof being reflected back as the other
role's, fresh nonces stop a recorded transcript being replayed, and the session MACs stop an
on-path relay altering the offer or answer. ERROR frames are not authenticated: they only
explain a refusal that closing the connection would cause anyway. There is no encryption:
offers and answers (ports, sizes) are not secret.

Every read has a per-step timeout and the handshake (hello to offer) a short deadline, so
a silent or trickling peer holds a connection slot for a bounded time and never the
listener. Slots are shared fairly: one address holds at most ``max_pending_per_address``
of them (a further connection from it gets ERROR busy at once, before any thread is
started), and when all ``max_pending`` are taken a newcomer displaces the oldest connection
that has not authenticated yet, taken from the address holding the most. A peer that has
proved the secret is never displaced, so an authenticated peer always keeps its slot and a
peer at another address always gets one.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import selectors
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from agent.errors import ConfigError

log = logging.getLogger(__name__)

VERSION = 1
MAX_FRAME_BYTES = 64 * 1024
NONCE_BYTES = 32
MAC_BYTES = 32
MIN_SECRET_BYTES = 16
MAX_SECRET_BYTES = 4096

MSG_HELLO = 1
MSG_CHALLENGE = 2
MSG_OFFER = 3
MSG_ANSWER = 4
MSG_ERROR = 5

KINDS = ("all_reduce", "sendrecv", "latency")
BACKENDS = ("nccl", "gloo")
#: why a host may decline an offer (probe failure reasons, see ``agent.probe``)
DECLINE_REASONS = ("gpu_busy", "init_failure")
#: why a server refused a connection (``RendezvousStats.refused_total``)
REFUSAL_REASONS = ("auth_failure", "disconnected", "protocol_error", "timeout", "too_many_pending")
_WIRE_ERRORS = ("auth_failure", "busy", "protocol_error", "timeout")

_CONTEXT = b"fabricscope-probe/1"
_ID = re.compile(r"^[A-Za-z0-9._:%\[\]-]{1,253}$")
_PROBE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_MAX_SIZES = 64
_MAX_SIZE_BYTES = 1 << 36
_SECRET_HINT = "e.g. head -c 32 /dev/urandom | base64 > {path} && chmod 600 {path}"


# --- errors -----------------------------------------------------------------------------


class RendezvousError(Exception):
    """A rendezvous failed. ``reason`` is a probe failure reason (``agent.probe``)."""

    reason = "peer_unreachable"

    def __init__(self, message: str, *, from_peer: bool = False) -> None:
        super().__init__(message)
        #: the peer told us (ERROR frame); it needs no ERROR back
        self.from_peer = from_peer


class PeerUnreachableError(RendezvousError):
    """No connection, the peer closed it, or the peer is busy."""

    reason = "peer_unreachable"


class AuthError(RendezvousError):
    """A proof or MAC did not verify: the peer does not hold our secret (or was tampered)."""

    reason = "auth_failure"


class ProtocolError(RendezvousError):
    """The peer sent something this protocol version does not allow.

    Its probe reason is ``auth_failure``: such a peer has not authenticated as a probe peer.
    """

    reason = "auth_failure"


class RendezvousTimeoutError(RendezvousError):
    """A step or the whole exchange ran out of time."""

    reason = "timeout"


# --- the secret -------------------------------------------------------------------------


def load_secret(path: str) -> bytes:
    """Read the shared probe secret; strip one trailing newline.

    ConfigError, naming ``path`` but never the content, if the file is missing, unreadable,
    not a regular file, readable by every user, empty, or not 16..4096 bytes long.
    """
    hint = _SECRET_HINT.format(path=path)
    try:
        # O_NONBLOCK: a FIFO in place of the file must not hang the agent
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError(f"probe secret file {path} does not exist; create it, {hint}") from None
    except OSError as exc:
        raise ConfigError(f"probe secret file {path} cannot be read: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"probe secret file {path} is not a regular file")
        if st.st_mode & 0o004:
            raise ConfigError(
                f"probe secret file {path} is readable by every user "
                f"(mode {stat.S_IMODE(st.st_mode):04o}); run: chmod 600 {path} "
                "(for a Kubernetes Secret volume set defaultMode: 0400)"
            )
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_SECRET_BYTES + 2:
            chunk = os.read(fd, MAX_SECRET_BYTES + 3 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ConfigError(f"probe secret file {path} cannot be read: {exc.strerror}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    data = data[:-2] if data.endswith(b"\r\n") else data.removesuffix(b"\n")
    if not data:
        raise ConfigError(f"probe secret file {path} is empty; fill it, {hint}")
    if len(data) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"probe secret file {path} is shorter than {MIN_SECRET_BYTES} bytes; "
            f"use a longer secret, {hint}"
        )
    if len(data) > MAX_SECRET_BYTES:
        raise ConfigError(f"probe secret file {path} is longer than {MAX_SECRET_BYTES} bytes")
    return data


def _check_secret(secret: bytes) -> None:
    if not MIN_SECRET_BYTES <= len(secret) <= MAX_SECRET_BYTES:
        raise ConfigError(
            f"probe secret must be {MIN_SECRET_BYTES}..{MAX_SECRET_BYTES} bytes (see load_secret)"
        )


def _check_node_id(node_id: str) -> None:
    if not _ID.match(node_id):
        raise ConfigError(f"probe node id {node_id!r} is not a host name or address")


# --- offer and answer -------------------------------------------------------------------


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
            if self.master_addr is None or not _ID.match(self.master_addr):
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


# --- framing and proofs -----------------------------------------------------------------


def _lp(data: bytes) -> bytes:
    return struct.pack("!H", len(data)) + data


def _keyed(secret: bytes, tag: bytes, nonces: bytes, host_id: str, guest_id: str) -> bytes:
    """HMAC(secret, C | lp(tag) | nonces | lp(host_id) | lp(guest_id)); ``nonces`` is the
    prover's own nonce then the other side's (host nonce first for the session key)."""
    msg = _lp(_CONTEXT) + _lp(tag) + nonces + _lp(host_id.encode()) + _lp(guest_id.encode())
    return hmac.new(secret, msg, hashlib.sha256).digest()


def _mac(key: bytes, tag: bytes, body: bytes) -> bytes:
    return hmac.new(key, _lp(tag) + body, hashlib.sha256).digest()


def _frame(kind: int, body: bytes) -> bytes:
    return struct.pack("!IBB", 2 + len(body), VERSION, kind) + body


def _read_id(body: bytes, start: int, what: str) -> str:
    """An lp(id) ending exactly at the end of ``body``."""
    if len(body) < start + 2:
        raise ProtocolError(f"{what} is truncated")
    (n,) = struct.unpack_from("!H", body, start)
    if len(body) != start + 2 + n:
        raise ProtocolError(f"{what} has the wrong length")
    try:
        text = body[start + 2 :].decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError(f"{what}: node id is not ASCII") from None
    if not _ID.match(text):
        raise ProtocolError(f"{what}: node id is not a host name or address")
    return text


def _peer_error(body: bytes) -> RendezvousError:
    reason = body.decode("ascii", "replace")
    if reason == "auth_failure":
        return AuthError("the peer refused our proof: the shared secrets differ", from_peer=True)
    if reason == "busy":
        return PeerUnreachableError("the peer has too many pending rendezvous", from_peer=True)
    if reason == "timeout":
        return RendezvousTimeoutError("the peer timed out waiting for us", from_peer=True)
    if reason == "protocol_error":
        return ProtocolError("the peer refused our messages as malformed", from_peer=True)
    return ProtocolError("the peer sent an unknown error", from_peer=True)


class _Channel:
    """Frames over a socket, each read/write bounded by ``step`` and by ``deadline``."""

    def __init__(self, sock: socket.socket, step: float, deadline: float) -> None:
        self.sock = sock
        self.step = step
        self.deadline = deadline

    def _arm(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise RendezvousTimeoutError("the exchange ran out of time")
        self.sock.settimeout(min(self.step, left))

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            self._arm()
            try:
                chunk = self.sock.recv(n - len(buf))
            except TimeoutError:
                raise RendezvousTimeoutError("the peer sent nothing in time") from None
            except OSError as exc:
                raise PeerUnreachableError(f"connection lost: {exc.strerror or exc}") from None
            if not chunk:
                raise PeerUnreachableError("the peer closed the connection")
            buf += chunk
        return bytes(buf)

    def recv(self, expect: int) -> bytes:
        (length,) = struct.unpack("!I", self._recv_exact(4))
        if not 2 <= length <= MAX_FRAME_BYTES:
            raise ProtocolError(f"frame of {length} bytes (limit {MAX_FRAME_BYTES})")
        payload = self._recv_exact(length)
        if payload[0] != VERSION:
            raise ProtocolError(f"the peer speaks protocol version {payload[0]}, not {VERSION}")
        kind, body = payload[1], payload[2:]
        if kind == MSG_ERROR:
            raise _peer_error(body)
        if kind != expect:
            raise ProtocolError(f"expected message type {expect}, got {kind}")
        return body

    def send(self, kind: int, body: bytes) -> None:
        self._arm()
        try:
            self.sock.sendall(_frame(kind, body))
        except TimeoutError:
            raise RendezvousTimeoutError("the peer did not read in time") from None
        except OSError as exc:
            raise PeerUnreachableError(f"connection lost: {exc.strerror or exc}") from None


def _send_error_quietly(sock: socket.socket, reason: str, peer: str) -> None:
    try:
        sock.settimeout(0.2)
        sock.sendall(_frame(MSG_ERROR, reason.encode()))
    except OSError as exc:
        log.debug("could not send error %s to %s: %s", reason, peer, exc)


def _wire_error(exc: RendezvousError) -> str | None:
    if exc.from_peer or isinstance(exc, PeerUnreachableError):
        return None
    if isinstance(exc, AuthError):
        return "auth_failure"
    if isinstance(exc, RendezvousTimeoutError):
        return "timeout"
    return "protocol_error"


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _describe(addr: object) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        return _hostport(str(addr[0]), int(addr[1]))
    return str(addr)


# --- guest side -------------------------------------------------------------------------


def propose(  # noqa: PLR0917 - the call shape the probe runner was promised
    host_addr: str,
    port: int,
    secret: bytes,
    node_id: str,
    offer: Offer,
    timeout: float,
    *,
    expected_host_id: str | None = None,
) -> Answer:
    """Guest side: connect, authenticate both ways, send ``offer``, return the host's answer.

    ``timeout`` (seconds) bounds the whole exchange. ``expected_host_id``, if given, must be
    the node id the host proves. Raises a :class:`RendezvousError` whose ``reason`` is
    ``peer_unreachable``, ``auth_failure`` or ``timeout``; a declined offer is an Answer.
    """
    _check_secret(secret)
    _check_node_id(node_id)
    where = _hostport(host_addr, port)
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection((host_addr, port), timeout=timeout)
    except TimeoutError:
        raise RendezvousTimeoutError(f"connecting to probe rendezvous {where} timed out") from None
    except OSError as exc:
        raise PeerUnreachableError(
            f"cannot connect to probe rendezvous {where}: {exc.strerror or exc}"
        ) from None
    with sock:
        chan = _Channel(sock, timeout, deadline)
        nonce_g = secrets.token_bytes(NONCE_BYTES)
        chan.send(MSG_HELLO, nonce_g + _lp(node_id.encode()))
        body = chan.recv(MSG_CHALLENGE)
        nonce_h, proof_h = body[:NONCE_BYTES], body[NONCE_BYTES : NONCE_BYTES + MAC_BYTES]
        host_id = _read_id(body, NONCE_BYTES + MAC_BYTES, "challenge")
        if nonce_h == nonce_g or host_id == node_id:
            raise ProtocolError(f"{where} reflected our own hello")
        want = _keyed(secret, b"host", nonce_h + nonce_g, host_id, node_id)
        if not hmac.compare_digest(proof_h, want):
            _send_error_quietly(sock, "auth_failure", where)
            raise AuthError(
                f"probe rendezvous {where} failed to prove the shared secret "
                "(an impostor, or its secret differs from ours)"
            )
        if expected_host_id is not None and host_id != expected_host_id:
            _send_error_quietly(sock, "auth_failure", where)
            raise AuthError(f"probe rendezvous {where} is {host_id}, not {expected_host_id}")
        proof_g = _keyed(secret, b"guest", nonce_g + nonce_h, host_id, node_id)
        key = _keyed(secret, b"session", nonce_h + nonce_g, host_id, node_id)
        payload = offer.to_json()
        chan.send(MSG_OFFER, proof_g + _mac(key, b"offer", payload) + payload)
        body = chan.recv(MSG_ANSWER)
        mac, payload = body[:MAC_BYTES], body[MAC_BYTES:]
        if len(mac) != MAC_BYTES or not hmac.compare_digest(mac, _mac(key, b"answer", payload)):
            raise AuthError(f"the answer from {where} failed its MAC (altered in transit)")
        answer = Answer.from_json(payload)
        if answer.probe_id != offer.probe_id:
            raise ProtocolError(f"{where} answered probe {answer.probe_id}, not {offer.probe_id}")
        return answer


# --- host side --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RendezvousStats:
    """Counters of a :class:`RendezvousServer`, for metrics.

    ``accepted_total``: peers that authenticated and got an answer (accept or decline).
    ``refused_total``: refused connections by reason, every one of ``REFUSAL_REASONS``.
    ``pending``: connections being handled now.
    """

    accepted_total: int = 0
    refused_total: tuple[tuple[str, int], ...] = tuple((r, 0) for r in REFUSAL_REASONS)
    pending: int = 0

    def refused(self, reason: str) -> int:
        return dict(self.refused_total).get(reason, 0)


def _listen(bind: str, port: int, backlog: int) -> socket.socket:
    if not bind:
        raise ConfigError(
            "probe bind address is empty: give this node's address "
            "(0.0.0.0 or :: listens on every address, but only when asked for)"
        )
    if not 0 <= port <= 65535:
        raise ConfigError(f"probe port {port} is not 0..65535")
    where = _hostport(bind, port)
    try:
        infos = socket.getaddrinfo(bind, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICSERV)
    except socket.gaierror as exc:
        raise ConfigError(f"probe bind address {bind} does not resolve: {exc.strerror}") from None
    family, _, _, _, sockaddr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # lets a restarted agent rebind over TIME_WAIT; a live listener still refuses it
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"probe port {where} is already in use (another agent or process listens "
                "there); stop it or choose another probe port"
            ) from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise ConfigError(
                f"probe bind address {bind} is not an address of this node: {exc.strerror}"
            ) from None
        raise ConfigError(f"cannot listen on probe port {where}: {exc.strerror}") from None
    sock.setblocking(False)
    return sock


@dataclass(slots=True, eq=False)
class _Pending:
    """One connection being handled: its client address and whether it authenticated."""

    sock: socket.socket
    address: str
    thread: threading.Thread
    authenticated: bool = False
    displaced: bool = False


class RendezvousServer:
    """Host side: accepts guests on ``bind:port`` in a background thread until closed.

    Each connection runs in its own thread, at most ``max_pending`` at once and
    ``max_pending_per_address`` from one address (see the module docstring for who is
    displaced or refused); each read waits at most ``step_timeout`` seconds and the
    handshake (hello to offer) at most ``handshake_timeout``. An authenticated offer is
    passed to ``on_offer(offer, guest_id)`` (``guest_id``: the node id the guest proved),
    whose Answer is sent back; if it raises, the guest gets a decline with reason
    ``init_failure``. Listening starts in the constructor: a taken port or a foreign
    address is a ConfigError there.
    """

    def __init__(
        self,
        bind: str,
        port: int,
        secret: bytes,
        node_id: str,
        on_offer: Callable[[Offer, str], Answer],
        *,
        max_pending: int = 8,
        max_pending_per_address: int = 2,
        step_timeout: float = 5.0,
        handshake_timeout: float = 3.0,
    ) -> None:
        _check_secret(secret)
        _check_node_id(node_id)
        if (
            max_pending < 1
            or max_pending_per_address < 1
            or step_timeout <= 0
            or handshake_timeout <= 0
        ):
            raise ConfigError("probe rendezvous limits must be positive")
        self.node_id = node_id
        self._secret = secret
        self._on_offer = on_offer
        self._step = step_timeout
        self._handshake = handshake_timeout
        self._max_pending = max_pending
        self._max_per_address = max_pending_per_address
        self._lock = threading.Lock()
        self._accepted = 0
        self._refused = dict.fromkeys(REFUSAL_REASONS, 0)
        self._warned: set[tuple[str, str]] = set()
        #: connections holding a slot, oldest first
        self._active: dict[socket.socket, _Pending] = {}
        #: displaced connections whose threads are still finishing
        self._leaving: dict[socket.socket, _Pending] = {}
        self._closed = False
        self._listener = _listen(bind, port, max(16, 2 * max_pending))
        self.port: int = self._listener.getsockname()[1]
        self.bind = bind
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(
            target=self._serve, name=f"probe-rendezvous:{self.port}", daemon=True
        )
        self._thread.start()
        log.info("probe rendezvous listening on %s", _hostport(bind, self.port))

    def __enter__(self) -> RendezvousServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> RendezvousStats:
        with self._lock:
            return RendezvousStats(
                accepted_total=self._accepted,
                refused_total=tuple(sorted(self._refused.items())),
                pending=len(self._active),
            )

    def close(self, timeout: float = 2.0) -> None:
        """Stop accepting, cut in-flight connections, wait for their threads."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake_w.send(b"x")
        self._thread.join(timeout)
        self._listener.close()
        with self._lock:  # the accept thread is gone: no connection can be added now
            active = [*self._active.values(), *self._leaving.values()]
        for pending in active:
            _cut(pending.sock)
        for pending in active:
            pending.thread.join(timeout)
        self._wake_r.close()
        self._wake_w.close()

    def _serve(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self._listener, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while True:
                for key, _ in sel.select():
                    if key.fileobj is self._wake_r:
                        return
                    try:
                        sock, addr = self._listener.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError as exc:  # e.g. EMFILE: back off rather than spin
                        log.error("probe rendezvous: accept failed: %s", exc)
                        time.sleep(0.1)
                        continue
                    self._dispatch(sock, _describe(addr))

    def _dispatch(self, sock: socket.socket, peer: str) -> None:
        address = peer.rsplit(":", 1)[0]
        thread = threading.Thread(
            target=self._handle, args=(sock, peer), name=f"probe-rendezvous {peer}", daemon=True
        )
        pending = _Pending(sock, address, thread)
        with self._lock:
            admitted, displaced = self._admit(pending)
        if displaced is not None:
            _cut(displaced.sock)  # its thread counts it (too_many_pending) and closes it
        if not admitted:
            # counted before the peer can hear of it
            self._refuse(peer, "too_many_pending", "too many pending rendezvous")
            _send_error_quietly(sock, "busy", peer)
            sock.close()
            return
        thread.start()

    def _admit(self, new: _Pending) -> tuple[bool, _Pending | None]:
        """Under the lock: whether ``new`` gets a slot, and whom it displaces."""
        counts: dict[str, int] = {}
        for p in self._active.values():
            counts[p.address] = counts.get(p.address, 0) + 1
        if counts.get(new.address, 0) >= self._max_per_address:
            return False, None
        victim = None
        if len(self._active) >= self._max_pending:
            for address in sorted(counts, key=counts.__getitem__, reverse=True):
                victim = next(
                    (
                        p
                        for p in self._active.values()
                        if p.address == address and not p.authenticated
                    ),
                    None,
                )
                if victim is not None:
                    break
            if victim is None:
                return False, None
            victim.displaced = True
            del self._active[victim.sock]
            self._leaving[victim.sock] = victim
        self._active[new.sock] = new
        return True, victim

    def _handle(self, sock: socket.socket, peer: str) -> None:
        try:
            guest_id, offer, answer = self._converse(sock)
        except RendezvousError as exc:
            with self._lock:
                displaced = sock in self._leaving
            if displaced:
                self._refuse(peer, "too_many_pending", "displaced by a newer connection")
                return
            self._refuse(peer, _refusal_reason(exc), str(exc))
            wire = _wire_error(exc)
            if wire is not None:
                _send_error_quietly(sock, wire, peer)
        except Exception:
            log.exception("probe rendezvous with %s failed unexpectedly", peer)
            self._refuse(peer, "protocol_error", "internal error")
        else:
            with self._lock:
                self._accepted += 1
            log.debug(
                "probe rendezvous: %s (%s) offered %s %s; %s",
                guest_id,
                peer,
                offer.kind,
                offer.probe_id,
                "accepted" if answer.accepted else f"declined ({answer.reason})",
            )
        finally:
            sock.close()
            with self._lock:
                self._active.pop(sock, None)
                self._leaving.pop(sock, None)

    def _authenticated(self, sock: socket.socket) -> bool:
        """Mark ``sock``'s peer as authenticated (never displaced from now on); False when
        it was displaced already."""
        with self._lock:
            pending = self._active.get(sock)
            if pending is None:
                return False
            pending.authenticated = True
            return True

    def _converse(self, sock: socket.socket) -> tuple[str, Offer, Answer]:
        chan = _Channel(sock, self._step, time.monotonic() + self._handshake)
        body = chan.recv(MSG_HELLO)
        nonce_g = body[:NONCE_BYTES]
        guest_id = _read_id(body, NONCE_BYTES, "hello")
        if guest_id == self.node_id:
            raise ProtocolError(f"the guest claims our own node id {guest_id}")
        nonce_h = secrets.token_bytes(NONCE_BYTES)
        proof_h = _keyed(self._secret, b"host", nonce_h + nonce_g, self.node_id, guest_id)
        chan.send(MSG_CHALLENGE, nonce_h + proof_h + _lp(self.node_id.encode()))
        body = chan.recv(MSG_OFFER)
        if len(body) < 2 * MAC_BYTES:
            raise ProtocolError("offer is truncated")
        proof_g, mac = body[:MAC_BYTES], body[MAC_BYTES : 2 * MAC_BYTES]
        payload = body[2 * MAC_BYTES :]
        want = _keyed(self._secret, b"guest", nonce_g + nonce_h, self.node_id, guest_id)
        if not hmac.compare_digest(proof_g, want):
            raise AuthError(f"a guest calling itself {guest_id} failed to prove the secret")
        key = _keyed(self._secret, b"session", nonce_h + nonce_g, self.node_id, guest_id)
        if not hmac.compare_digest(mac, _mac(key, b"offer", payload)):
            raise AuthError(f"the offer from {guest_id} failed its MAC")
        if not self._authenticated(sock):
            raise PeerUnreachableError("displaced by a newer connection")
        offer = Offer.from_json(payload)
        answer = self._answer(offer, guest_id)
        chan.deadline = time.monotonic() + self._step
        out = answer.to_json()
        chan.send(MSG_ANSWER, _mac(key, b"answer", out) + out)
        return guest_id, offer, answer

    def _answer(self, offer: Offer, guest_id: str) -> Answer:
        try:
            answer = self._on_offer(offer, guest_id)
        except Exception:
            log.exception("probe rendezvous: offer %s from %s failed", offer.probe_id, guest_id)
            return Answer.decline(offer.probe_id, "init_failure")
        if answer.probe_id != offer.probe_id:
            log.error(
                "probe rendezvous: answer for %s given to offer %s", answer.probe_id, offer.probe_id
            )
            return Answer.decline(offer.probe_id, "init_failure")
        return answer

    def _refuse(self, peer: str, reason: str, why: str) -> None:
        ip = peer.rsplit(":", 1)[0]
        with self._lock:
            self._refused[reason] += 1
            first = (ip, reason) not in self._warned
            if first:
                if len(self._warned) >= 1024:
                    self._warned.clear()
                self._warned.add((ip, reason))
        # warn once per (address, reason); a scanner or a retrying peer must not flood logs
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "probe rendezvous: refused %s (%s): %s",
            peer,
            reason,
            why,
        )


def _cut(sock: socket.socket) -> None:
    """Make the thread blocked reading ``sock`` return (it closes the socket itself)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError as exc:  # already gone
        log.debug("probe rendezvous: shutdown of a connection: %s", exc)


def _refusal_reason(exc: RendezvousError) -> str:
    if isinstance(exc, AuthError):
        return "auth_failure"
    if isinstance(exc, RendezvousTimeoutError):
        return "timeout"
    if isinstance(exc, PeerUnreachableError):
        return "disconnected"
    return "protocol_error"
