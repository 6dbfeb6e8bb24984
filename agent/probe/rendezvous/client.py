"""Probe rendezvous, guest side: :func:`propose` an offer to a host and get its answer.

The protocol is described in :mod:`agent.probe.rendezvous.wire`.
"""

from __future__ import annotations

import hmac
import random
import secrets
import socket
import time

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
    PeerBusyError,
    PeerUnreachableError,
    ProtocolError,
    RendezvousTimeoutError,
)


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
    A host that turns the connection away as busy (it admits only a few pending rendezvous
    per address, and ``--matrix`` offers one per GPU pair at once) is asked again after a
    short, growing, jittered pause, for as long as ``timeout`` allows.
    """
    check_secret(secret)
    wire.check_node_id(node_id)
    deadline = time.monotonic() + timeout
    pause = BUSY_FIRST_PAUSE
    while True:
        try:
            return _propose_once(
                host_addr, port, secret, node_id, offer, deadline, expected_host_id
            )
        except PeerBusyError:
            wait = pause * (0.5 + random.random())
            if time.monotonic() + wait >= deadline:
                raise
            time.sleep(wait)
            pause = min(2 * pause, BUSY_MAX_PAUSE)


#: the pause before asking a busy host again, doubling up to the second
BUSY_FIRST_PAUSE = 0.05
BUSY_MAX_PAUSE = 1.0


def _propose_once(  # noqa: PLR0917
    host_addr: str,
    port: int,
    secret: bytes,
    node_id: str,
    offer: Offer,
    deadline: float,
    expected_host_id: str | None,
) -> Answer:
    where = wire.hostport(host_addr, port)
    timeout = max(0.001, deadline - time.monotonic())
    try:
        sock = socket.create_connection((host_addr, port), timeout=timeout)
    except TimeoutError:
        raise RendezvousTimeoutError(f"connecting to probe rendezvous {where} timed out") from None
    except OSError as exc:
        raise PeerUnreachableError(
            f"cannot connect to probe rendezvous {where}: {exc.strerror or exc}"
        ) from None
    with sock:
        chan = wire.Channel(sock, timeout, deadline)
        nonce_g = secrets.token_bytes(NONCE_BYTES)
        chan.send(MSG_HELLO, nonce_g + wire.lp(node_id.encode()))
        body = chan.recv(MSG_CHALLENGE)
        nonce_h, proof_h = body[:NONCE_BYTES], body[NONCE_BYTES : NONCE_BYTES + MAC_BYTES]
        host_id = wire.read_id(body, NONCE_BYTES + MAC_BYTES, "challenge")
        if nonce_h == nonce_g or host_id == node_id:
            raise ProtocolError(f"{where} reflected our own hello")
        want = wire.keyed(secret, b"host", nonce_h + nonce_g, host_id, node_id)
        if not hmac.compare_digest(proof_h, want):
            wire.send_error_quietly(sock, "auth_failure", where)
            raise AuthError(
                f"probe rendezvous {where} failed to prove the shared secret "
                "(an impostor, or its secret differs from ours)"
            )
        if expected_host_id is not None and host_id != expected_host_id:
            wire.send_error_quietly(sock, "auth_failure", where)
            raise AuthError(f"probe rendezvous {where} is {host_id}, not {expected_host_id}")
        proof_g = wire.keyed(secret, b"guest", nonce_g + nonce_h, host_id, node_id)
        key = wire.keyed(secret, b"session", nonce_h + nonce_g, host_id, node_id)
        payload = offer.to_json()
        chan.send(MSG_OFFER, proof_g + wire.mac(key, b"offer", payload) + payload)
        body = chan.recv(MSG_ANSWER)
        mac, payload = body[:MAC_BYTES], body[MAC_BYTES:]
        if len(mac) != MAC_BYTES or not hmac.compare_digest(mac, wire.mac(key, b"answer", payload)):
            raise AuthError(f"the answer from {where} failed its MAC (altered in transit)")
        answer = Answer.from_json(payload)
        if answer.probe_id != offer.probe_id:
            raise ProtocolError(f"{where} answered probe {answer.probe_id}, not {offer.probe_id}")
        return answer
