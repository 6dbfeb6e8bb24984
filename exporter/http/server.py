"""The HTTP(S) server in front of the exposition cache.

One asyncio event loop on one thread owns the listener and every connection. The parts:

- ``exporter.http.listen``: ``--web.listen-address`` parsing and the listening socket;
- ``exporter.http.limits``: which connections count, which are closed first under pressure;
- ``exporter.http.connection``: one connection (TLS start, HTTP/1.1 via h11, timeouts, writes);
- ``exporter.http.site``: what each path answers; ``exporter.http.basicauth``: the credentials
check;
- ``exporter.http.tlsreload``: the TLS context, re-read when the certificate files change;
- here: ``serve()``, the loop thread, accepting and admitting connections, and running
  what may block (``ready()``, a first bcrypt check) on worker threads.

Behaviour:

- A connection waiting for its TLS handshake or request head, or idle between keep-alive
  requests, costs no thread: a few KiB of memory and a file descriptor. A scrape with
  cached (or no) credentials is answered on the loop: an auth check and a socket write,
  before any limit on requests is counted. ``/healthz`` (``ready()``) runs on a worker
  thread; a bcrypt check (credentials not seen to succeed before) on the one auth thread,
  admitted or refused at once by ``exporter.http.authlimit`` (per client address and /64,
  and in all), so wrong passwords cannot delay a cached scrape or ``/healthz``.
- Timeouts (``ConnectionLimits``): the TLS handshake plus the request head and body must
  arrive within ``header_timeout`` seconds; an idle keep-alive connection is closed after
  ``idle_timeout``; a response must be delivered within ``send_timeout`` (it is written in
  64 KiB pieces as the client reads, so a slow reader holds little memory).
- The listener defers accepting (``TCP_DEFER_ACCEPT``, ``header_timeout``): a connection
  that sends nothing costs the process nothing until then, and a newcomer's request is
  readable when it is accepted. Its queue is ``SOMAXCONN`` long.
- ``/healthz`` costs one ``ready()`` call a second whatever the number of requests: its
  answer is reused for :data:`HEALTH_REUSE_SECONDS`, and requests arriving while it runs
  wait for that same call (one worker thread, never ``max_requests``), so a flood of
  ``/healthz`` from any number of addresses is answered as cheaply as a cached scrape and a
  kubelet probe among it gets the agent's real state, not a ``503``. Past
  :data:`HEALTH_PER_ADDRESS_PER_SECOND` from one client address, ``/healthz`` is answered a
  second late (counted ``health_delayed``): a flood's connections then cost the loop one
  answer a second each, and a probe from another address is not kept waiting behind them.
- Limits: a new connection beyond ``max_per_address`` from one client address, or
  ``max_connections`` in all, closes the oldest evictable connection instead (see
  ``exporter.http.limits``); it is refused (``503`` on plain HTTP) only when all are busy.
- TLS, with client certificate verification when configured; a plain HTTP request on a TLS
  port gets ``400``. HTTP/1.1 keep-alive with ``Content-Length``, so Prometheus reuses its
  connection. Access logging is off; failed connections and requests are logged at DEBUG.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from agent.core.clientaddr import client_key
from exporter.http.authlimit import THROTTLED, AuthGate, AuthLimits
from exporter.http.basicauth import BasicAuth
from exporter.http.connection import HTTPConnection
from exporter.http.limits import ConnectionLimits, ConnectionTable
from exporter.http.listen import listen, parse_listen_address, peer_name
from exporter.http.site import Request, Response, Site, accepts_gzip
from exporter.http.tlsreload import ReloadingTLSContext
from exporter.http.webconfig import WebConfig
from exporter.metrics.exposition import ExpositionCache, render_text
from exporter.metrics.httpstats import HEALTH_SPEC, OWNER, HttpStats
from exporter.metrics.spec import Families

__all__ = [
    "ConnectionLimits",
    "MetricsServer",
    "accepts_gzip",
    "parse_listen_address",
    "serve",
    "serve_health",
]

log = logging.getLogger(__name__)

#: How long ``shutdown()`` waits for the loop thread (seconds).
SHUTDOWN_GRACE_SECONDS = 5.0

_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 21\r\nConnection: close\r\n\r\ntoo many connections\n"
)
T = TypeVar("T")

#: seconds before a refused credential check is answered (429 or 503)
REFUSED_CHECK_DELAY = 1.0

#: seconds one ``ready()`` result answers every ``/healthz`` request
HEALTH_REUSE_SECONDS = 1.0
#: ``/healthz`` requests one client address gets answered at once per second (a burst of as
#: many); more are answered a second late, the connection evictable meanwhile. A kubelet
#: probes a pod a few times every 5-20 s.
HEALTH_PER_ADDRESS_PER_SECOND = 10.0

#: Connections accepted per wake-up of the listener before other events get their turn.
_ACCEPT_BATCH = 64


def _always_ready() -> bool:
    return True


def serve(
    cache: ExpositionCache,
    address: str,
    *,
    web_config: WebConfig | None = None,
    ready: Callable[[], bool] = _always_ready,
    max_requests: int = 40,
    limits: ConnectionLimits | None = None,
    auth_limits: AuthLimits | None = None,
) -> MetricsServer:
    """Listen on ``address`` (``:10118``, ``127.0.0.1:10118``, ``[::1]:10118``; port 0 picks
    a free port) and serve ``cache`` from a background thread until ``shutdown()``.

    ``limits`` defaults to ``ConnectionLimits(max_requests=max_requests)``. Raises
    ``ConfigError`` when the address is malformed or cannot be bound (``cannot listen on
    ...: address already in use``) or a limit is out of range."""
    if limits is None:
        limits = ConnectionLimits(max_requests=max_requests)
    tls = ReloadingTLSContext(web_config.tls) if web_config and web_config.tls else None
    auth = BasicAuth(web_config.basic_auth_users) if web_config else None
    if auth is not None and not auth.enabled:
        auth = None
    headers = tuple(web_config.headers.items()) if web_config else ()
    listener = listen(address, defer_accept=limits.header_timeout)
    server = MetricsServer(
        listener,
        Site(cache=cache, ready=ready, auth=auth, headers=headers),
        tls=tls,
        limits=limits,
        publish=lambda data: cache.set_fragment(OWNER, data),
        auth_limits=auth_limits,
    )
    if auth is not None and tls is None:
        log.warning(
            "basic auth without TLS on %s: credentials cross the network in clear text", server.url
        )
    log.info(
        "serving metrics on %s (tls: %s, client certificates: %s, basic auth users: %d)",
        server.address,
        "on" if tls else "off",
        tls.config.client_auth_type if tls else "none",
        len(web_config.basic_auth_users) if web_config else 0,
    )
    return server


def serve_health(
    address: str,
    ready: Callable[[], bool],
    *,
    limits: ConnectionLimits | None = None,
    publish: Callable[[bytes], None] | None = None,
) -> MetricsServer:
    """Serve ``/healthz`` alone (``200 ok`` / ``503 not ready``; every other path 404) over
    plain HTTP without credentials on ``address``: what a kubelet probe can reach when the
    metrics port requires a client certificate (``RequireAndVerifyClientCert``), which
    kubelet HTTPS probes never present. It tells only whether the agent is ready. The same
    connection limits as the metrics server apply; what they did is rendered as
    ``fabricscope_http_health_connections_closed_total`` and handed to ``publish`` (the
    agent's exposition cache). ``ConfigError`` as :func:`serve`."""
    limits = limits or ConnectionLimits()
    listener = listen(address, defer_accept=limits.header_timeout)
    site = Site(cache=ExpositionCache(), ready=ready, auth=None, health_only=True)
    server = MetricsServer(
        listener, site, tls=None, limits=limits, publish=publish, stats=HttpStats(HEALTH_SPEC)
    )
    log.info("serving /healthz alone on %s (plain HTTP, no credentials)", server.address)
    return server


class MetricsServer:
    """A running server. ``port`` is the bound port (useful with port 0); ``address`` is what
    it listens on, as a log line should say it (``*:10118`` for every IPv4 and IPv6 address,
    ``0.0.0.0:10118``, ``[::1]:10118``); ``url`` is a base URL a local client can use
    (``http://127.0.0.1:43121``, no trailing slash)."""

    def __init__(
        self,
        listener: socket.socket,
        site: Site,
        *,
        tls: ReloadingTLSContext | None,
        limits: ConnectionLimits,
        publish: Callable[[bytes], None] | None = None,
        auth_limits: AuthLimits | None = None,
        stats: HttpStats | None = None,
    ) -> None:
        self._listener = listener
        self.site = site
        self.tls = tls
        self.limits = limits
        self.table: ConnectionTable[HTTPConnection] = ConnectionTable(
            limits.max_connections, limits.max_per_address
        )
        #: requests being answered now (loop thread only)
        self.in_flight = 0
        self.workers = ThreadPoolExecutor(
            max_workers=limits.max_requests, thread_name_prefix="fabricscope-http-worker"
        )
        #: bcrypt checks: one at a time, as ``auth_gate`` admits them (loop thread only)
        self.auth_gate = AuthGate(auth_limits)
        self.auth_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fabricscope-auth")
        self._closed = False
        self._warned: set[tuple[str, str]] = set()
        #: what the limits did, published into the cache's ``_http`` fragment once a second
        self.stats = stats or HttpStats()
        self._publish = publish
        #: the latest ready() result and when (loop time), and the connections waiting for
        #: the call in flight (loop thread only)
        self._health: tuple[float, bool] | None = None
        self._health_waiting: list[HTTPConnection] = []
        #: per client address: (tokens left, loop time they were counted) (loop thread only)
        self._health_tokens: dict[str, tuple[float, float]] = {}
        host, port = listener.getsockname()[:2]
        self.port: int = port
        self.address = listening_address(listener)
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._run, name=f"fabricscope-http-{port}", daemon=True
        )
        self._thread.start()

    def shutdown(self) -> None:
        """Stop accepting, close every open connection, stop the loop thread (bounded).
        Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self.loop.call_soon_threadsafe(self._stop)
        self._thread.join(SHUTDOWN_GRACE_SECONDS)
        self.workers.shutdown(wait=False, cancel_futures=True)
        self.auth_worker.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *_: object) -> None:
        self.shutdown()

    def _run(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        loop.add_reader(self._listener, self._accept)
        self._publish_stats()
        try:
            loop.run_forever()
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        finally:
            loop.close()

    def _publish_stats(self) -> None:
        """Render the limit counts into the cache when they changed; again in a second."""
        if self._closed:
            return
        if self._publish is not None and self.stats.dirty:
            out = Families()
            self.stats.render(out)
            self._publish(render_text(out))
        self.loop.call_later(1.0, self._publish_stats)

    def _stop(self) -> None:
        self.loop.remove_reader(self._listener)
        self._listener.close()
        for conn in list(self.table):
            conn.abort("shutdown")
        self.loop.call_soon(self.loop.stop)

    def _accept(self) -> None:
        for _ in range(_ACCEPT_BATCH):
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                # Out of file descriptors or memory: stop watching for a moment instead of
                # spinning on a listener that stays readable.
                log.warning("cannot accept connection on %s: %s", self.url, e)
                self.loop.remove_reader(self._listener)
                self.loop.call_later(0.1, self._resume_accepting)
                return
            try:
                self._admit(sock, addr)
            except Exception:  # keep serving whatever one connection did
                log.exception("unexpected error accepting a connection on %s", self.url)
                sock.close()

    def _warn_once(self, address: str, limit: str) -> None:
        """Say once per (address, limit) that a limit was reached (a reconnecting client
        must not flood the log); later hits are logged at DEBUG with each refusal."""
        if (address, limit) in self._warned:
            return
        if len(self._warned) >= 1024:
            self._warned.clear()
        self._warned.add((address, limit))
        if limit == "auth":
            limits = self.auth_gate.limits
            log.warning(
                "client %s makes more authentication attempts on %s than it may (one at a "
                "time; %d failures, then one every %g s): the rest are answered 429 unchecked",
                address,
                self.url,
                limits.failures_burst,
                limits.failure_interval,
            )
        elif limit == "per_address":
            log.warning(
                "client %s reached %d connections (the per-address limit) on %s: its oldest "
                "idle connections are closed and further ones refused while all are in use",
                address,
                self.limits.max_per_address,
                self.url,
            )
        else:
            log.warning(
                "%d connections open on %s (the limit): the oldest idle connections of the "
                "clients holding the most are closed for new ones (latest from %s)",
                self.limits.max_connections,
                self.url,
                address,
            )

    def _resume_accepting(self) -> None:
        if not self._closed:
            self.loop.add_reader(self._listener, self._accept)

    def _admit(self, sock: socket.socket, addr: object) -> None:
        peer = peer_name(addr)
        address = client_key(addr)
        conn = HTTPConnection(self, sock, peer, address)
        has_request = False
        if self.table.count(address) >= self.limits.max_per_address:
            self._warn_once(address, "per_address")
            if self.tls is None:
                has_request = _has_request_head(sock)
        elif len(self.table) >= self.limits.max_connections:
            self._warn_once(address, "total")
        victims = self.table.admit(conn, address, has_request=has_request)
        if victims is None:
            log.debug(
                "refusing connection from %s: %d open from it, %d in all, all busy",
                peer,
                self.table.count(address),
                len(self.table),
            )
            self.stats.count("refused")
            _refuse(sock, tls=self.tls is not None)
            return
        for victim in victims:
            self.stats.count("evicted")
            victim.abort("closed to make room for a new connection")
        conn.start()

    def answer(self, conn: HTTPConnection, req: Request) -> None:
        """Answer ``req`` on ``conn``: on the loop when cheap (cached or missing
        credentials, every path but ``/healthz``: no limit applies), else ``/healthz`` on a
        worker thread (``max_requests`` at once) or a bcrypt check on the one auth thread
        (as ``self.auth_gate`` admits; never queued behind ``/healthz`` or the reverse)."""
        quick = self.site.quick(req)
        if quick is not None:
            conn.respond(quick)
            return
        if not self.site.is_health(req):
            self._check(conn, req)
            return
        self._healthz(conn)

    def _healthz(self, conn: HTTPConnection, *, delayed: bool = False) -> None:
        """A recent ``ready()`` result at once, else wait for the one call in flight; a
        second late past the address's budget."""
        if not delayed and not self._health_token(conn.address):
            self.stats.count("health_delayed")
            self.table.pending(conn)
            self.loop.call_later(1.0, lambda: self._healthz(conn, delayed=True))
            return
        latest = self._health
        if latest is not None and self.loop.time() - latest[0] < HEALTH_REUSE_SECONDS:
            conn.respond(self.site.health(latest[1]))
            return
        self._health_waiting.append(conn)
        if len(self._health_waiting) > 1:
            return  # the call in flight answers it
        self.in_flight += 1
        future = self.workers.submit(self.site.is_ready)

        def done(f: Future[bool]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody to answer
                self.loop.call_soon_threadsafe(self._ready_done, f)

        future.add_done_callback(done)

    def _health_token(self, address: str) -> bool:
        """Take one of ``address``'s ``/healthz`` tokens (refilled at
        :data:`HEALTH_PER_ADDRESS_PER_SECOND`); False when it has none left."""
        now = self.loop.time()
        rate = HEALTH_PER_ADDRESS_PER_SECOND
        tokens, then = self._health_tokens.get(address, (rate, now))
        tokens = min(rate, tokens + (now - then) * rate)
        if tokens < 1.0:
            self._health_tokens[address] = (tokens, now)
            return False
        if len(self._health_tokens) >= 4096 and address not in self._health_tokens:
            # forget the addresses whose budget is whole again (they cost nothing to forget)
            for other, (t, at) in list(self._health_tokens.items()):
                if t + (now - at) * rate >= rate:
                    del self._health_tokens[other]
        self._health_tokens[address] = (tokens - 1.0, now)
        return True

    def _ready_done(self, future: Future[bool]) -> None:
        self.in_flight -= 1
        ok = not future.cancelled() and future.exception() is None and future.result()
        self._health = (self.loop.time(), ok)
        waiting, self._health_waiting = self._health_waiting, []
        response = self.site.health(ok)
        for conn in waiting:
            conn.respond(response)

    def _check(self, conn: HTTPConnection, req: Request) -> None:
        """Credentials bcrypt must check: admitted by the gate or refused at once."""
        refused = self.auth_gate.admit(conn.address)
        if refused is not None:
            reason, retry_after = refused
            self.stats.count(reason)
            if reason == THROTTLED:
                self._warn_once(conn.address, "auth")
            status = 429 if reason == THROTTLED else 503
            # Answered a second later, the connection evictable meanwhile: a client that
            # floods wrong passwords on keep-alive connections gets one answer a second on
            # each, not as many as the loop can write.
            self.table.pending(conn)
            self.loop.call_later(
                REFUSED_CHECK_DELAY, conn.respond, self.site.too_many_checks(status, retry_after)
            )
            return
        self._on_worker(self.auth_worker, self.site.check, req, conn, self._checked)

    def _on_worker(
        self,
        pool: ThreadPoolExecutor,
        fn: Callable[[Request], T],
        req: Request,
        conn: HTTPConnection,
        then: Callable[[HTTPConnection, Request, Future[T]], None],
    ) -> None:
        future = pool.submit(fn, req)

        def done(f: Future[T]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody to answer
                self.loop.call_soon_threadsafe(then, conn, req, f)

        future.add_done_callback(done)

    def _answered(self, conn: HTTPConnection, req: Request, future: Future[Response]) -> None:
        self.in_flight -= 1
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            log.error("answering a request from %s failed", conn.peer, exc_info=exc)
            conn.respond(self.site.status(500, b"internal error\n"), close=True)
        else:
            conn.respond(future.result())

    def _checked(self, conn: HTTPConnection, req: Request, future: Future[bool]) -> None:
        if future.cancelled():
            self.auth_gate.done(conn.address, ok=False)
            return
        exc = future.exception()
        ok = exc is None and future.result()
        self.auth_gate.done(conn.address, ok=ok)
        if exc is not None:
            log.error("checking credentials from %s failed", conn.peer, exc_info=exc)
            conn.respond(self.site.status(500, b"internal error\n"), close=True)
            return
        conn.respond(self.site.route(req, authorized=ok))


def listening_address(sock: socket.socket) -> str:
    """``*:PORT`` for a dual-stack wildcard socket (every IPv4 and IPv6 address), else the
    bound address as ``HOST:PORT`` / ``[HOST]:PORT``."""
    host, port = sock.getsockname()[:2]
    if sock.family == socket.AF_INET6 and host == "::":
        v6only = sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY)
        return f"[::]:{port}" if v6only else f"*:{port}"
    return peer_name((host, port))


def _has_request_head(sock: socket.socket) -> bool:
    """Whether a complete request head is already waiting (read without consuming it)."""
    try:
        return b"\r\n\r\n" in sock.recv(16384, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:
        return False


def _refuse(sock: socket.socket, *, tls: bool) -> None:
    """Close at once; on plain HTTP say why first. What the client already sent is read
    (one non-blocking read) so that the close does not reset the connection and destroy
    the reply before the client reads it."""
    sock.setblocking(False)
    with contextlib.suppress(BlockingIOError, ConnectionError):  # nothing sent, or gone
        sock.recv(65536)
    try:
        if not tls:
            sock.send(_REFUSED)
    except OSError as e:
        log.debug("refusing connection: %s", e)
    finally:
        sock.close()
