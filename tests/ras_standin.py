"""A stand-in for NCCL's RAS client port: a real TCP server on 127.0.0.1 (an ephemeral port)
speaking the protocol of NCCL's ``src/ras/client_support.cc`` (``CLIENT PROTOCOL`` ->
``SERVER PROTOCOL 2``, ``TIMEOUT n`` -> ``OK``, ``SET FORMAT json`` -> ``OK``, ``STATUS`` ->
the answer, then close), and the ways a hostile or broken one misbehaves.

``answers`` are replayed in order, one per ``STATUS`` (the last repeats): recorded answers
of a real job (tests/fixtures/ras/) or answers a test builds with :func:`status_json`, which
writes NCCL's JSON layout (synthetic values, for logic a recording cannot show on demand).

Behaviours (``behaviour=``):
    good            as NCCL
    silent          accepts, reads, never writes (a SIGSTOPped process's socket)
    slow            answers the handshake, then trickles the answer a byte every ``delay``
    endless         answers the handshake, then writes without end until the client leaves
    huge            as endless, in big JSON-looking chunks
    wrong_protocol  ``SERVER PROTOCOL 3``
    not_ras         a line that is not the protocol (an HTTP server's answer)
    no_json         ``SET FORMAT json`` -> ``ERROR: Unknown command`` (NCCL before 2.28.7)
    reset           half the answer, then a TCP reset
    close_early     half the answer, then a clean close

Every connection's thread ends when the client leaves or :meth:`close` is called; nothing
binds beyond 127.0.0.1.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Sequence
from types import TracebackType

BEHAVIOURS = (
    "good",
    "silent",
    "slow",
    "endless",
    "huge",
    "wrong_protocol",
    "not_ras",
    "no_json",
    "reset",
    "close_early",
)


class RasStandIn:
    def __init__(
        self,
        answers: Sequence[bytes] = (),
        *,
        behaviour: str = "good",
        delay: float = 0.5,
    ) -> None:
        assert behaviour in BEHAVIOURS, behaviour
        self.answers = list(answers)
        self.behaviour = behaviour
        self.delay = delay
        self.statuses = 0  # STATUS commands received
        self.connections = 0
        self.commands: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self.port: int = self._sock.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, daemon=True)
        self._accept.start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set_answers(self, answers: Sequence[bytes]) -> None:
        with self._lock:
            self.answers = list(answers)
            self.statuses = 0

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
            t = threading.Thread(target=self._handle, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _answer(self) -> bytes:
        with self._lock:
            i = self.statuses
            self.statuses += 1
            if not self.answers:
                return b"{}"
            return self.answers[min(i, len(self.answers) - 1)]

    def _send(self, conn: socket.socket, data: bytes) -> bool:
        try:
            conn.sendall(data)
        except OSError:
            return False
        return True

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(0.2)
        buf = b""
        try:
            while not self._stop.is_set():
                if b"\n" not in buf:
                    try:
                        chunk = conn.recv(4096)
                    except TimeoutError:
                        continue
                    if not chunk:
                        return
                    buf += chunk
                    continue
                line, _, buf = buf.partition(b"\n")
                cmd = line.rstrip(b"\r").decode("ascii", "replace")
                with self._lock:
                    self.commands.append(cmd)
                if self.behaviour == "silent":
                    continue
                if not self._command(conn, cmd.lower()):
                    return
        finally:
            conn.close()

    def _command(self, conn: socket.socket, cmd: str) -> bool:
        """Answer one command; False when the connection is done."""
        b = self.behaviour
        if cmd.startswith("client protocol "):
            if b == "wrong_protocol":
                return self._send(conn, b"SERVER PROTOCOL 3\n")
            if b == "not_ras":
                self._send(conn, b"HTTP/1.1 400 Bad Request\r\n\r\n")
                return False
            return self._send(conn, b"SERVER PROTOCOL 2\n")
        if cmd.startswith("timeout "):
            return self._send(conn, b"OK\n")
        if cmd.startswith("set format "):
            if b == "no_json":
                return self._send(conn, f"ERROR: Unknown command {cmd}\n".encode())
            return self._send(conn, b"OK\n")
        if cmd in ("status", "verbose status"):
            self._status(conn)
            return False
        return self._send(conn, f"ERROR: Unknown command {cmd}\n".encode())

    def _status(self, conn: socket.socket) -> None:
        b = self.behaviour
        answer = self._answer()
        if b == "slow":
            for byte in answer:
                if self._stop.wait(self.delay) or not self._send(conn, bytes([byte])):
                    return
            return
        if b in ("endless", "huge"):
            chunk = b" " * 65536 if b == "endless" else b'{"rank": 0, "host": "10.0.0.1"},' * 4096
            deadline = time.monotonic() + 120  # bounded, whatever the client does
            while not self._stop.is_set() and time.monotonic() < deadline:
                if not self._send(conn, chunk):
                    return
            return
        if b in ("reset", "close_early"):
            self._send(conn, answer[: len(answer) // 2])
            if b == "reset":
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return
        self._send(conn, answer)

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        self._accept.join(5)
        for t in self._threads:
            t.join(5)

    def __enter__(self) -> RasStandIn:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# -- answers in NCCL's layout (synthetic values) ----------------------------------------------

FUNCS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")


def rank_entry(
    rank: int,
    *,
    host: str = "10.0.0.1",
    pid: int | None = None,
    gpu: int | None = None,
    allreduce: int = 0,
    async_error: int = 0,
    abort: bool = False,
) -> dict[str, object]:
    return {
        "rank": rank,
        "host": host,
        "pid": 1000 + rank if pid is None else pid,
        "cuda_dev": rank if gpu is None else gpu,
        "nvml_dev": rank if gpu is None else gpu,
        "status": {
            "init_state": 0,
            "async_error": async_error,
            "finalize_called": False,
            "destroy_flag": False,
            "abort_flag": abort,
        },
        "collective_counts": {f: (allreduce if f == "AllReduce" else 0) for f in FUNCS},
    }


def missing_entry(
    rank: int,
    *,
    host: str = "10.0.0.1",
    pid: int | None = None,
    gpu: int | None = None,
    unresponsive: bool = True,
    dead: bool = False,
) -> dict[str, object]:
    return {
        "rank": rank,
        "host": host,
        "pid": 1000 + rank if pid is None else pid,
        "cuda_dev": rank if gpu is None else gpu,
        "nvml_dev": rank if gpu is None else gpu,
        "status": {"unresponsive": unresponsive, "considered_dead": dead},
    }


def communicator(
    ranks: Sequence[dict[str, object]],
    missing: Sequence[dict[str, object]] = (),
    *,
    hash_: str = "0xae94423cfbb2ef4a",
    size: int | None = None,
) -> dict[str, object]:
    return {
        "hash": hash_,
        "secondary_hash": "0xb7e7187447156001:0xb8242ed28a71381e",
        "size": len(ranks) + len(missing) if size is None else size,
        "ranks_count": len(ranks),
        "missing_ranks_count": len(missing),
        "ranks": list(ranks),
        "missing_ranks": list(missing),
    }


def status_json(
    comms: Sequence[dict[str, object]], *, version: str = "2.28.9", timeouts: int = 0
) -> bytes:
    doc = {
        "nccl_version": version,
        "cuda_runtime_version": 13000,
        "cuda_driver_version": 13000,
        "timestamp": "2026-11-26 10:00:00",
        "communicators_count": len(comms),
        "communicators": list(comms),
        "ras": {"collection_time_sec": 0.004, "timeouts_count": timeouts},
    }
    return json.dumps(doc, indent=2).encode() + b"\n"


def job(
    n: int, allreduce: Sequence[int] | int, *, stopped: Sequence[int] = (), dead: bool = False
) -> bytes:
    """An n-rank job of one communicator: each rank's AllReduce count (or one for all);
    ``stopped`` ranks are missing (unresponsive, or dead)."""
    counts = [allreduce] * n if isinstance(allreduce, int) else list(allreduce)
    ranks = [rank_entry(r, allreduce=counts[r]) for r in range(n) if r not in stopped]
    missing = [missing_entry(r, dead=dead) for r in stopped]
    return status_json([communicator(ranks, missing)])
