"""One conversation with NCCL's RAS client port, bounded in time and bytes.

The protocol (NCCL's ``src/ras/client_support.cc``) is text, one command per line, each
answered before the next is sent::

    -> CLIENT PROTOCOL 2        <- SERVER PROTOCOL 2      (the server's version; NCCL
                                                           2.24 to 2.30 all speak 2)
    -> TIMEOUT 5                <- OK                     (seconds each leg of the job-wide
                                                           gather may take)
    -> SET FORMAT json          <- OK                     (2.28.7 and later; older NCCL
                                                           answers "ERROR: Unknown command")
    -> STATUS                   <- the answer, then the server closes the connection

A RAS thread answers from its event loop; ``STATUS`` starts a gather across every process
of the job, which ends when all answered or a leg timed out (``TIMEOUT`` seconds, then up
to 5 x ``NCCL_RAS_TIMEOUT_FACTOR`` more for the whole gather), so an answer may take ten
seconds or more when a process is stopped. Each step here has a deadline: the handshake
lines :data:`HANDSHAKE_SECONDS` each, the whole conversation ``deadline_seconds``; every
line is capped at :data:`MAX_LINE_BYTES` and the answer at ``max_bytes``. A server that
accepts but never answers the handshake (a stopped process whose listening socket the
kernel still completes connections on, as ``SO_REUSEPORT`` spreads them over the job's
processes on a node) costs the handshake deadline, and the conversation is retried once on
a new connection.

Answers read at once share one byte budget (:class:`ReadBudget`: two of the largest
answers): a read holds what it buffered until its caller has decoded it, and a read that
would pass the budget waits for another to let go, within its own deadline (then
``timeout``); one read at a time may use a reserve of one whole answer, so one always
completes. However many jobs answer at once, their buffers together stay within the budget.

Failures raise :class:`QueryError` with a ``reason`` from :data:`QUERY_ERRORS`.
"""

from __future__ import annotations

import errno
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

#: the protocol version this client speaks
PROTOCOL = 2
#: seconds for each handshake line to come back
HANDSHAKE_SECONDS = 2.0
#: longest handshake line accepted
MAX_LINE_BYTES = 256
#: reasons a query fails, counted by fabricscope_nccl_ras_query_errors_total
QUERY_ERRORS: tuple[str, ...] = (
    "malformed",  # an answer that is not a RAS JSON status (agent.ras.parse)
    "oversized",  # an answer that would decode into more memory than allowed (agent.ras.parse)
    "protocol",  # an unexpected handshake line, or another protocol version
    "refused",  # nothing listens there (connection refused, unreachable)
    "reset",  # the connection was reset or closed before the answer ended
    "timeout",  # a deadline passed
    "too_large",  # the answer passed the size cap
    "unsupported",  # the job's NCCL refused JSON output (older than 2.28.7)
)
_SERVER = re.compile(rb"SERVER PROTOCOL ([0-9]{1,6})\r?\n")


class QueryError(Exception):
    """A conversation that produced no answer; ``reason`` is one of :data:`QUERY_ERRORS`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Answer:
    """The raw answer and what the conversation cost: ``seconds`` wall time from connect to
    the server's close, ``attempts`` connections opened (2 after a handshake retry)."""

    data: bytes | bytearray
    seconds: float
    attempts: int


