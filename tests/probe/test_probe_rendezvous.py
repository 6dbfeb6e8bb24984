"""Probe rendezvous: mutual authentication, offer/answer, refusals, over real TCP sockets.

The raw peers below speak the wire protocol from the module docstring byte by byte, written
from that description rather than from the implementation, so they also check the spec.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.core.errors import ConfigError
from agent.probe.rendezvous.client import propose
from agent.probe.rendezvous.messages import Answer, Offer
from agent.probe.rendezvous.secret import load_secret
from agent.probe.rendezvous.server import RendezvousServer
from agent.probe.rendezvous.wire import (
    MAX_FRAME_BYTES,
    AuthError,
    PeerUnreachableError,
    ProtocolError,
    RendezvousError,
    RendezvousTimeoutError,
)

SECRET = b"correct horse battery staple 42"
OTHER_SECRET = b"incorrect donkey battery staple!"
HOST_ID = "node-a"
GUEST_ID = "node-b"
OFFER = Offer("pair-a-b.7", "all_reduce", "gloo", (1024, 1 << 20), 20, 5)
HELLO, CHALLENGE, OFFER_MSG, ANSWER_MSG, ERROR = 1, 2, 3, 4, 5
WAIT = 3.0  # bound on every wait in this file


# --- the protocol from its description ----------------------------------------------------


def lp(data: bytes) -> bytes:
    return struct.pack("!H", len(data)) + data


def keyed(secret: bytes, tag: bytes, nonces: bytes, host_id: str, guest_id: str) -> bytes:
    msg = lp(b"fabricscope-probe/1") + lp(tag) + nonces + lp(host_id.encode())
    return hmac.new(secret, msg + lp(guest_id.encode()), hashlib.sha256).digest()


def frame(kind: int, body: bytes, version: int = 1) -> bytes:
    return struct.pack("!IBB", 2 + len(body), version, kind) + body


class Raw:
    """A bare TCP peer: sends bytes, reads frames."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.settimeout(WAIT)

    @classmethod
    def connect(cls, port: int, source: str = "127.0.0.1") -> Raw:
        sock = socket.create_connection(
            ("127.0.0.1", port), timeout=WAIT, source_address=(source, 0)
        )
        return cls(sock)

    def send(self, kind: int, body: bytes) -> None:
        self.sock.sendall(frame(kind, body))

    def _exact(self, n: int) -> bytes | None:
        buf = b""
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            buf += chunk
        return buf

    def recv(self) -> tuple[int, bytes] | None:
        """(type, body) of the next frame, or None once the peer closed or reset."""
        head = self._exact(4)
        if head is None:
            return None
        (length,) = struct.unpack("!I", head)
        payload = self._exact(length)
        assert payload is not None and payload[0] == 1
        return payload[1], payload[2:]

    def close(self) -> None:
        self.sock.close()


