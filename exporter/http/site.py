"""What the metrics server answers, independent of sockets.

Endpoints:

- ``GET /metrics``: the cached exposition (``ExpositionCache.body()``), or its cached gzip
  form with ``Content-Encoding: gzip`` when the client's ``Accept-Encoding`` allows gzip.
  A scrape never samples or renders: it costs an auth check and a socket write.
- ``GET /healthz``: ``200 ok`` when ``ready()`` is true, else ``503``.
- ``GET /``: a small landing page linking ``/metrics``.
- any other path: 404; any method but GET and HEAD: 405.

Basic auth guards every path **except /healthz**: ``/healthz`` says only whether the agent
is ready, and kubelet probes cannot easily carry credentials, so it stays open. Nor can they
carry a client certificate: with ``--web.health-listen-address`` a second, plain-HTTP server
answers ``/healthz`` alone (``health_only``: every other path is 404), for probes of an agent
whose web config requires client certificates.
Unauthenticated requests get ``401`` with ``WWW-Authenticate: Basic realm="fabricscope"``.

:meth:`Site.quick` answers what needs no blocking call (everything but ``/healthz`` and a
first bcrypt check); the server runs ``ready()`` and :meth:`Site.check` (bcrypt) on worker
threads of their own otherwise (``exporter.http.server``, ``exporter.http.authlimit``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from exporter.http.basicauth import AUTHENTICATE, BasicAuth
from exporter.metrics.exposition import CONTENT_TYPE, ExpositionCache

log = logging.getLogger(__name__)

TEXT = "text/plain; charset=utf-8"
_HTML = "text/html; charset=utf-8"
LANDING_PAGE = b"""<!DOCTYPE html>
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


@dataclass(frozen=True, slots=True)
class Request:
    """The parts of a request the site looks at (header values as received)."""

    method: str
    target: str
    authorization: str | None = None
    accept_encoding: str | None = None


@dataclass(frozen=True, slots=True)
class Response:
    """Status, body and headers (``Content-Length`` and ``Date`` are the server's)."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...]


class Site:
    """Routing data shared by every connection."""

    def __init__(
        self,
        *,
        cache: ExpositionCache,
        ready: Callable[[], bool],
        auth: BasicAuth | None,
        headers: Sequence[tuple[str, str]] = (),
        health_only: bool = False,
    ) -> None:
        self.cache = cache
        self.ready = ready
        self.auth = auth
        self.headers = tuple(headers)
        #: answer ``/healthz`` and nothing else (404): the health listener
        self.health_only = health_only

    def quick(self, req: Request) -> Response | None:
        """The response, or None when only :meth:`answer` (which may block) can give it."""
        if req.method not in ("GET", "HEAD"):
            return self.route(req, authorized=True)
        path = _path(req)
        if path == "/healthz":
            return None
        authorized = True
        if self.auth is not None:
            cached = self.auth.check_cached(req.authorization)
            if cached is None:
                return None
            authorized = cached
        return self.route(req, authorized=authorized)

    def answer(self, req: Request) -> Response:
        """The response; may run ``ready()`` and a bcrypt check (50-250 ms)."""
        authorized = True
        if not self.is_health(req) and req.method in ("GET", "HEAD"):
            authorized = self.check(req)
        return self.route(req, authorized=authorized)

    def is_health(self, req: Request) -> bool:
        """Whether ``req`` asks for ``/healthz`` (answered without credentials)."""
        return req.method in ("GET", "HEAD") and _path(req) == "/healthz"

    def check(self, req: Request) -> bool:
        """The full credential check: bcrypt on a cache miss (50-250 ms; off the loop, and
        only when the server's ``AuthGate`` admits it)."""
        return self.auth is None or self.auth.check(req.authorization)

    def is_ready(self) -> bool:
        """``ready()``, False when it raises (may block: run off the loop)."""
        return _is_ready(self.ready)

    def health(self, ready: bool) -> Response:
        """``/healthz``'s answer for a ``ready()`` result."""
        return self._reply(200, b"ok") if ready else self._reply(503, b"not ready")

    def too_many_checks(self, status: int, retry_after: int) -> Response:
        """``429`` (this client's failed logins, or a check of its already running) or
        ``503`` (checks in all at their cap), with ``Retry-After``; no bcrypt was run."""
        body = (
            b"too many authentication attempts\n"
            if status == 429
            else b"too many authentication attempts in progress\n"
        )
        return self._reply(status, body, extra=(("Retry-After", str(retry_after)),))

    def status(self, status: int, body: bytes) -> Response:
        """A plain-text response carrying the configured headers (for server errors)."""
        return Response(status, body, (("Content-Type", TEXT), *self.headers))

    def route(self, req: Request, *, authorized: bool) -> Response:
        if req.method not in ("GET", "HEAD"):
            return self._reply(405, b"method not allowed\n", extra=(("Allow", "GET, HEAD"),))
        path = _path(req)
        if path == "/healthz":
            return self.health(self.is_ready())
        if self.health_only:
            return self._reply(404, b"not found\n")
        if not authorized:
            return self._reply(401, b"unauthorized\n", extra=(("WWW-Authenticate", AUTHENTICATE),))
        if path == "/metrics":
            accept = req.accept_encoding
            if accept is not None and accepts_gzip(accept):
                return self._reply(
                    200,
                    self.cache.gzipped(),
                    CONTENT_TYPE,
                    (("Content-Encoding", "gzip"), ("Vary", "Accept-Encoding")),
                )
            return self._reply(200, self.cache.body(), CONTENT_TYPE, (("Vary", "Accept-Encoding"),))
        if path == "/":
            return self._reply(200, LANDING_PAGE, _HTML)
        return self._reply(404, b"not found\n")

    def _reply(
        self,
        status: int,
        body: bytes,
        content_type: str = TEXT,
        extra: Sequence[tuple[str, str]] = (),
    ) -> Response:
        return Response(status, body, (("Content-Type", content_type), *extra, *self.headers))


def _path(req: Request) -> str:
    return req.target.partition("?")[0]


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