class ReadBudget:
    """Bytes the answers being read at once may buffer together: a shared part that reads
    take from as they grow, and a reserve of one whole answer that one read at a time (the
    first to find the shared part spent) may use, so that one answer always completes and
    reads that each hold part of the shared bytes can never stall each other until their
    deadlines. At most ``2 x answer_bytes`` are held in all."""

    def __init__(self, answer_bytes: int) -> None:
        self.total = 2 * answer_bytes
        self._shared = answer_bytes
        self._reserve = answer_bytes
        self._leader: Hold | None = None  # the read using the reserve
        self._cond = threading.Condition()

    @property
    def free(self) -> int:
        return self._shared + self._reserve

    def take(self, hold: Hold, n: int, deadline: float, clock: Callable[[], float]) -> bool:
        """Take ``n`` bytes for ``hold``, waiting for them until ``deadline`` (on ``clock``);
        False when they did not come in time."""
        with self._cond:
            while True:
                if self._shared >= n:
                    self._shared -= n
                    hold.shared += n
                    return True
                if self._leader is None:
                    self._leader = hold
                if self._leader is hold and self._reserve >= n:
                    self._reserve -= n
                    hold.reserved += n
                    return True
                left = deadline - clock()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))

    def give(self, hold: Hold) -> None:
        with self._cond:
            self._shared += hold.shared
            self._reserve += hold.reserved
            hold.shared = hold.reserved = 0
            if self._leader is hold:
                self._leader = None
            self._cond.notify_all()


class Hold:
    """What one query holds of a :class:`ReadBudget` (none: unbounded); its caller calls
    :meth:`release` once it is done with the answer."""

    def __init__(self, budget: ReadBudget | None = None) -> None:
        self._budget = budget
        self.shared = 0
        self.reserved = 0

    @property
    def bytes(self) -> int:
        return self.shared + self.reserved

    def take(self, n: int, deadline: float, clock: Callable[[], float]) -> None:
        if self._budget is None:
            return
        if not self._budget.take(self, n, deadline, clock):
            raise QueryError(
                "timeout", "the deadline passed while other answers held the read budget"
            )

    def release(self) -> None:
        if self._budget is not None:
            self._budget.give(self)


class _Conversation:
    def __init__(
        self,
        sock: socket.socket,
        deadline: float,
        clock: Callable[[], float],
        hold: Hold | None = None,
    ) -> None:
        self.sock = sock
        self.deadline = deadline
        self.clock = clock
        self.hold = hold or Hold()
        self.buf = bytearray()
        #: the STATUS command went out: a timeout after it is the gather's own
        self.asked = False

    def _wait(self, limit: float) -> None:
        left = min(self.deadline, limit) - self.clock()
        if left <= 0:
            raise QueryError("timeout", "the deadline passed")
        self.sock.settimeout(left)

    def send(self, line: bytes) -> None:
        self._wait(self.deadline)
        try:
            self.sock.sendall(line)
        except TimeoutError:
            raise QueryError("timeout", "the server did not take the command in time") from None
        except OSError as exc:
            raise QueryError("reset", f"sending failed: {exc.strerror or exc}") from None

    def _recv(self, limit: float) -> bytes:
        self._wait(limit)
        try:
            return self.sock.recv(65536)
        except TimeoutError:
            raise QueryError("timeout", "no answer in time") from None
        except OSError as exc:
            raise QueryError("reset", f"receiving failed: {exc.strerror or exc}") from None

    def line(self, seconds: float) -> bytes:
        """One line (with its newline) within ``seconds``."""
        limit = self.clock() + seconds
        while b"\n" not in self.buf:
            if len(self.buf) > MAX_LINE_BYTES:
                raise QueryError("protocol", "a handshake line longer than expected")
            chunk = self._recv(limit)
            if not chunk:
                raise QueryError("reset", "the server closed the connection during the handshake")
            self.buf += chunk
        end = self.buf.index(b"\n") + 1
        if end > MAX_LINE_BYTES:
            raise QueryError("protocol", "a handshake line longer than expected")
        out = bytes(self.buf[:end])
        del self.buf[:end]
        return out

    def rest(self, max_bytes: int) -> bytearray:
        """Everything until the server closes, at most ``max_bytes``."""
        while True:
            if len(self.buf) > max_bytes:
                raise QueryError("too_large", f"the answer passed {max_bytes} bytes")
            chunk = self._recv(self.deadline)
            if not chunk:
                # the buffer itself, not a copy: a 16 MiB answer is held once, not twice
                out, self.buf = self.buf, bytearray()
                return out
            self.hold.take(len(chunk), self.deadline, self.clock)
            self.buf += chunk


