"""One HTTP/1.1 connection of the metrics server, on the server's asyncio loop.

A connection goes through these states (``exporter.http.limits`` says which count as busy):

- *waiting*: for the TLS handshake (on a TLS port, after peeking that the first byte opens
  a handshake; plain HTTP there gets ``400`` and a close) and then for a request head and
  body; all of it within ``header_timeout`` from the accept, or from the first byte of a
  later request. A small body (``Content-Length`` up to 64 KiB) is read and discarded; a
  larger or chunked one is answered at once and the connection closed afterwards.
- *busy*: the server is answering (``ConnectionHost.answer``); reading is paused.
- *sending*: the response goes out in 64 KiB pieces as the transport drains, within
  ``send_timeout``; a slow reader holds about one piece of memory, not a copy of the body.
- *idle*: keep-alive between requests, up to ``idle_timeout``.
- *linger*: closing: the reply is sent, our side half-closed, and what the client still
  sends is read (1 s, 16 MiB at most): closing with unread input sends a TCP reset, which
  can destroy the reply before it is read.

HTTP/1.1 is parsed and framed by h11 (requests over 16 KiB of head get ``431``, malformed
ones ``400``); HTTP/1.0 and ``Connection: close`` are honoured; ``Expect: 100-continue`` is
answered at once.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from email.utils import formatdate
from http import HTTPStatus
from typing import Protocol

import h11

from exporter.http.limits import ConnectionLimits, ConnectionTable
from exporter.http.site import Request, Response, Site
from exporter.http.tlsreload import ReloadingTLSContext
from exporter.metrics.httpstats import HttpStats

log = logging.getLogger(__name__)

_PLAIN_ON_TLS = (
    b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"
)
_TLS_HANDSHAKE_RECORD = 0x16
#: Largest request body (bytes) read and discarded to keep a connection usable.
_DRAIN_LIMIT = 65536
#: Bounds on reading a client's leftover input before closing (seconds, bytes).
_LINGER_SECONDS = 1.0
_LINGER_BYTES = 16 * 1024 * 1024
#: A response is handed to the transport in pieces of this size as the client reads.
_CHUNK = 65536


class ConnectionHost(Protocol):
    """What a connection needs from its server (``exporter.http.server.MetricsServer``)."""

    loop: asyncio.AbstractEventLoop
    limits: ConnectionLimits
    table: ConnectionTable[HTTPConnection]
    site: Site
    tls: ReloadingTLSContext | None
    stats: HttpStats

    def answer(self, conn: HTTPConnection, req: Request) -> None:
        """Answer ``req``: call ``conn.respond`` now or later (on the loop)."""


_Started = tuple[asyncio.Transport, asyncio.BaseProtocol]

# Connection states
_WAITING = "waiting"  # for the TLS handshake or a request head
_BUSY = "busy"  # a request is being answered
_SENDING = "sending"  # the response is being delivered
_IDLE = "idle"  # keep-alive, between requests
_LINGER = "linger"  # closing: reading what the client still sends


class HTTPConnection(asyncio.Protocol):
    """One accepted connection: TLS start, h11 state, timers and write flow control."""

    def __init__(
        self, server: ConnectionHost, sock: socket.socket, peer: str, address: str = ""
    ) -> None:
        self.server = server
        self.loop = server.loop
        self.sock = sock
        self.peer = peer
        #: the client address the limits count by (``agent.core.clientaddr.client_key``)
        self.address = address or peer
        self.state = _WAITING
        self.h11 = h11.Connection(h11.SERVER)
        self.transport: asyncio.Transport | None = None
        self._start_task: asyncio.Task[_Started] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = 0.0
        self._closed = False
        self._request: h11.Request | None = None
        self._close_after = False
        self._out: list[memoryview] = []
        self._paused = False
        self._lingered = 0

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self.sock.setblocking(False)
        # asyncio sets this only on sockets created with proto=IPPROTO_TCP; ours has 0
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._arm(self.server.limits.header_timeout)
        if self.server.tls is None:
            self._attach(None)
        else:
            self.loop.add_reader(self.sock, self._peek)

    def _peek(self) -> None:
        self.loop.remove_reader(self.sock)
        tls = self.server.tls
        assert tls is not None
        try:
            first = self.sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            self.loop.add_reader(self.sock, self._peek)
            return
        except OSError as e:
            self.abort(f"reading: {e}")
            return
        if not first:
            self.abort("closed before a TLS handshake")
            return
        if first[0] != _TLS_HANDSHAKE_RECORD:
            log.debug("plain HTTP from %s on a TLS port", self.peer)
            try:  # a fresh socket's send buffer takes these 130 bytes at once
                self.sock.send(_PLAIN_ON_TLS)
                self.sock.shutdown(socket.SHUT_WR)
            except OSError as e:
                self.abort(f"writing: {e}")
                return
            self.state = _LINGER
            self._arm(_LINGER_SECONDS)
            self.loop.add_reader(self.sock, self._drain_raw)
            return
        self._attach(tls.current())

    def _drain_raw(self) -> None:
        try:
            chunk = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        self._lingered += len(chunk)
        if not chunk or self._lingered >= _LINGER_BYTES:
            self.abort("")

    def _attach(self, context: ssl.SSLContext | None) -> None:
        left = max(0.001, self._deadline - self.loop.time())
        coro = self.loop.connect_accepted_socket(
            lambda: self,
            self.sock,
            ssl=context,
            ssl_handshake_timeout=left if context is not None else None,
        )
        self._start_task = self.loop.create_task(coro)
        self._start_task.add_done_callback(self._started)

    def _started(self, task: asyncio.Task[_Started]) -> None:
        self._start_task = None
        if task.cancelled():
            self._forget()
            return
        exc = task.exception()
        if exc is not None:
            log.debug("connection from %s ended before a request: %r", self.peer, exc)
            self._forget()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=_CHUNK, low=_CHUNK // 4)
        if self._closed:  # evicted or shut down during the handshake
            transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            log.debug("connection from %s ended: %s", self.peer, exc)
        self._forget()

    def abort(self, why: str) -> None:
        """Close at once (timeouts, eviction, shutdown)."""
        if why:
            log.debug("closing connection from %s: %s", self.peer, why)
        if self.transport is not None:
            self.transport.abort()
        elif self._start_task is not None:
            self._start_task.cancel()
        else:
            self.loop.remove_reader(self.sock)
            self.sock.close()
            self._forget()
        self._closed = True

    def _forget(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.server.table.remove(self)

    def _arm(self, seconds: float) -> None:
        """Set the deadline of the current state. The timer is replaced only when the new
        deadline is earlier; a later one is picked up when the timer fires (a keep-alive
        request moves the deadline three times: no timer churn per request)."""
        self._deadline = self.loop.time() + seconds
        if self._timer is None or self._timer.when() > self._deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self.loop.call_at(self._deadline, self._expired)

    def _expired(self) -> None:
        self._timer = None
        if self.loop.time() < self._deadline:
            self._timer = self.loop.call_at(self._deadline, self._expired)
            return
        reason = {_WAITING: "header_timeout", _IDLE: "idle_timeout", _SENDING: "send_timeout"}
        if self.state in reason:
            self.server.stats.count(reason[self.state])
        self.abort(f"{self.state} for too long")

    # --- reading --------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.state == _LINGER:
            self._lingered += len(data)
            if self._lingered >= _LINGER_BYTES:
                self.abort("")
            return
        if self.state == _IDLE:
            self.state = _WAITING
            self.server.table.pending(self)
            self._arm(self.server.limits.header_timeout)
        self.h11.receive_data(data)
        if self.state == _WAITING:
            self._process()
        elif len(self.h11.trailing_data[0]) > _DRAIN_LIMIT and self.transport is not None:
            # pipelined input while answering: buffer a little, then stop reading
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        """The client half-closed: answer what it asked (then close), or close now."""
        if self.state == _LINGER:
            return None  # all read: close
        if self.state == _IDLE:
            self.state = _WAITING
        self.h11.receive_data(b"")
        if self.state == _WAITING:
            self._process()  # a request, an error reply or ConnectionClosed (abort)
        # Keep a plain TCP transport open: a reply may be on its way; it is closed after it.
        # TLS has no half-close: asyncio's SSL transport shuts down after this whatever we
        # answer (and logs a warning if we ask to keep it), so there we let it close.
        if self.transport is not None and self.transport.can_write_eof():
            return True
        return None

    def _process(self) -> None:
        while self.state == _WAITING and not self._closed:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as e:
                log.debug("bad request from %s: %s", self.peer, e)
                status = e.error_status_hint
                self._dispatch_error(status, f"{status} bad request\n".encode())
                return
            if event is h11.NEED_DATA:
                if self.h11.they_are_waiting_for_100_continue:
                    continue_ = h11.InformationalResponse(
                        status_code=100, headers=[], reason=b"Continue"
                    )
                    self._write(self.h11.send(continue_) or b"")
                return
            if event is h11.PAUSED:
                return
            if isinstance(event, h11.Request):
                self._request = event
                if not _small_body(event):
                    # Answer at once and hang up (after reading what follows, bounded).
                    self._close_after = True
                    self._dispatch(event)
            elif isinstance(event, h11.EndOfMessage):
                if self._request is not None:
                    self._dispatch(self._request)
            elif isinstance(event, h11.ConnectionClosed):
                self.abort("")
                return
            # h11.Data: a small body, discarded

    def _dispatch(self, event: h11.Request) -> None:
        self.state = _BUSY
        self.server.table.busy(self)
        self._arm(self.server.limits.send_timeout)
        self.server.answer(self, _request(event))

    def _dispatch_error(self, status: int, body: bytes) -> None:
        self._close_after = True
        self.state = _BUSY
        self._arm(self.server.limits.send_timeout)
        if self.h11.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            self.abort("")
            return
        self.respond(self.server.site.status(status, body), close=True)

    # --- writing --------------------------------------------------------------------------

    def respond(self, resp: Response, *, close: bool = False) -> None:
        if self._closed or self.transport is None:
            return
        self._close_after = self._close_after or close
        self.state = _SENDING
        self.server.table.pending(self)
        headers = [*resp.headers, ("Content-Length", str(len(resp.body))), ("Date", _http_date())]
        if self._close_after:
            headers.append(("Connection", "close"))
        try:
            head = self.h11.send(
                h11.Response(status_code=resp.status, headers=headers, reason=_reason(resp.status))
            )
        except h11.LocalProtocolError as e:
            self.abort(f"cannot respond: {e}")
            return
        assert head is not None
        request = self._request
        if resp.body and not (request is not None and request.method == b"HEAD"):
            body = memoryview(resp.body)
            self._out = [body[i : i + _CHUNK] for i in range(0, len(body), _CHUNK)]
        self._flush(head)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self.state == _SENDING:
            self._flush()

    def _flush(self, head: bytes = b"") -> None:
        """Write what the transport takes (``head`` and the first piece go out together:
        one send for a typical gzipped scrape)."""
        transport = self.transport
        assert transport is not None
        while self._out and not self._paused:
            # passthrough: h11 counts the piece against Content-Length without copying it
            # (h11 types data as bytes; any buffer works, and a memoryview is not a copy)
            data = h11.Data(data=self._out.pop(0))  # type: ignore[arg-type]
            for piece in self.h11.send_with_data_passthrough(data) or ():
                transport.write(head + piece if head else piece)
                head = b""
        if head:
            transport.write(head)
        if self._out:
            return
        end = self.h11.send(h11.EndOfMessage())
        if end:
            transport.write(end)
        self._request = None
        if (
            self._close_after
            or self.h11.our_state is h11.MUST_CLOSE
            or self.h11.their_state is not h11.DONE
        ):
            self._linger()
            return
        self.h11.start_next_cycle()
        self.state = _IDLE
        self.server.table.idle(self)
        self._arm(self.server.limits.idle_timeout)
        transport.resume_reading()
        if self.h11.trailing_data[0]:  # a pipelined request is already here
            self.state = _WAITING
            self.server.table.pending(self)
            self._arm(self.server.limits.header_timeout)
            self._process()

    def _linger(self) -> None:
        """Close after reading what the client is still sending (bounded): closing with
        unread input sends a TCP reset, which can destroy the reply before it is read."""
        transport = self.transport
        assert transport is not None
        self.state = _LINGER
        self._arm(_LINGER_SECONDS)
        if transport.can_write_eof():
            transport.write_eof()
            transport.resume_reading()
        else:  # TLS: no half-close; deliver what is buffered, then close
            transport.close()

    def _write(self, data: bytes) -> None:
        if self.transport is not None and data:
            self.transport.write(data)


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b""


def _small_body(event: h11.Request) -> bool:
    """No body, or a Content-Length body small enough to read and discard."""
    for name, value in event.headers:
        if name == b"transfer-encoding":
            return False
        if name == b"content-length":
            return int(value) <= _DRAIN_LIMIT
    return True


def _request(event: h11.Request) -> Request:
    authorization = accept_encoding = None
    for name, value in event.headers:
        if name == b"authorization":
            authorization = value.decode("latin-1")
        elif name == b"accept-encoding":
            accept_encoding = value.decode("latin-1")
    return Request(
        event.method.decode("ascii", "replace"),
        event.target.decode("latin-1"),
        authorization,
        accept_encoding,
    )


_date_cache: tuple[int, str] = (0, "")


def _http_date() -> str:
    """The Date header, formatted once per second rather than once per request."""
    global _date_cache  # noqa: PLW0603 - a one-entry cache, replaced atomically
    now = int(time.time())
    cached = _date_cache
    if cached[0] != now:
        cached = (now, formatdate(now, usegmt=True))
        _date_cache = cached
    return cached[1]