def wait_for(cond: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


# --- fixtures -----------------------------------------------------------------------------


class Host:
    """A RendezvousServer whose on_offer records what it saw."""

    def __init__(
        self,
        secret: bytes = SECRET,
        max_pending: int = 8,
        step_timeout: float = 5.0,
        handshake_timeout: float = 10.0,
        max_pending_per_address: int = 2,
    ) -> None:
        self.offers: list[tuple[Offer, str]] = []
        self.reply: Callable[[Offer], Answer] = lambda o: Answer.accept(
            o.probe_id, "127.0.0.1", 29500
        )
        self.server = RendezvousServer(
            "127.0.0.1",
            0,
            secret,
            HOST_ID,
            self._on_offer,
            max_pending=max_pending,
            max_pending_per_address=max_pending_per_address,
            step_timeout=step_timeout,
            handshake_timeout=handshake_timeout,
        )
        self.port = self.server.port

    def _on_offer(self, offer: Offer, guest: str) -> Answer:
        self.offers.append((offer, guest))
        return self.reply(offer)

    def refused(self, reason: str) -> int:
        return self.server.stats().refused(reason)

    def refused_total(self) -> int:
        return sum(n for _, n in self.server.stats().refused_total)


@pytest.fixture
def make_host() -> Iterator[Callable[..., Host]]:
    hosts: list[Host] = []

    def make(secret: bytes = SECRET, **kw: float) -> Host:
        hosts.append(Host(secret, **kw))  # type: ignore[arg-type]
        return hosts[-1]

    yield make
    for h in hosts:
        h.server.close()


@pytest.fixture
def host(make_host: Callable[..., Host]) -> Host:
    return make_host()


def authenticate(raw: Raw, secret: bytes = SECRET, guest: str = GUEST_ID) -> tuple[bytes, bytes]:
    """Hello + challenge as a guest; returns (nonce_g, nonce_h) after checking proof_h."""
    nonce_g = secrets.token_bytes(32)
    raw.send(HELLO, nonce_g + lp(guest.encode()))
    got = raw.recv()
    assert got is not None and got[0] == CHALLENGE
    body = got[1]
    nonce_h, proof_h = body[:32], body[32:64]
    assert body[64:] == lp(HOST_ID.encode())
    assert proof_h == keyed(SECRET, b"host", nonce_h + nonce_g, HOST_ID, guest)
    return nonce_g, nonce_h


# --- success ------------------------------------------------------------------------------


def test_mutual_auth_then_offer_accepted(host: Host) -> None:
    answer = propose("127.0.0.1", host.port, SECRET, GUEST_ID, OFFER, WAIT)
    assert answer == Answer("pair-a-b.7", True, "127.0.0.1", 29500, None)
    assert host.offers == [(OFFER, GUEST_ID)]
    wait_for(lambda: host.server.stats().pending == 0)
    stats = host.server.stats()
    assert (stats.accepted_total, host.refused_total()) == (1, 0)


def test_a_declined_offer_comes_back_as_an_answer(host: Host) -> None:
    host.reply = lambda o: Answer.decline(o.probe_id, "gpu_busy")
    answer = propose("127.0.0.1", host.port, SECRET, GUEST_ID, OFFER, WAIT)
    assert (answer.accepted, answer.reason, answer.master_port) == (False, "gpu_busy", None)


def test_a_failing_on_offer_becomes_a_decline(host: Host) -> None:
    def boom(offer: Offer) -> Answer:
        raise RuntimeError("no GPU today")

    host.reply = boom
    answer = propose("127.0.0.1", host.port, SECRET, GUEST_ID, OFFER, WAIT)
    assert (answer.accepted, answer.reason) == (False, "init_failure")


def test_the_wire_format_matches_the_documented_protocol(host: Host) -> None:
    raw = Raw.connect(host.port)
    nonce_g, nonce_h = authenticate(raw)
    key = keyed(SECRET, b"session", nonce_h + nonce_g, HOST_ID, GUEST_ID)
    payload = OFFER.to_json()
    proof_g = keyed(SECRET, b"guest", nonce_g + nonce_h, HOST_ID, GUEST_ID)
    mac = hmac.new(key, lp(b"offer") + payload, hashlib.sha256).digest()
    raw.send(OFFER_MSG, proof_g + mac + payload)
    got = raw.recv()
    assert got is not None and got[0] == ANSWER_MSG
    mac, doc = got[1][:32], got[1][32:]
    assert mac == hmac.new(key, lp(b"answer") + doc, hashlib.sha256).digest()
    assert json.loads(doc) == {
        "accepted": True,
        "master_addr": "127.0.0.1",
        "master_port": 29500,
        "probe_id": "pair-a-b.7",
        "reason": None,
    }
    assert raw.recv() is None  # one offer per connection, then the host closes
    raw.close()


# --- wrong secrets, impostors, replay, reflection -----------------------------------------


def test_server_refuses_a_guest_with_the_wrong_secret(host: Host) -> None:
    raw = Raw.connect(host.port)
    nonce_g, nonce_h = authenticate(raw)  # a guest that skips checking the host
    proof_g = keyed(OTHER_SECRET, b"guest", nonce_g + nonce_h, HOST_ID, GUEST_ID)
    key = keyed(OTHER_SECRET, b"session", nonce_h + nonce_g, HOST_ID, GUEST_ID)
    payload = OFFER.to_json()
    raw.send(
        OFFER_MSG, proof_g + hmac.new(key, lp(b"offer") + payload, "sha256").digest() + payload
    )
    assert raw.recv() == (ERROR, b"auth_failure")
    assert raw.recv() is None
    raw.close()
    wait_for(lambda: host.refused("auth_failure") == 1)
    assert host.offers == []
    assert host.server.stats().accepted_total == 0


def test_a_guest_with_the_wrong_secret_is_refused_and_counted(
    host: Host, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(AuthError) as err:
        propose("127.0.0.1", host.port, OTHER_SECRET, GUEST_ID, OFFER, WAIT)
    assert err.value.reason == "auth_failure"
    wait_for(lambda: host.refused("auth_failure") == 1)
    assert host.offers == []
    for secret in (SECRET, OTHER_SECRET):
        for form in (secret.decode(), secret.hex(), hashlib.sha256(secret).hexdigest()):
            assert form not in caplog.text
    assert "refused 127.0.0.1:" in caplog.text


def test_guest_detects_an_impostor_host_before_offering() -> None:
    """A host without the secret sends a made-up proof; the guest sends it no offer."""
    listener = socket.create_server(("127.0.0.1", 0))
    received: list[tuple[int, bytes] | None] = []

    def impostor() -> None:
        conn, _ = listener.accept()
        raw = Raw(conn)
        hello = raw.recv()
        assert hello is not None and hello[0] == HELLO
        raw.send(CHALLENGE, secrets.token_bytes(64) + lp(HOST_ID.encode()))
        received.extend([raw.recv(), raw.recv()])
        raw.close()

    thread = threading.Thread(target=impostor)
    thread.start()
    with pytest.raises(AuthError, match="failed to prove the shared secret"):
        propose("127.0.0.1", listener.getsockname()[1], SECRET, GUEST_ID, OFFER, WAIT)
    thread.join(WAIT)
    listener.close()
    assert received == [(ERROR, b"auth_failure"), None]


def test_guest_detects_a_real_host_holding_another_secret(make_host: Callable[..., Host]) -> None:
    impostor = make_host(OTHER_SECRET)
    with pytest.raises(AuthError, match="failed to prove the shared secret"):
        propose("127.0.0.1", impostor.port, SECRET, GUEST_ID, OFFER, WAIT)
    assert impostor.offers == []
    wait_for(lambda: impostor.refused("auth_failure") == 1)


def test_guest_checks_the_host_id_when_told_which_host_to_expect(host: Host) -> None:
    with pytest.raises(AuthError, match="is node-a, not node-c"):
        propose("127.0.0.1", host.port, SECRET, GUEST_ID, OFFER, WAIT, expected_host_id="node-c")
    assert host.offers == []


def test_reflecting_the_hosts_proof_back_is_refused(host: Host) -> None:
    raw = Raw.connect(host.port)
    nonce_g = secrets.token_bytes(32)
    raw.send(HELLO, nonce_g + lp(GUEST_ID.encode()))
    got = raw.recv()
    assert got is not None
    proof_h = got[1][32:64]
    raw.send(OFFER_MSG, proof_h + proof_h + OFFER.to_json())
    assert raw.recv() == (ERROR, b"auth_failure")
    raw.close()
    wait_for(lambda: host.refused("auth_failure") == 1)
    assert host.offers == []


def test_replaying_a_captured_transcript_fails(host: Host) -> None:
    """Record what a real guest sent through a relay, then replay it byte for byte."""
    relay = socket.create_server(("127.0.0.1", 0))
    sent: list[bytes] = []

    def pump(src: socket.socket, dst: socket.socket, record: bool) -> None:
        src.settimeout(WAIT)
        while chunk := src.recv(65536):
            if record:
                sent.append(chunk)
            dst.sendall(chunk)
        dst.shutdown(socket.SHUT_WR)

    def run_relay() -> None:
        client, _ = relay.accept()
        upstream = socket.create_connection(("127.0.0.1", host.port), timeout=WAIT)
        back = threading.Thread(target=pump, args=(upstream, client, False))
        back.start()
        pump(client, upstream, True)
        back.join(WAIT)
        client.close()
        upstream.close()

    thread = threading.Thread(target=run_relay)
    thread.start()
    answer = propose("127.0.0.1", relay.getsockname()[1], SECRET, GUEST_ID, OFFER, WAIT)
    thread.join(WAIT)
    relay.close()
    assert answer.accepted
    assert len(b"".join(sent)) > 64 + 32

    raw = Raw.connect(host.port)
    raw.sock.sendall(b"".join(sent))
    got = raw.recv()
    assert got is not None and got[0] == CHALLENGE  # a fresh nonce_h...
    assert raw.recv() == (ERROR, b"auth_failure")  # ...so the old proof no longer fits
    raw.close()
    wait_for(lambda: host.refused("auth_failure") == 1)
    assert host.server.stats().accepted_total == 1
    assert len(host.offers) == 1


def test_an_offer_altered_after_authentication_is_refused(host: Host) -> None:
    raw = Raw.connect(host.port)
    nonce_g, nonce_h = authenticate(raw)
    proof_g = keyed(SECRET, b"guest", nonce_g + nonce_h, HOST_ID, GUEST_ID)
    key = keyed(SECRET, b"session", nonce_h + nonce_g, HOST_ID, GUEST_ID)
    mac = hmac.new(key, lp(b"offer") + OFFER.to_json(), hashlib.sha256).digest()
    tampered = OFFER.to_json().replace(b"1024", b"2048")
    raw.send(OFFER_MSG, proof_g + mac + tampered)
    assert raw.recv() == (ERROR, b"auth_failure")
    raw.close()
    wait_for(lambda: host.refused("auth_failure") == 1)
    assert host.offers == []


@pytest.mark.parametrize("tag", [b"host", b"session"])
def test_a_wrong_guest_proof_is_refused_even_with_a_valid_mac(host: Host, tag: bytes) -> None:
    """The proof check stands on its own, not only behind the offer MAC."""
    raw = Raw.connect(host.port)
    nonce_g, nonce_h = authenticate(raw)
    proof_g = keyed(SECRET, tag, nonce_g + nonce_h, HOST_ID, GUEST_ID)
    key = keyed(SECRET, b"session", nonce_h + nonce_g, HOST_ID, GUEST_ID)
    payload = OFFER.to_json()
    raw.send(
        OFFER_MSG, proof_g + hmac.new(key, lp(b"offer") + payload, "sha256").digest() + payload
    )
    assert raw.recv() == (ERROR, b"auth_failure")
    raw.close()
    wait_for(lambda: host.refused("auth_failure") == 1)
    assert host.offers == []


def test_an_authenticated_but_invalid_offer_is_a_protocol_error(host: Host) -> None:
    raw = Raw.connect(host.port)
    nonce_g, nonce_h = authenticate(raw)
    proof_g = keyed(SECRET, b"guest", nonce_g + nonce_h, HOST_ID, GUEST_ID)
    key = keyed(SECRET, b"session", nonce_h + nonce_g, HOST_ID, GUEST_ID)
    bad = OFFER.to_json().replace(b'"world_size":2', b'"world_size":3')
    raw.send(OFFER_MSG, proof_g + hmac.new(key, lp(b"offer") + bad, hashlib.sha256).digest() + bad)
    assert raw.recv() == (ERROR, b"protocol_error")
    raw.close()
    wait_for(lambda: host.refused("protocol_error") == 1)
    assert host.offers == []


# --- slow, silent, oversized and garbage peers --------------------------------------------


def test_a_silent_client_times_out_without_blocking_others(make_host: Callable[..., Host]) -> None:
    host = make_host(step_timeout=0.6, handshake_timeout=5.0)
    silent = Raw.connect(host.port)
    wait_for(lambda: host.server.stats().pending == 1)
    started = time.monotonic()
    answer = propose("127.0.0.1", host.port, SECRET, GUEST_ID, OFFER, WAIT)
    assert answer.accepted
    assert time.monotonic() - started < 0.5
    assert host.refused("timeout") == 0  # the silent one is still being waited for
    assert silent.recv() == (ERROR, b"timeout")
    assert silent.recv() is None
    silent.close()
    wait_for(lambda: host.refused("timeout") == 1)
    assert host.server.stats().accepted_total == 1


def test_a_trickling_client_hits_the_handshake_deadline(make_host: Callable[..., Host]) -> None:
    host = make_host(step_timeout=0.3, handshake_timeout=0.8)
    raw = Raw.connect(host.port)
    hello = frame(HELLO, secrets.token_bytes(32) + lp(GUEST_ID.encode()))
    started = time.monotonic()
    for byte in hello[:-1]:  # each byte well inside the step timeout, never finishing
        try:
            raw.sock.sendall(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            break
        if host.refused("timeout"):
            break
        time.sleep(0.1)
    wait_for(lambda: host.refused("timeout") == 1)
    assert time.monotonic() - started < 0.8 + 0.5
    raw.close()


def test_an_oversized_frame_is_refused_before_its_body(host: Host) -> None:
    raw = Raw.connect(host.port)
    raw.sock.sendall(struct.pack("!I", MAX_FRAME_BYTES + 1))
    assert raw.recv() == (ERROR, b"protocol_error")
    raw.close()
    wait_for(lambda: host.refused("protocol_error") == 1)


GARBAGE = {
    "http": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "zero_length": struct.pack("!I", 0),
    "other_version": frame(HELLO, secrets.token_bytes(32) + lp(b"node-b"), version=2),
    "unknown_type": frame(9, b"x"),
    "offer_first": frame(OFFER_MSG, b"\0" * 64 + OFFER.to_json()),
    "short_hello": frame(HELLO, b"\0" * 20),
    "id_length_lies": frame(HELLO, b"\0" * 32 + struct.pack("!H", 50) + b"node-b"),
    "id_not_a_host": frame(HELLO, b"\0" * 32 + lp(b"node b; rm -rf /")),
    "id_not_ascii": frame(HELLO, b"\0" * 32 + lp("nöde".encode())),
    "own_id": frame(HELLO, b"\0" * 32 + lp(HOST_ID.encode())),
}


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_garbage_is_refused_as_a_protocol_error(host: Host, name: str) -> None:
    raw = Raw.connect(host.port)
    raw.sock.sendall(GARBAGE[name])
    assert raw.recv() in ((ERROR, b"protocol_error"), None)  # None: reset over unread bytes
    raw.close()
    wait_for(lambda: host.refused("protocol_error") == 1)
    assert host.refused_total() == 1
    assert host.offers == []


def test_a_newcomer_displaces_the_oldest_unauthenticated_connection(
    make_host: Callable[..., Host],
) -> None:
    host = make_host(max_pending=1)
    silent = Raw.connect(host.port)
    wait_for(lambda: host.server.stats().pending == 1)
    # all slots taken by one that has not authenticated: a real guest displaces it
    assert propose("127.0.0.1", host.port, SECRET, GUEST_ID, OFFER, WAIT).accepted
    assert silent.recv() == (ERROR, b"busy")  # told, as a newcomer turned away is
    assert silent.recv() is None
    wait_for(lambda: host.refused("too_many_pending") == 1)
    silent.close()


def test_an_authenticated_peer_is_never_displaced(make_host: Callable[..., Host]) -> None:
    host = make_host(max_pending=1)
    entered, release = threading.Event(), threading.Event()

    def slow(offer: Offer) -> Answer:
        entered.set()
        release.wait(WAIT)
        return Answer.accept(offer.probe_id, "127.0.0.1", 29500)

    host.reply = slow
    answers: list[Answer] = []
    t = threading.Thread(
        target=lambda: answers.append(
            propose("127.0.0.1", host.port, SECRET, GUEST_ID, OFFER, WAIT)
        )
    )
    t.start()
    try:
        assert entered.wait(WAIT)  # authenticated, its offer being answered
        # turned away as busy, asked again for the 1 s it has, still busy: unreachable
        with pytest.raises(PeerUnreachableError, match="too many pending") as err:
            propose("127.0.0.1", host.port, SECRET, "guest-2", OFFER, 1.0)
        assert err.value.reason == "peer_unreachable"
        assert host.refused("too_many_pending") >= 2
    finally:
        release.set()
        t.join(WAIT)
    assert answers[0].accepted


def test_silent_connections_are_displaced_before_one_that_sent_its_hello(
    make_host: Callable[..., Host],
) -> None:
    """A real guest sends its hello with its connection: newcomers displace the connections
    that have sent nothing first, though they are newer, so the guest gets to offer."""
    host = make_host(max_pending=3, max_pending_per_address=1)
    guest = Raw.connect(host.port)  # the oldest...
    nonce_g, nonce_h = authenticate(guest)
    silent = [Raw.connect(host.port, source=f"127.0.0.{i}") for i in (2, 3)]
    wait_for(lambda: host.server.stats().pending == 3)
    newcomers = [Raw.connect(host.port, source=f"127.0.0.{i}") for i in (4, 5)]
    for raw in silent:  # ...yet the silent ones went, told busy
        assert raw.recv() == (ERROR, b"busy")
        assert raw.recv() is None
    wait_for(lambda: host.refused("too_many_pending") == 2)
    proof_g = keyed(SECRET, b"guest", nonce_g + nonce_h, HOST_ID, GUEST_ID)
    key = keyed(SECRET, b"session", nonce_h + nonce_g, HOST_ID, GUEST_ID)
    mac = hmac.new(key, lp(b"offer") + OFFER.to_json(), hashlib.sha256).digest()
    guest.send(OFFER_MSG, proof_g + mac + OFFER.to_json())
    got = guest.recv()
    assert got is not None and got[0] == ANSWER_MSG
    for raw in [guest, *silent, *newcomers]:
        raw.close()


def test_one_address_holds_at_most_its_share(make_host: Callable[..., Host]) -> None:
    host = make_host(max_pending=8, max_pending_per_address=2)
    held = [Raw.connect(host.port, source="127.0.0.3") for _ in range(2)]
    wait_for(lambda: host.server.stats().pending == 2)
    third = Raw.connect(host.port, source="127.0.0.3")  # turned away at once, no thread
    assert third.recv() == (ERROR, b"busy")
    assert host.server.stats().pending == 2
    assert host.refused("too_many_pending") == 1
    # another address still gets in and through
    assert propose("127.0.0.1", host.port, SECRET, GUEST_ID, OFFER, WAIT).accepted
    for raw in [*held, third]:
        raw.close()


def test_a_busy_host_is_asked_again_until_every_offer_is_through(
    make_host: Callable[..., Host],
) -> None:
    """``--matrix`` offers one pair per GPU at once from one address; the host admits two
    pending rendezvous per address and turns the rest away as busy. Each guest asks again
    after a short pause: all six offers are answered, and the host did turn some away."""
    host = make_host(max_pending=8, max_pending_per_address=2)
    slow = host.reply

    def reply(offer: Offer) -> Answer:
        time.sleep(0.3)  # keep the admitted two pending while the others arrive
        return slow(offer)

    host.reply = reply
    answers: list[Answer] = []
    errors: list[Exception] = []

    def guest(i: int) -> None:
        offer = Offer(f"pair-a-b.{i}", "sendrecv", "gloo", (1024,), 20, 5)
        try:
            answers.append(propose("127.0.0.1", host.port, SECRET, GUEST_ID, offer, 10.0))
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guest, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20.0)
    assert errors == []
    assert sorted(a.probe_id for a in answers) == [f"pair-a-b.{i}" for i in range(6)]
    assert all(a.accepted for a in answers)
    assert host.refused("too_many_pending") > 0


def test_close_cuts_in_flight_connections(make_host: Callable[..., Host]) -> None:
    host = make_host(step_timeout=30.0, handshake_timeout=30.0)
    silent = Raw.connect(host.port)
    wait_for(lambda: host.server.stats().pending == 1)
    started = time.monotonic()
    host.server.close()
    assert time.monotonic() - started < 1.0
    assert host.server.stats().pending == 0
    assert silent.recv() is None
    silent.close()
    with pytest.raises(PeerUnreachableError):
        propose("127.0.0.1", host.port, SECRET, GUEST_ID, OFFER, WAIT)


# --- guest-side failures ------------------------------------------------------------------


def test_propose_to_a_closed_port_is_peer_unreachable() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    with pytest.raises(PeerUnreachableError, match=f"127.0.0.1:{port}") as err:
        propose("127.0.0.1", port, SECRET, GUEST_ID, OFFER, WAIT)
    assert err.value.reason == "peer_unreachable"


def test_propose_to_a_silent_host_times_out() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        started = time.monotonic()
        with pytest.raises(RendezvousTimeoutError) as err:
            propose("127.0.0.1", listener.getsockname()[1], SECRET, GUEST_ID, OFFER, 0.3)
        assert time.monotonic() - started < 1.5
    assert err.value.reason == "timeout"


# --- binding ------------------------------------------------------------------------------


def test_a_taken_port_is_a_config_error_naming_the_address() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError) as err:
            RendezvousServer(
                "127.0.0.1",
                port,
                SECRET,
                HOST_ID,
                lambda o, g: Answer.decline(o.probe_id, "gpu_busy"),
            )
    assert str(err.value).startswith(f"probe port 127.0.0.1:{port} is already in use")


def test_the_server_listens_on_the_given_address_only(host: Host) -> None:
    # 127.0.0.2 is this host too: a wildcard listener would answer there
    with pytest.raises(PeerUnreachableError):
        propose("127.0.0.2", host.port, SECRET, GUEST_ID, OFFER, WAIT)
    assert propose("127.0.0.1", host.port, SECRET, GUEST_ID, OFFER, WAIT).accepted


@pytest.mark.parametrize(
    ("bind", "message"),
    [
        ("", "probe bind address is empty"),
        ("192.0.2.1", "probe bind address 192.0.2.1 is not an address of this node"),
    ],
)
def test_bad_bind_addresses_are_config_errors(bind: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RendezvousServer(
            bind, 0, SECRET, HOST_ID, lambda o, g: Answer.decline(o.probe_id, "gpu_busy")
        )


def test_a_short_secret_or_a_bad_node_id_is_refused_up_front() -> None:
    with pytest.raises(ConfigError, match=r"16\.\.4096 bytes"):
        propose("127.0.0.1", 1, b"short", GUEST_ID, OFFER, WAIT)
    with pytest.raises(ConfigError, match="node id 'a b'"):
        propose("127.0.0.1", 1, SECRET, "a b", OFFER, WAIT)


# --- the secret file ----------------------------------------------------------------------


def write_secret(path: Path, data: bytes, mode: int = 0o600) -> str:
    path.write_bytes(data)
    os.chmod(path, mode)
    return str(path)


HINT = "e.g. head -c 32 /dev/urandom | base64 > {p} && chmod 600 {p}"


@pytest.mark.parametrize(
    ("data", "mode", "message"),
    [
        (b"", 0o600, "probe secret file {p} is empty; fill it, " + HINT),
        (b"\n", 0o600, "probe secret file {p} is empty; fill it, " + HINT),
        (
            b"hunter2-hunter2\n",
            0o600,
            "probe secret file {p} is shorter than 16 bytes; use a longer secret, " + HINT,
        ),
        (
            b"a-perfectly-long-secret-value",
            0o644,
            "probe secret file {p} is readable by every user (mode 0644); run: chmod 600 {p} "
            "(for a Kubernetes Secret volume set defaultMode: 0400)",
        ),
        (b"x" * 4097, 0o600, "probe secret file {p} is longer than 4096 bytes"),
    ],
    ids=["empty", "only_newline", "short", "world_readable", "long"],
)
def test_bad_secret_files_are_config_errors(
    tmp_path: Path, data: bytes, mode: int, message: str
) -> None:
    path = write_secret(tmp_path / "secret", data, mode)
    with pytest.raises(ConfigError) as err:
        load_secret(path)
    assert str(err.value) == message.format(p=path)
    if data.strip():
        assert data.strip().decode()[:15] not in str(err.value)


def test_a_missing_secret_file_is_a_config_error(tmp_path: Path) -> None:
    path = str(tmp_path / "nope")
    with pytest.raises(ConfigError) as err:
        load_secret(path)
    assert str(err.value) == f"probe secret file {path} does not exist; create it, " + HINT.format(
        p=path
    )


def test_a_directory_is_not_a_secret_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_secret(str(tmp_path))
    assert str(err.value) == f"probe secret file {tmp_path} is not a regular file"


@pytest.mark.parametrize(
    ("data", "secret"),
    [
        (b"0123456789abcdef\n", b"0123456789abcdef"),
        (b"0123456789abcdef\r\n", b"0123456789abcdef"),
        (b"0123456789abcdef\n\n", b"0123456789abcdef\n"),  # one newline only
        (b" 0123456789abcdef ", b" 0123456789abcdef "),
    ],
)
def test_secret_file_content_strips_one_trailing_newline(
    tmp_path: Path, data: bytes, secret: bytes
) -> None:
    assert load_secret(write_secret(tmp_path / "s", data, 0o640)) == secret


# --- offer and answer documents -----------------------------------------------------------


def test_offer_and_answer_round_trip() -> None:
    assert Offer.from_json(OFFER.to_json()) == OFFER
    for answer in (Answer.accept("p", "fe80::1%ib0", 1), Answer.decline("p", "init_failure")):
        assert Answer.from_json(answer.to_json()) == answer


def offer_doc(**changes: object) -> bytes:
    doc: dict[str, object] = json.loads(OFFER.to_json())
    doc.update(changes)
    kept = {k: v for k, v in doc.items() if v is not DROP}
    return json.dumps(kept, separators=(",", ":")).encode()


DROP = object()

BAD_OFFERS = {
    "extra_field": offer_doc(extra=1),
    "missing_field": offer_doc(warmup=DROP),
    "bool_as_int": offer_doc(iterations=True),
    "float_as_int": offer_doc(iterations=20.0),
    "world_size_3": offer_doc(world_size=3),
    "guest_rank_0": offer_doc(guest_rank=0),
    "unknown_kind": offer_doc(kind="all_gather"),
    "unknown_backend": offer_doc(backend="mpi"),
    "no_sizes": offer_doc(sizes_bytes=[]),
    "negative_size": offer_doc(sizes_bytes=[-1]),
    "huge_size": offer_doc(sizes_bytes=[1 << 40]),
    "sizes_not_list": offer_doc(sizes_bytes=1024),
    "bad_probe_id": offer_doc(probe_id="../etc"),
    "zero_iterations": offer_doc(iterations=0),
    "nan": offer_doc().replace(b'"warmup":5', b'"warmup":NaN'),
    "duplicate_key": offer_doc().replace(b"{", b'{"kind":"latency",', 1),
    "not_object": b"[1, 2]",
    "not_utf8": b'{"probe_id":"\xff"}',
    "deep": b"[" * 50_000 + b"]" * 50_000,
    "empty": b"",
}


@pytest.mark.parametrize("name", sorted(BAD_OFFERS))
def test_malformed_offers_are_protocol_errors(name: str) -> None:
    with pytest.raises(ProtocolError) as err:
        Offer.from_json(BAD_OFFERS[name])
    assert isinstance(err.value, RendezvousError)


BAD_ANSWERS = {
    "accepted_without_port": b'{"probe_id":"p","accepted":true,"master_addr":"a",'
    b'"master_port":null,"reason":null}',
    "accepted_with_reason": b'{"probe_id":"p","accepted":true,"master_addr":"a",'
    b'"master_port":1,"reason":"gpu_busy"}',
    "declined_with_port": b'{"probe_id":"p","accepted":false,"master_addr":null,'
    b'"master_port":1,"reason":"gpu_busy"}',
    "unknown_reason": b'{"probe_id":"p","accepted":false,"master_addr":null,'
    b'"master_port":null,"reason":"tired"}',
    "accepted_as_int": b'{"probe_id":"p","accepted":1,"master_addr":"a",'
    b'"master_port":1,"reason":null}',
    "port_out_of_range": b'{"probe_id":"p","accepted":true,"master_addr":"a",'
    b'"master_port":65536,"reason":null}',
    "addr_with_space": b'{"probe_id":"p","accepted":true,"master_addr":"a b",'
    b'"master_port":1,"reason":null}',
}


@pytest.mark.parametrize("name", sorted(BAD_ANSWERS))
def test_malformed_answers_are_protocol_errors(name: str) -> None:
    with pytest.raises(ProtocolError):
        Answer.from_json(BAD_ANSWERS[name])


def test_offers_validate_on_construction() -> None:
    with pytest.raises(ValueError, match="world_size must be 2"):
        Offer("p", "all_reduce", "nccl", (1,), 1, 0, world_size=4)
