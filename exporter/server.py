"""The HTTP(S) server in front of the exposition cache.

Endpoints:

- ``GET /metrics``: the cached exposition (``ExpositionCache.body()``), or its cached gzip
  form with ``Content-Encoding: gzip`` when the client's ``Accept-Encoding`` allows gzip.
  A scrape never samples or renders: it costs an auth check and a socket write.
- ``GET /healthz``: ``200 ok`` when ``ready()`` is true, else ``503``. ``ready`` must be
  cheap (it runs on the request thread).
- ``GET /``: a small landing page linking ``/metrics``.
- any other path: 404; any method but GET and HEAD: 405.

Access control (from the ``--web.config.file``, see ``exporter.webconfig``):

- TLS, with client certificate verification when configured. Certificate and key files are
  re-read when they change (checked once per new connection), so a rotated certificate
  (cert-manager, a renewed Secret) is picked up without a restart; a bad new pair is
  logged and the previous one kept.
- Basic auth guards every path **except /healthz**. ``/healthz`` says only whether the agent
  is ready, and kubelet probes cannot easily carry credentials, so it stays open.
  Unauthenticated requests get ``401`` with ``WWW-Authenticate: Basic realm="fabricscope"``.
- bcrypt is slow by design (50-250 ms per check). A successful check is remembered per user
  as a keyed BLAKE2b digest of (user, password) under a random per-process key, never the
  password itself, and later requests compare digests with ``hmac.compare_digest``: a scrape
  with known-good credentials costs microseconds. Failed checks are not remembered, run one
  at a time (a password-guessing client gets one core, not all), and an unknown user is
  checked against a dummy hash so timing does not reveal which users exist.

Limits: at most ``max_requests`` requests in flight (more get ``503``), at most
``4 * max_requests`` open connections (more are closed at once, with a ``503`` on plain
HTTP), and a 30 s socket timeout per connection (a slow or idle client cannot hold a
thread longer). HTTP/1.1 keep-alive with ``Content-Length``, so Prometheus reuses its
connection. Access logging is off; failed connections and requests are logged at DEBUG.
"""

from __future__ import annotations

import base64
import binascii
import errno
import functools
import hashlib
import hmac
import logging
import os
import secrets
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler

import bcrypt

from agent.errors import ConfigError
from exporter.exposition import CONTENT_TYPE, ExpositionCache
from exporter.webconfig import TLSServerConfig, WebConfig

log = logging.getLogger(__name__)

#: Socket timeout per connection (seconds): the longest a client may stay silent mid-request
#: or idle between keep-alive requests.
CONNECTION_TIMEOUT_SECONDS = 30.0
#: How long ``shutdown()`` waits for connection threads to finish (seconds).
SHUTDOWN_GRACE_SECONDS = 5.0

_TEXT = "text/plain; charset=utf-8"
_HTML = "text/html; charset=utf-8"
_AUTHENTICATE = 'Basic realm="fabricscope"'
_LANDING_PAGE = b"""<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>fabricscope</title></head>
<body>
<h1>fabricscope</h1>
<p>GPU training fabric exporter.</p>
<ul>
<li><a href="metrics">metrics</a></li>
<li><a href="healthz">healthz</a></li>
</ul>
</body>
</html>
"""
_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 21\r\nConnection: close\r\n\r\ntoo many connections\n"
)
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


def _always_ready() -> bool:
    return True


def serve(
    cache: ExpositionCache,
    address: str,
    *,
    web_config: WebConfig | None = None,
    ready: Callable[[], bool] = _always_ready,
    max_requests: int = 40,
) -> MetricsServer:
    """Listen on ``address`` (``:10118``, ``127.0.0.1:10118``, ``[::1]:10118``; port 0 picks
    a free port) and serve ``cache`` from background threads until ``shutdown()``.

    Raises ``ConfigError`` when the address is malformed or cannot be bound (``cannot listen
    on ...: address already in use``) or ``max_requests`` is below 1."""
    if max_requests < 1:
        raise ConfigError(f"max_requests must be at least 1, got {max_requests}")
    tls = _TLSContexts(web_config.tls) if web_config and web_config.tls else None
    auth = BasicAuth(web_config.basic_auth_users) if web_config else None
    if auth is not None and not auth.enabled:
        auth = None
    headers = tuple(web_config.headers.items()) if web_config else ()
    listener = _listen(address)
    server = MetricsServer(
        listener,
        _Site(cache=cache, ready=ready, auth=auth, headers=headers),
        tls=tls,
        max_requests=max_requests,
    )
    if auth is not None and tls is None:
        log.warning(
            "basic auth without TLS on %s: credentials cross the network in clear text", server.url
        )
    log.info(
        "serving metrics on %s (tls: %s, client certificates: %s, basic auth users: %d)",
        server.url,
        "on" if tls else "off",
        tls.config.client_auth_type if tls else "none",
        len(web_config.basic_auth_users) if web_config else 0,
    )
    return server


