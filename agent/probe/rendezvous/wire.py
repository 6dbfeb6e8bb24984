"""Probe rendezvous wire protocol: framing, proofs, the failure kinds, a bounded channel.

The lower-ranked node of a scheduled pair (the *host*) runs a
:class:`agent.probe.rendezvous.server.RendezvousServer` on its probe port; the other (the
*guest*) calls :func:`agent.probe.rendezvous.client.propose`. Only after both sides have
proved the secret (:mod:`agent.probe.rendezvous.secret`), and the host has answered the guest's
:class:`agent.probe.rendezvous.messages.Offer`, does either side start a torch worker. The
secret never crosses the wire and nothing derived from it is logged.

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
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import socket
import struct
import time

from agent.core.errors import ConfigError

log = logging.getLogger(__name__)

VERSION = 1
MAX_FRAME_BYTES = 64 * 1024
NONCE_BYTES = 32
MAC_BYTES = 32

MSG_HELLO = 1
MSG_CHALLENGE = 2
MSG_OFFER = 3
MSG_ANSWER = 4
MSG_ERROR = 5

_WIRE_ERRORS = ("auth_failure", "busy", "protocol_error", "timeout")

_CONTEXT = b"fabricscope-probe/1"
NODE_ID = re.compile(r"^[A-Za-z0-9._:%\[\]-]{1,253}$")


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


class PeerBusyError(PeerUnreachableError):
    """The host turned the connection away at once (ERROR busy): it holds as many pending
    rendezvous from our address as it admits. Transient: the guest may try again."""


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


def check_node_id(node_id: str) -> None:
    if not NODE_ID.match(node_id):
        raise ConfigError(f"probe node id {node_id!r} is not a host name or address")


# --- framing and proofs -----------------------------------------------------------------


def lp(data: bytes) -> bytes:
    return struct.pack("!H", len(data)) + data


def keyed(secret: bytes, tag: bytes, nonces: bytes, host_id: str, guest_id: str) -> bytes:
    """HMAC(secret, C | lp(tag) | nonces | lp(host_id) | lp(guest_id)); ``nonces`` is the
    prover's own nonce then the other side's (host nonce first for the session key)."""
    msg = lp(_CONTEXT) + lp(tag) + nonces + lp(host_id.encode()) + lp(guest_id.encode())
    return hmac.new(secret, msg, hashlib.sha256).digest()


def mac(key: bytes, tag: bytes, body: bytes) -> bytes:
    return hmac.new(key, lp(tag) + body, hashlib.sha256).digest()


def frame(kind: int, body: bytes) -> bytes:
    return struct.pack("!IBB", 2 + len(body), VERSION, kind) + body


def read_id(body: bytes, start: int, what: str) -> str:
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
    if not NODE_ID.match(text):
        raise ProtocolError(f"{what}: node id is not a host name or address")
    return text


def _peer_error(body: bytes) -> RendezvousError:
    reason = body.decode("ascii", "replace")
    if reason == "auth_failure":
        return AuthError("the peer refused our proof: the shared secrets differ", from_peer=True)
    if reason == "busy":
        return PeerBusyError("the peer has too many pending rendezvous", from_peer=True)
    if reason == "timeout":
        return RendezvousTimeoutError("the peer timed out waiting for us", from_peer=True)
    if reason == "protocol_error":
        return ProtocolError("the peer refused our messages as malformed", from_peer=True)
    return ProtocolError("the peer sent an unknown error", from_peer=True)


def check_length(length: int) -> None:
    """A frame's length field, refused before its body is read when out of bounds."""
    if not 2 <= length <= MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {length} bytes (limit {MAX_FRAME_BYTES})")


def decode(payload: bytes, expect: int) -> bytes:
    """The body of a frame's ``payload`` (version, type, body) of type ``expect``; an ERROR
    frame raises what the peer said, anything else a ProtocolError."""
    if payload[0] != VERSION:
        raise ProtocolError(f"the peer speaks protocol version {payload[0]}, not {VERSION}")
    kind, body = payload[1], payload[2:]
    if kind == MSG_ERROR:
        raise _peer_error(body)
    if kind != expect:
        raise ProtocolError(f"expected message type {expect}, got {kind}")
    return body


def take_frame(buf: bytearray, expect: int) -> bytes | None:
    """The body of the first frame in ``buf`` (removed from it) when it has arrived whole,
    else None (read more); raises as :func:`decode` and :func:`check_length` do."""
    if len(buf) < 4:
        return None
    (length,) = struct.unpack_from("!I", buf)
    check_length(length)
    if len(buf) < 4 + length:
        return None
    payload = bytes(buf[4 : 4 + length])
    del buf[: 4 + length]
    return decode(payload, expect)


class Channel:
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
        check_length(length)
        return decode(self._recv_exact(length), expect)

    def send(self, kind: int, body: bytes) -> None:
        self._arm()
        try:
            self.sock.sendall(frame(kind, body))
        except TimeoutError:
            raise RendezvousTimeoutError("the peer did not read in time") from None
        except OSError as exc:
            raise PeerUnreachableError(f"connection lost: {exc.strerror or exc}") from None


def send_error_quietly(sock: socket.socket, reason: str, peer: str) -> None:
    try:
        sock.settimeout(0.2)
        sock.sendall(frame(MSG_ERROR, reason.encode()))
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


def hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