def _ok(reply: bytes, command: str) -> None:
    """Nothing the server wrote is repeated in a message: only what kind of line it was."""
    if reply.rstrip(b"\r\n") != b"OK":
        if reply.startswith(b"ERROR") and command == "SET FORMAT json":
            raise QueryError("unsupported", "the job's NCCL refused JSON output (before 2.28.7)")
        what = "an ERROR line" if reply.startswith(b"ERROR") else "an unexpected line"
        raise QueryError("protocol", f"{command} was answered with {what}, not OK")


def _converse(
    c: _Conversation, *, command: bytes, ras_timeout: int, max_bytes: int
) -> bytes | bytearray:
    c.send(f"CLIENT PROTOCOL {PROTOCOL}\n".encode())
    hello = c.line(HANDSHAKE_SECONDS)
    m = _SERVER.fullmatch(hello)
    if m is None:
        raise QueryError("protocol", "not a RAS server (no SERVER PROTOCOL line)")
    if int(m.group(1)) != PROTOCOL:
        raise QueryError(
            "protocol", f"RAS protocol {int(m.group(1))}, this client speaks {PROTOCOL}"
        )
    c.send(f"TIMEOUT {ras_timeout}\n".encode())
    _ok(c.line(HANDSHAKE_SECONDS), "TIMEOUT")
    c.send(b"SET FORMAT json\n")
    _ok(c.line(HANDSHAKE_SECONDS), "SET FORMAT json")
    c.asked = True
    c.send(command)
    return c.rest(max_bytes)


def connect(host: str, port: int, seconds: float) -> socket.socket:
    """A TCP connection to ``host:port`` within ``seconds`` (QueryError otherwise)."""
    try:
        return socket.create_connection((host, port), timeout=max(seconds, 0.001))
    except TimeoutError:
        raise QueryError("timeout", f"no connection to {host}:{port} in time") from None
    except OSError as exc:
        if exc.errno in (errno.ECONNRESET, errno.EPIPE):
            raise QueryError("reset", f"{host}:{port}: {exc.strerror}") from None
        raise QueryError("refused", f"{host}:{port}: {exc.strerror or exc}") from None


def query(
    host: str,
    port: int,
    *,
    deadline_seconds: float,
    max_bytes: int,
    ras_timeout: int = 5,
    verbose: bool = False,
    clock: Callable[[], float] = time.monotonic,
    hold: Hold | None = None,
) -> Answer:
    """Ask the RAS service at ``host:port`` for the job's status in JSON; the raw answer.

    One deadline for the whole query (connecting, the handshake, the gather, reading); a
    handshake that times out is retried once on a new connection, within that deadline.
    ``verbose`` sends ``VERBOSE STATUS`` (the same JSON: verbosity only changes the text
    format's outlier lists). ``hold``: what the answer's buffer takes from a shared
    :class:`ReadBudget`; the caller releases it (a failed query releases it here)."""
    start = clock()
    deadline = start + deadline_seconds
    command = b"VERBOSE STATUS\n" if verbose else b"STATUS\n"
    attempts = 0
    while True:
        attempts += 1
        sock = connect(host, port, min(HANDSHAKE_SECONDS, deadline - clock()))
        c = _Conversation(sock, deadline, clock, hold)
        try:
            data = _converse(c, command=command, ras_timeout=ras_timeout, max_bytes=max_bytes)
            return Answer(data, clock() - start, attempts)
        except QueryError as exc:
            c.hold.release()
            # a handshake that never came back (a stopped process's socket): once more,
            # on a new connection, which the kernel may hand to another of the job's processes
            retry = (
                exc.reason == "timeout"
                and attempts == 1
                and deadline - clock() > HANDSHAKE_SECONDS * 3
                and not c.asked
            )
            if not retry:
                raise
        finally:
            sock.close()