def parse_listen_address(address: str) -> tuple[str, int]:
    """``":10118"`` -> ``("", 10118)`` (all interfaces); ``"127.0.0.1:10118"``;
    ``"[::1]:10118"`` -> ``("::1", 10118)``. Raises ``ConfigError`` for anything else."""
    host, sep, port_text = address.rpartition(":")
    hint = "expected [host]:port, e.g. :10118, 127.0.0.1:10118 or [::1]:10118"
    if not sep:
        raise ConfigError(f"invalid listen address {address!r}: {hint}")
    if host.startswith("[") or host.endswith("]"):
        if not (host.startswith("[") and host.endswith("]")) or ":" not in host:
            raise ConfigError(f"invalid listen address {address!r}: {hint}")
        host = host[1:-1]
    elif ":" in host:
        raise ConfigError(
            f"invalid listen address {address!r}: an IPv6 address goes in brackets, "
            "e.g. [::1]:10118"
        )
    if not (port_text.isascii() and port_text.isdigit()) or int(port_text) > 65535:
        raise ConfigError(f"invalid listen address {address!r}: port must be 0-65535")
    return host, int(port_text)


class MetricsServer:
    """A running server. ``port`` is the bound port (useful with port 0); ``url`` is a base
    URL a local client can use (``http://127.0.0.1:43121``, no trailing slash)."""

    def __init__(
        self,
        listener: socket.socket,
        site: _Site,
        *,
        tls: _TLSContexts | None,
        max_requests: int,
    ) -> None:
        self._listener = listener
        self.site = site
        self.tls = tls
        self.request_slots = threading.BoundedSemaphore(max_requests)
        self._max_connections = 4 * max_requests
        self._lock = threading.Lock()
        self._connections: set[_Connection] = set()
        self._closed = False
        self._wake_r, self._wake_w = socket.socketpair()
        host, port = listener.getsockname()[:2]
        self.port: int = port
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"
        self._thread = threading.Thread(
            target=self._accept_loop, name=f"fabricscope-http-{port}", daemon=True
        )
        self._thread.start()

    def shutdown(self) -> None:
        """Stop accepting, close every open connection, and wait (bounded) for the
        connection threads. Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            connections = list(self._connections)
        self._wake_w.send(b"x")
        self._thread.join(SHUTDOWN_GRACE_SECONDS)
        self._listener.close()
        for conn in connections:
            conn.abort()
        for conn in connections:
            if conn.thread.ident is None:  # never started: the accept loop stopped first
                conn.sock.close()
                continue
            conn.thread.join(SHUTDOWN_GRACE_SECONDS)
            if conn.thread.is_alive():
                log.debug("connection thread from %s did not stop in time", conn.peer)
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *_: object) -> None:
        self.shutdown()

    def _accept_loop(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while True:
                for key, _ in selector.select():
                    if key.fileobj is self._wake_r:
                        return
                    try:
                        self._accept_one()
                    except Exception:  # keep serving whatever one connection did
                        log.exception("unexpected error accepting a connection on %s", self.url)

    def _accept_one(self) -> None:
        try:
            sock, addr = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            # Out of file descriptors or memory: back off instead of spinning on select().
            log.warning("cannot accept connection on %s: %s", self.url, e)
            time.sleep(0.1)
            return
        peer = _peer(addr)
        with self._lock:
            refuse = self._closed or len(self._connections) >= self._max_connections
            conn = None if refuse else _Connection(sock, peer, self)
            if conn is not None:
                self._connections.add(conn)
        if conn is None:
            log.debug(
                "refusing connection from %s: %d connections open", peer, self._max_connections
            )
            _refuse(sock, tls=self.tls is not None)
            return
        conn.thread.start()

    def _forget(self, conn: _Connection) -> None:
        with self._lock:
            self._connections.discard(conn)


class _Connection:
    """One accepted connection and its thread; ``sock`` becomes the TLS socket once
    wrapped, so ``abort()`` always reaches the live descriptor."""

    def __init__(self, sock: socket.socket, peer: str, server: MetricsServer) -> None:
        self.sock = sock
        self.peer = peer
        self.server = server
        self.thread = threading.Thread(target=self._run, name="fabricscope-http-conn", daemon=True)

    def _run(self) -> None:
        try:
            self.sock.settimeout(CONNECTION_TIMEOUT_SECONDS)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.server.tls is not None and not self._start_tls(self.server.tls):
                return
            if _Handler(self).unread_input:
                self._linger()
        except (OSError, ValueError) as e:  # resets, timeouts, TLS failures, closed sockets
            log.debug("connection from %s ended: %s", self.peer, e)
        finally:
            self.sock.close()
            self.server._forget(self)

    def _start_tls(self, tls: _TLSContexts) -> bool:
        first = self.sock.recv(1, socket.MSG_PEEK)
        if not first:
            return False
        if first[0] != _TLS_HANDSHAKE_RECORD:
            log.debug("plain HTTP from %s on a TLS port", self.peer)
            self.sock.sendall(_PLAIN_ON_TLS)
            self._linger()
            return False
        # The handshake runs here, on the connection's thread, bounded by the socket timeout.
        self.sock = tls.current().wrap_socket(self.sock, server_side=True)
        return True

    def _linger(self) -> None:
        """Close after reading what the client is still sending (bounded): closing with
        unread input sends a TCP reset, which can destroy the reply before it is read."""
        socket.socket.shutdown(self.sock, socket.SHUT_WR)
        self.sock.settimeout(_LINGER_SECONDS)
        deadline = time.monotonic() + _LINGER_SECONDS
        drained = 0
        while drained < _LINGER_BYTES and time.monotonic() < deadline:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            drained += len(chunk)

    def abort(self) -> None:
        try:
            # socket.socket.shutdown, not SSLSocket.shutdown: do not touch the TLS state
            # another thread is using; just make its blocked read return.
            socket.socket.shutdown(self.sock, socket.SHUT_RDWR)
        except OSError as e:
            log.debug("closing connection from %s: %s", self.peer, e)


class _Site:
    """What the handler serves: routing data shared by every connection."""

    def __init__(
        self,
        *,
        cache: ExpositionCache,
        ready: Callable[[], bool],
        auth: BasicAuth | None,
        headers: Sequence[tuple[str, str]],
    ) -> None:
        self.cache = cache
        self.ready = ready
        self.auth = auth
        self.headers = headers


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fabricscope"
    sys_version = ""

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        #: A request body was left unread: close gracefully (see ``_Connection._linger``).
        self.unread_input = False
        self._site = conn.server.site
        self._slots = conn.server.request_slots
        # BaseRequestHandler.__init__ runs setup(), handle() (the keep-alive loop), finish().
        super().__init__(conn.sock, (conn.peer, 0), None)  # type: ignore[arg-type]

    def setup(self) -> None:
        self.connection = self._conn.sock
        self.rfile = self.connection.makefile("rb", -1)
        self.wfile = self.connection.makefile("wb", -1)

    def finish(self) -> None:
        try:
            super().finish()
        except OSError as e:
            log.debug("closing connection from %s: %s", self._conn.peer, e)

    def address_string(self) -> str:
        return self._conn.peer

    def log_message(self, format: str, *args: object) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: %s", self._conn.peer, format % args)

    def handle_one_request(self) -> None:
        # http.server's version, with our own dispatch: any method but GET/HEAD -> 405.
        try:
            self.raw_requestline = self.rfile.readline(65537)
            if len(self.raw_requestline) > 65536:
                self.requestline = ""
                self.request_version = ""
                self.command = ""
                self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG)
                return
            if not self.raw_requestline:
                self.close_connection = True
                return
            if not self.parse_request():
                return
            self._discard_body()
            if not self._slots.acquire(blocking=False):
                self._reply(HTTPStatus.SERVICE_UNAVAILABLE, b"too many requests\n")
                return
            try:
                self._dispatch()
            finally:
                self._slots.release()
        except TimeoutError as e:
            self.log_error("request timed out: %r", e)
            self.close_connection = True
        finally:
            # The writer is buffered (headers and a small body leave in one send): flush
            # every response, http.server's error replies included.
            if not self.wfile.closed:
                self.wfile.flush()

    def handle_expect_100(self) -> bool:
        # http.server's version leaves "100 Continue" in our buffered writer; send it now.
        self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.wfile.flush()
        return True

    def _dispatch(self) -> None:
        if self.command not in ("GET", "HEAD"):
            self._reply(
                HTTPStatus.METHOD_NOT_ALLOWED,
                b"method not allowed\n",
                extra=(("Allow", "GET, HEAD"),),
            )
            return
        path = self.path.partition("?")[0]
        site = self._site
        if path == "/healthz":
            if _is_ready(site.ready):
                self._reply(HTTPStatus.OK, b"ok")
            else:
                self._reply(HTTPStatus.SERVICE_UNAVAILABLE, b"not ready")
            return
        if site.auth is not None and not site.auth.check(self.headers.get("Authorization")):
            log.debug("%s: 401 for %s %s", self._conn.peer, self.command, path)
            self._reply(
                HTTPStatus.UNAUTHORIZED,
                b"unauthorized\n",
                extra=(("WWW-Authenticate", _AUTHENTICATE),),
            )
            return
        if path == "/metrics":
            accept = self.headers.get("Accept-Encoding")
            if accept is not None and accepts_gzip(accept):
                self._reply(
                    HTTPStatus.OK,
                    site.cache.gzipped(),
                    CONTENT_TYPE,
                    (("Content-Encoding", "gzip"), ("Vary", "Accept-Encoding")),
                )
            else:
                self._reply(
                    HTTPStatus.OK, site.cache.body(), CONTENT_TYPE, (("Vary", "Accept-Encoding"),)
                )
        elif path == "/":
            self._reply(HTTPStatus.OK, _LANDING_PAGE, _HTML)
        else:
            self._reply(HTTPStatus.NOT_FOUND, b"not found\n")

    def _discard_body(self) -> None:
        # No endpoint takes a body, but one left unread would be parsed as the next request
        # (or, unread at close, reset the connection): read a small one, hang up on others.
        length = self.headers.get("Content-Length")
        if "Transfer-Encoding" in self.headers:
            self.close_connection = self.unread_input = True
        elif length is not None and length != "0":
            if not (length.isascii() and length.isdigit()) or int(length) > _DRAIN_LIMIT:
                self.close_connection = self.unread_input = True
            else:
                self.rfile.read(int(length))

    def _reply(
        self,
        status: HTTPStatus,
        body: bytes,
        content_type: str = _TEXT,
        extra: Sequence[tuple[str, str]] = (),
    ) -> None:
        lines = [
            f"HTTP/1.1 {status.value} {status.phrase}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
            f"Date: {_http_date()}",
        ]
        lines.extend(f"{k}: {v}" for k, v in extra)
        lines.extend(f"{k}: {v}" for k, v in self._site.headers)
        if self.close_connection:
            lines.append("Connection: close")
        lines.append("\r\n")
        self.wfile.write("\r\n".join(lines).encode("latin-1"))
        if self.command != "HEAD":
            self.wfile.write(body)


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


def _is_ready(ready: Callable[[], bool]) -> bool:
    try:
        return bool(ready())
    except Exception:
        log.debug("readiness check raised; reporting not ready", exc_info=True)
        return False


@functools.lru_cache(maxsize=64)
def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` value allows gzip (``gzip`` or ``*`` with q > 0,
    an explicit ``gzip;q=0`` winning over ``*``)."""
    gzip_q: float | None = None
    star_q: float | None = None
    for part in accept_encoding.split(","):
        coding, _, params = part.partition(";")
        coding = coding.strip().lower()
        q = 1.0
        for param in params.split(";"):
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if coding in ("gzip", "x-gzip"):
            gzip_q = q
        elif coding == "*":
            star_q = q
    if gzip_q is not None:
        return gzip_q > 0
    return star_q is not None and star_q > 0


