"""Probe rendezvous, host side: :class:`RendezvousServer` answers guests' offers.

The protocol is described in :mod:`agent.probe.rendezvous.wire`.

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
import hmac
import logging
import secrets
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

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


def _listen(bind: str, port: int, backlog: int) -> socket.socket:
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
            wire.send_error_quietly(sock, "busy", peer)
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
            wire_reason = _wire_error(exc)
            if wire_reason is not None:
                wire.send_error_quietly(sock, wire_reason, peer)
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
        chan = wire.Channel(sock, self._step, time.monotonic() + self._handshake)
        body = chan.recv(MSG_HELLO)
        nonce_g = body[:NONCE_BYTES]
        guest_id = wire.read_id(body, NONCE_BYTES, "hello")
        if guest_id == self.node_id:
            raise ProtocolError(f"the guest claims our own node id {guest_id}")
        nonce_h = secrets.token_bytes(NONCE_BYTES)
        proof_h = wire.keyed(self._secret, b"host", nonce_h + nonce_g, self.node_id, guest_id)
        chan.send(MSG_CHALLENGE, nonce_h + proof_h + wire.lp(self.node_id.encode()))
        body = chan.recv(MSG_OFFER)
        if len(body) < 2 * MAC_BYTES:
            raise ProtocolError("offer is truncated")
        proof_g, mac = body[:MAC_BYTES], body[MAC_BYTES : 2 * MAC_BYTES]
        payload = body[2 * MAC_BYTES :]
        want = wire.keyed(self._secret, b"guest", nonce_g + nonce_h, self.node_id, guest_id)
        if not hmac.compare_digest(proof_g, want):
            raise AuthError(f"a guest calling itself {guest_id} failed to prove the secret")
        key = wire.keyed(self._secret, b"session", nonce_h + nonce_g, self.node_id, guest_id)
        if not hmac.compare_digest(mac, wire.mac(key, b"offer", payload)):
            raise AuthError(f"the offer from {guest_id} failed its MAC")
        if not self._authenticated(sock):
            raise PeerUnreachableError("displaced by a newer connection")
        offer = Offer.from_json(payload)
        answer = self._answer(offer, guest_id)
        chan.deadline = time.monotonic() + self._step
        out = answer.to_json()
        chan.send(MSG_ANSWER, wire.mac(key, b"answer", out) + out)
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
