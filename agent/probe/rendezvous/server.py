"""Probe rendezvous, host side: :class:`RendezvousServer` answers guests' offers.

The protocol is described in :mod:`agent.probe.rendezvous.wire`.

One thread owns the listener and every connection until its peer has proved the secret:
accepting, reading the hello, sending the challenge and checking the offer's proof are
non-blocking steps on a selector, so a connection that has not authenticated costs a
socket and a few hundred bytes, never a thread. Only an authenticated offer gets a thread,
which asks ``on_offer`` and sends the answer.

Limits, so that no number of silent, trickling or reconnecting clients keeps a real peer's
offer from being answered:

- every read waits at most ``step_timeout`` and the handshake (accept to offer: the
  deadline for proving the secret) at most ``handshake_timeout`` (2 s; a real guest proves
  it one round trip after its hello); then the connection is closed (ERROR timeout);
- one client, an IPv4 address or an IPv6 /64 (:func:`agent.core.clientaddr.client_key`),
  holds at most ``max_pending_per_address`` connections; a further one gets ERROR busy at
  once (the guest asks again after a pause);
- all connections together are at most ``max_pending``; a newcomer then displaces a
  connection that has not authenticated: one that has not sent a hello yet before one
  that has, from the client holding the most, the oldest first. A peer that has proved the
  secret is never displaced, and a real guest, which sends its hello with its connection,
  is displaced only when every other connection has sent one too; a displaced connection
  is told ``busy``, as a newcomer turned away is, so a real guest asks again (within its
  timeout) rather than recording the host unreachable;
- a client that has proved the secret (within the last ``PROVEN_SECONDS``; the latest
  ``MAX_PROVEN`` clients remembered) is never displaced by a newcomer from a client that has
  not: a newcomer that finds only such connections to displace is told ``busy``. Secretless
  connections from any number of addresses, however well-formed their hellos and however
  slowly the real guest answers its challenge, never cut a guest that has proved the secret
  before (its first rendezvous is protected by the ranking above only);
- the listen queue is the kernel's longest (``SOMAXCONN``), and a wake-up of the listener
  accepts up to 64 connections: clients reconnecting in a loop do not fill it, so a real
  guest's SYN is not dropped (a dropped SYN costs it 1 s, then 3 s, then 7 s).
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import logging
import secrets
import selectors
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.core.clientaddr import client_key
from agent.core.errors import ConfigError
from agent.probe.rendezvous import wire
from agent.probe.rendezvous.messages import Answer, Offer
from agent.probe.rendezvous.secret import check_secret
from agent.probe.rendezvous.wire import (
    MAC_BYTES,
    MSG_ANSWER,
    MSG_CHALLENGE,
    MSG_HELLO,
    MSG_OFFER,
    NONCE_BYTES,
    AuthError,
    PeerUnreachableError,
    ProtocolError,
    RendezvousError,
    RendezvousTimeoutError,
)

log = logging.getLogger(__name__)

#: why a server refused a connection (``RendezvousStats.refused_total``)
REFUSAL_REASONS = ("auth_failure", "disconnected", "protocol_error", "timeout", "too_many_pending")


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


def _listen(bind: str, port: int) -> socket.socket:
    if not bind:
        raise ConfigError(
            "probe bind address is empty: give this node's address "
            "(0.0.0.0 or :: listens on every address, but only when asked for)"
        )
    if not 0 <= port <= 65535:
        raise ConfigError(f"probe port {port} is not 0..65535")
    where = wire.hostport(bind, port)
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
        sock.listen(socket.SOMAXCONN)
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


#: connection stages: waiting for the hello, waiting for the offer, answering (authenticated)
_HELLO, _OFFER, _ANSWERING = 0, 1, 2
#: connections accepted per wake-up of the listener before other events get their turn
_ACCEPT_BATCH = 64
#: how long a client that proved the secret stays protected from secretless newcomers
PROVEN_SECONDS = 600.0
#: clients remembered as having proved the secret (the least recent forgotten first)
MAX_PROVEN = 4096


@dataclass(slots=True, eq=False)
class _Conn:
    """One connection: its client (``address``, the limits' key), where its handshake is,
    and what the handshake has established so far."""

    sock: socket.socket
    peer: str
    address: str
    opened: float
    #: the handshake's deadline and the current read's
    deadline: float
    step_deadline: float
    stage: int = _HELLO
    buf: bytearray = field(default_factory=bytearray)
    guest_id: str = ""
    nonce_g: bytes = b""
    nonce_h: bytes = b""
    thread: threading.Thread | None = None


class RendezvousServer:
    """Host side: accepts guests on ``bind:port`` in a background thread until closed.

    Connections are handled as the module doc says: at most ``max_pending`` at once and
    ``max_pending_per_address`` from one client; each read waits at most ``step_timeout``
    seconds and the handshake (accept to offer) at most ``handshake_timeout``. An
    authenticated offer is passed to ``on_offer(offer, guest_id)`` (``guest_id``: the node
    id the guest proved) on a thread of its own, whose Answer is sent back; if it raises,
    the guest gets a decline with reason ``init_failure``. Listening starts in the
    constructor: a taken port or a foreign address is a ConfigError there.
    """

    def __init__(
        self,
        bind: str,
        port: int,
        secret: bytes,
        node_id: str,
        on_offer: Callable[[Offer, str], Answer],
        *,
        max_pending: int = 64,
        max_pending_per_address: int = 2,
        step_timeout: float = 5.0,
        handshake_timeout: float = 2.0,
    ) -> None:
        check_secret(secret)
        wire.check_node_id(node_id)
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
        #: connections still proving themselves (the selector thread's), oldest first
        self._pending: dict[socket.socket, _Conn] = {}
        #: authenticated connections being answered on threads of their own
        self._answering: dict[socket.socket, _Conn] = {}
        #: connections per client, both kinds together
        self._per_address: dict[str, int] = {}
        #: clients that proved the secret, and when last (least recent first)
        self._proven: OrderedDict[str, float] = OrderedDict()
        self._closed = False
        self._listener = _listen(bind, port)
        self.port: int = self._listener.getsockname()[1]
        self.bind = bind
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel = selectors.DefaultSelector()
        self._thread = threading.Thread(
            target=self._serve, name=f"probe-rendezvous:{self.port}", daemon=True
        )
        self._thread.start()
        log.info("probe rendezvous listening on %s", wire.hostport(bind, self.port))

    def __enter__(self) -> RendezvousServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> RendezvousStats:
        with self._lock:
            return RendezvousStats(
                accepted_total=self._accepted,
                refused_total=tuple(sorted(self._refused.items())),
                pending=len(self._pending) + len(self._answering),
            )

    def close(self, timeout: float = 2.0) -> None:
        """Stop accepting, cut every connection, wait for the threads."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake_w.send(b"x")
        self._thread.join(timeout)
        with self._lock:
            answering = list(self._answering.values())
        for conn in answering:
            _cut(conn.sock)
        for conn in answering:
            if conn.thread is not None:
                conn.thread.join(timeout)
        self._wake_r.close()
        self._wake_w.close()

    # -- the selector thread ---------------------------------------------------------------

    def _serve(self) -> None:
        sel = self._sel
        sel.register(self._listener, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        try:
            while True:
                now = time.monotonic()
                with self._lock:
                    due = min(
                        (min(c.deadline, c.step_deadline) for c in self._pending.values()),
                        default=now + 1.0,
                    )
                for key, _ in sel.select(max(0.0, min(due - now, 1.0))):
                    if key.fileobj is self._wake_r:
                        return
                    if key.fileobj is self._listener:
                        self._accept()
                    else:
                        self._readable(key.data)
                self._expire(time.monotonic())
        finally:
            self._listener.close()
            with self._lock:
                pending = list(self._pending.values())
            for conn in pending:
                self._drop(conn)
            sel.close()

    def _accept(self) -> None:
        for _ in range(_ACCEPT_BATCH):
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE: back off rather than spin
                log.error("probe rendezvous: accept failed: %s", exc)
                time.sleep(0.1)
                return
            self._admit(sock, _describe(addr), client_key(addr))

    def _admit(self, sock: socket.socket, peer: str, address: str) -> None:
        now = time.monotonic()
        conn = _Conn(sock, peer, address, now, now + self._handshake, now + self._step)
        with self._lock:
            victim: _Conn | None = None
            admitted = self._per_address.get(address, 0) < self._max_per_address
            if admitted and len(self._pending) + len(self._answering) >= self._max_pending:
                victim = self._victim(self._has_proven(address, now))
                admitted = victim is not None
            if admitted:
                self._pending[sock] = conn
                self._per_address[address] = self._per_address.get(address, 0) + 1
        if victim is not None:
            # counted before its peer can hear of it; told busy, as a newcomer turned away
            # is, so that a real guest displaced before it proved the secret asks again
            # instead of recording the host unreachable
            self._refuse(victim, "too_many_pending", "displaced by a newer connection")
            _tell_busy(victim.sock)
            self._drop(victim)
        if not admitted:
            self._refuse(conn, "too_many_pending", "too many pending rendezvous")
            _refuse_busy(sock)
            return
        sock.setblocking(False)
        self._sel.register(sock, selectors.EVENT_READ, conn)

    def _has_proven(self, address: str, now: float) -> bool:
        """Under the lock: the client proved the secret within ``PROVEN_SECONDS``."""
        when = self._proven.get(address)
        return when is not None and now - when < PROVEN_SECONDS

    def _victim(self, newcomer_proven: bool) -> _Conn | None:
        """Under the lock: the connection a newcomer displaces (module doc), or None.
        A newcomer from a client that has not proved the secret never displaces a connection
        from one that has.

        A connection whose hello is already in its receive buffer counts as having sent one:
        within one batch of accepts the selector has not read it yet, and displacing it then
        would cut a real guest for a silent newcomer (seen under a reconnecting flood)."""
        counts = self._per_address
        now = time.monotonic()
        ranked = sorted(
            (
                c
                for c in self._pending.values()
                if newcomer_proven or not self._has_proven(c.address, now)
            ),
            key=lambda c: (c.stage, -counts[c.address], c.opened),
        )
        for conn in ranked:
            if conn.stage != _HELLO or not _has_bytes_waiting(conn.sock):
                return conn
        return ranked[0] if ranked else None

    def _readable(self, conn: _Conn) -> None:
        if self._pending.get(conn.sock) is not conn:
            return  # displaced or failed earlier in this same round of events
        try:
            chunk = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._fail(conn, PeerUnreachableError(f"connection lost: {exc.strerror or exc}"))
            return
        if not chunk:
            self._fail(conn, PeerUnreachableError("the peer closed the connection"))
            return
        conn.buf += chunk
        conn.step_deadline = time.monotonic() + self._step
        try:
            while conn.stage != _ANSWERING:
                body = wire.take_frame(conn.buf, MSG_HELLO if conn.stage == _HELLO else MSG_OFFER)
                if body is None:
                    return
                if conn.stage == _HELLO:
                    self._hello(conn, body)
                else:
                    self._offer(conn, body)
        except RendezvousError as exc:
            self._fail(conn, exc)

    def _hello(self, conn: _Conn, body: bytes) -> None:
        conn.nonce_g = body[:NONCE_BYTES]
        conn.guest_id = wire.read_id(body, NONCE_BYTES, "hello")
        if conn.guest_id == self.node_id:
            raise ProtocolError(f"the guest claims our own node id {conn.guest_id}")
        conn.nonce_h = secrets.token_bytes(NONCE_BYTES)
        proof_h = wire.keyed(
            self._secret, b"host", conn.nonce_h + conn.nonce_g, self.node_id, conn.guest_id
        )
        out = wire.frame(MSG_CHALLENGE, conn.nonce_h + proof_h + wire.lp(self.node_id.encode()))
        try:
            # ~100 bytes into a fresh connection's empty send buffer: taken whole
            sent = conn.sock.send(out)
        except OSError as exc:
            raise PeerUnreachableError(f"connection lost: {exc.strerror or exc}") from None
        if sent != len(out):
            raise PeerUnreachableError("the peer does not read")
        conn.stage = _OFFER

    def _offer(self, conn: _Conn, body: bytes) -> None:
        if len(body) < 2 * MAC_BYTES:
            raise ProtocolError("offer is truncated")
        proof_g, mac = body[:MAC_BYTES], body[MAC_BYTES : 2 * MAC_BYTES]
        payload = body[2 * MAC_BYTES :]
        nonces_gh, nonces_hg = conn.nonce_g + conn.nonce_h, conn.nonce_h + conn.nonce_g
        want = wire.keyed(self._secret, b"guest", nonces_gh, self.node_id, conn.guest_id)
        if not hmac.compare_digest(proof_g, want):
            raise AuthError(f"a guest calling itself {conn.guest_id} failed to prove the secret")
        key = wire.keyed(self._secret, b"session", nonces_hg, self.node_id, conn.guest_id)
        if not hmac.compare_digest(mac, wire.mac(key, b"offer", payload)):
            raise AuthError(f"the offer from {conn.guest_id} failed its MAC")
        # authenticated: never displaced from now on; answered on a thread of its own
        self._sel.unregister(conn.sock)
        conn.stage = _ANSWERING
        conn.thread = threading.Thread(
            target=self._answer_thread,
            args=(conn, payload, key),
            name=f"probe-rendezvous {conn.peer}",
            daemon=True,
        )
        with self._lock:
            del self._pending[conn.sock]
            self._answering[conn.sock] = conn
            self._proven[conn.address] = time.monotonic()
            self._proven.move_to_end(conn.address)
            while len(self._proven) > MAX_PROVEN:
                self._proven.popitem(last=False)
        conn.thread.start()

    def _expire(self, now: float) -> None:
        with self._lock:
            late = [c for c in self._pending.values() if now >= min(c.deadline, c.step_deadline)]
        for conn in late:
            if now >= conn.deadline:
                self._fail(conn, RendezvousTimeoutError("the exchange ran out of time"))
            else:
                self._fail(conn, RendezvousTimeoutError("the peer sent nothing in time"))

    def _fail(self, conn: _Conn, exc: RendezvousError) -> None:
        """Count and close a connection still proving itself (the selector thread's)."""
        self._refuse(conn, _refusal_reason(exc), str(exc))
        reason = _wire_error(exc)
        if reason is not None:
            _send_quietly(conn.sock, wire.frame(wire.MSG_ERROR, reason.encode()))
        self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        """Forget and close a connection of the selector thread."""
        with self._lock:
            if self._pending.pop(conn.sock, None) is None:
                return
            self._forget(conn)
        with contextlib.suppress(KeyError, ValueError):  # not registered; selector closed
            self._sel.unregister(conn.sock)
        conn.sock.close()

    def _forget(self, conn: _Conn) -> None:
        """Under the lock: one connection less for its client."""
        left = self._per_address[conn.address] - 1
        if left:
            self._per_address[conn.address] = left
        else:
            del self._per_address[conn.address]

    # -- authenticated: one thread per offer -----------------------------------------------

    def _answer_thread(self, conn: _Conn, payload: bytes, key: bytes) -> None:
        sock = conn.sock
        try:
            sock.setblocking(True)
            offer = Offer.from_json(payload)
            answer = self._answer(offer, conn.guest_id)
            out = answer.to_json()
            chan = wire.Channel(sock, self._step, time.monotonic() + self._step)
            chan.send(MSG_ANSWER, wire.mac(key, b"answer", out) + out)
        except RendezvousError as exc:
            self._refuse(conn, _refusal_reason(exc), str(exc))
            reason = _wire_error(exc)
            if reason is not None:
                wire.send_error_quietly(sock, reason, conn.peer)
        except Exception:
            log.exception("probe rendezvous with %s failed unexpectedly", conn.peer)
            self._refuse(conn, "protocol_error", "internal error")
        else:
            with self._lock:
                self._accepted += 1
            log.debug(
                "probe rendezvous: %s (%s) offered %s %s; %s",
                conn.guest_id,
                conn.peer,
                offer.kind,
                offer.probe_id,
                "accepted" if answer.accepted else f"declined ({answer.reason})",
            )
        finally:
            sock.close()
            with self._lock:
                if self._answering.pop(sock, None) is not None:
                    self._forget(conn)

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

    def _refuse(self, conn: _Conn, reason: str, why: str) -> None:
        with self._lock:
            self._refused[reason] += 1
            first = (conn.address, reason) not in self._warned
            if first:
                if len(self._warned) >= 1024:
                    self._warned.clear()
                self._warned.add((conn.address, reason))
        # warn once per (client, reason); a scanner or a retrying peer must not flood logs
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "probe rendezvous: refused %s (%s): %s",
            conn.peer,
            reason,
            why,
        )


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    """Send what the socket takes now (an ERROR frame into an all but empty buffer)."""
    try:
        sock.send(data, socket.MSG_DONTWAIT)
    except OSError as exc:
        log.debug("probe rendezvous: could not send an error: %s", exc)


def _tell_busy(sock: socket.socket) -> None:
    """ERROR busy, before the socket is closed. What the client already sent is read first
    (one non-blocking read), so that closing does not reset the connection and destroy the
    ERROR before the guest reads it (it asks again on busy, not on a reset)."""
    with contextlib.suppress(OSError):  # nothing sent yet, or gone: nothing to read
        sock.recv(65536, socket.MSG_DONTWAIT)
    _send_quietly(sock, wire.frame(wire.MSG_ERROR, b"busy"))


def _refuse_busy(sock: socket.socket) -> None:
    """ERROR busy and close, at once (see :func:`_tell_busy`)."""
    _tell_busy(sock)
    sock.close()


def _has_bytes_waiting(sock: socket.socket) -> bool:
    """Whether a non-blocking socket has bytes to read (or its peer closed it: not waiting)."""
    try:
        return bool(sock.recv(1, socket.MSG_PEEK))
    except OSError:  # BlockingIOError (nothing waiting) or a broken connection
        return False


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


def _wire_error(exc: RendezvousError) -> str | None:
    if exc.from_peer or isinstance(exc, PeerUnreachableError):
        return None
    if isinstance(exc, AuthError):
        return "auth_failure"
    if isinstance(exc, RendezvousTimeoutError):
        return "timeout"
    return "protocol_error"


def _describe(addr: object) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        return wire.hostport(str(addr[0]), int(addr[1]))
    return str(addr)