# --- basic auth --------------------------------------------------------------------------


def verify_password(password: bytes, hashed: bytes) -> bool:
    """bcrypt check; a password bcrypt refuses (over 72 bytes) simply does not match."""
    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:
        return False


class BasicAuth:
    """Checks ``Authorization: Basic`` headers against bcrypt hashes, remembering successes
    (see the module docstring). Thread-safe."""

    def __init__(self, users: Mapping[str, str]) -> None:
        self._hashes = {
            user.encode("utf-8"): hashed.encode("ascii") for user, hashed in users.items()
        }
        self._key = secrets.token_bytes(32)
        self._verified: dict[bytes, bytes] = {}
        self._bcrypt_lock = threading.Lock()
        self._dummy = b""
        if self._hashes:
            cost = max(int(h.split(b"$")[2]) for h in self._hashes.values())
            self._dummy = bcrypt.hashpw(secrets.token_bytes(16), bcrypt.gensalt(rounds=cost))

    @property
    def enabled(self) -> bool:
        return bool(self._hashes)

    def check(self, authorization: str | None) -> bool:
        if authorization is None:
            return False
        scheme, _, credentials = authorization.strip().partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(credentials.strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        user, sep, password = decoded.partition(b":")
        if not sep:
            return False
        digest = hashlib.blake2b(
            len(user).to_bytes(4, "big") + user + password, key=self._key, digest_size=32
        ).digest()
        known = self._verified.get(user)
        if known is not None and hmac.compare_digest(known, digest):
            return True
        hashed = self._hashes.get(user)
        with self._bcrypt_lock:
            # Unknown users cost a bcrypt check too, so timing does not tell them apart.
            ok = verify_password(password, hashed if hashed is not None else self._dummy)
            if ok and hashed is not None:
                self._verified[user] = digest
                return True
        return False


# --- sockets -----------------------------------------------------------------------------


class _TLSContexts:
    """The current SSLContext, rebuilt when a certificate, key or CA file changes."""

    def __init__(self, config: TLSServerConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._stamp = self._fingerprint()
        self._context = config.ssl_context()

    def current(self) -> ssl.SSLContext:
        stamp = self._fingerprint()
        if stamp != self._stamp:
            with self._lock:
                if stamp != self._stamp:
                    self._stamp = stamp
                    try:
                        self._context = self.config.ssl_context()
                        log.info("reloaded TLS certificate %s", self.config.cert_file)
                    except ConfigError as e:
                        log.warning(
                            "TLS files changed but cannot be used, keeping the old ones: %s", e
                        )
        return self._context

    def _fingerprint(self) -> tuple[tuple[int, int, int] | None, ...]:
        out: list[tuple[int, int, int] | None] = []
        for path in self.config.files():
            try:
                st = os.stat(path)  # follows symlinks: a swapped Secret mount changes st_ino
            except OSError:
                out.append(None)
            else:
                out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(out)


def _listen(address: str) -> socket.socket:
    host, port = parse_listen_address(address)
    try:
        if host == "":
            if socket.has_dualstack_ipv6():
                sock = socket.create_server(
                    ("", port), family=socket.AF_INET6, backlog=128, dualstack_ipv6=True
                )
            else:
                sock = socket.create_server(("", port), family=socket.AF_INET, backlog=128)
        else:
            try:
                infos = socket.getaddrinfo(
                    host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
                )
            except socket.gaierror as e:
                raise ConfigError(
                    f"cannot listen on {address}: cannot resolve {host}: {e.strerror}"
                ) from None
            family, _, _, _, sockaddr = infos[0]
            sock = socket.create_server(sockaddr[:2], family=family, backlog=128)
    except OSError as e:
        reason = {
            errno.EADDRINUSE: "address already in use",
            errno.EACCES: "permission denied",
            errno.EADDRNOTAVAIL: "address not available on this host",
        }.get(e.errno or 0, (e.strerror or str(e)).lower())
        raise ConfigError(f"cannot listen on {address}: {reason}") from None
    sock.setblocking(False)
    return sock


def _refuse(sock: socket.socket, *, tls: bool) -> None:
    try:
        if not tls:
            sock.setblocking(False)
            sock.send(_REFUSED)
    except OSError as e:
        log.debug("refusing connection: %s", e)
    finally:
        sock.close()


def _peer(addr: object) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        host, port = addr[0], addr[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(addr)
