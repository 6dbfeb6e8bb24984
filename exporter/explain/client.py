"""A small client for Prometheus's HTTP API (``/api/v1/query``, ``query_range``, ``series``).

Every failure becomes one ``PrometheusError`` whose message is a single line a person can
act on (server down, refused, too slow, TLS, authentication, an HTTP error, an answer that is
not Prometheus JSON, a query Prometheus rejected). Requests are POSTed as form data, so a
query naming 64 instances does not run into URL length limits.

An answer is untrusted input, bounded three ways: one deadline (``timeout``) covers connect,
headers and body together (a server trickling a byte a second cannot hold it past the
deadline: the request runs in a worker thread the caller stops waiting for, and the worker
stops reading at the deadline); the body is read in chunks up to ``max_body_bytes`` (64 MiB
by default; a bigger one is refused, by its Content-Length before reading when it has one);
and JSON nested absurdly deep, or with ``NaN``/``Infinity`` literals (not JSON), is refused.
Sample values may be ``NaN`` or ``±Inf`` (Prometheus's own, from 0/0 or x/0): the callers
that need finite numbers check (:mod:`exporter.explain.discover`).

Requests ask for gzip (Prometheus compresses its JSON about twentyfold); a gzip answer may
decompress to ``max_body_bytes`` at most (a bomb costs one line, not the memory). An
optional ``hook`` (``exporter.explain.plan.RunLedger``) holds every request to the run's
deadline and counts it.
"""

from __future__ import annotations

import base64
import http.client
import itertools
import json
import math
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, cast


class PrometheusError(Exception):
    """A Prometheus request failed; ``str()`` is one line saying why."""


#: the largest answer read by default (a week of 1,000 series at a 1-minute step is ~20 MB)
DEFAULT_MAX_BODY_BYTES = 64 << 20
_CHUNK = 1 << 16


class _TooBig(Exception):  # noqa: N818 - control flow inside this module
    pass


def _size(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n} bytes"


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """How to reach Prometheus.

    ``timeout`` is seconds per request: connect, headers and body together.
    ``max_body_bytes``: the largest answer read. ``password_file`` and
    ``bearer_token_file`` are read at start (secrets never go on a command line);
    ``ca_file`` verifies the server, ``cert_file``/``key_file`` are a client certificate;
    ``insecure`` skips verification.
    """

    url: str
    timeout: float = 10.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure: bool = False
    username: str | None = None
    password_file: str | None = None
    bearer_token_file: str | None = None


@dataclass(frozen=True, slots=True)
class Sample:
    """One element of an instant vector."""

    labels: Mapping[str, str]
    value: float


#: one element of an instant query's answer as :meth:`PrometheusClient.vector` gives it
Pair = tuple[Mapping[str, str], float]


@dataclass(frozen=True, slots=True)
class Series:
    """One element of a range query's matrix: timestamps (unix seconds) and values."""

    labels: Mapping[str, str]
    times: tuple[float, ...]
    values: tuple[float, ...]


class RequestHook(Protocol):
    """What the client tells the run about its requests (exporter.explain.plan.RunLedger)."""

    def timeout(self, per_request: float) -> float: ...

    def done(self, wire: int, body: int) -> None: ...


def _read_secret(path: str, what: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise PrometheusError(f"cannot read the {what} file {path}: {exc.strerror}") from exc


class PrometheusClient:
    """Talks to one Prometheus server. Thread-safe (one connection per request)."""

    def __init__(self, settings: ClientSettings, hook: RequestHook | None = None) -> None:
        parsed = urllib.parse.urlsplit(settings.url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise PrometheusError(
                f"--prometheus.url must be http(s)://host:port[/prefix], got {settings.url!r}"
            )
        self.settings = settings
        self.hook = hook
        self.base = settings.url.rstrip("/")
        self._headers: dict[str, str] = {"Accept": "application/json", "Accept-Encoding": "gzip"}
        if settings.bearer_token_file and settings.username:
            raise PrometheusError("give either a bearer token file or basic auth, not both")
        if settings.bearer_token_file:
            token = _read_secret(settings.bearer_token_file, "bearer token")
            self._headers["Authorization"] = f"Bearer {token}"
        elif settings.username:
            password = (
                _read_secret(settings.password_file, "password") if settings.password_file else ""
            )
            raw = f"{settings.username}:{password}".encode()
            self._headers["Authorization"] = "Basic " + base64.b64encode(raw).decode()
        self._context: ssl.SSLContext | None = None
        if parsed.scheme == "https":
            self._context = self._ssl_context()
        # never use proxies from the environment: Prometheus is addressed directly
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
        if self._context is not None:
            handlers.append(urllib.request.HTTPSHandler(context=self._context))
        self._opener = urllib.request.build_opener(*handlers)

    def _ssl_context(self) -> ssl.SSLContext:
        s = self.settings
        try:
            ctx = ssl.create_default_context(cafile=s.ca_file)
            if s.cert_file:
                ctx.load_cert_chain(s.cert_file, s.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise PrometheusError(f"cannot load TLS files: {exc}") from exc
        if s.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    # --- the API --------------------------------------------------------------------------

    def query(self, expr: str, at: float) -> list[Sample]:
        """Instant query evaluated at unix time ``at``; a scalar becomes one unlabelled
        sample."""
        return [Sample(labels, value) for labels, value in self.vector(expr, at)]

    def vector(self, expr: str, at: float) -> list[Pair]:
        """:meth:`query`'s answer as ``(labels, value)`` pairs, for a caller reading a large
        job's answers (a 1,024-node job's checks return 650,000 samples: no object each)."""
        data = self._call("query", {"query": expr, "time": _ts(at)})
        kind, result = _result(data, expr)
        if kind == "scalar":
            return [({}, _value(result, expr))]
        if kind != "vector" or not isinstance(result, list):
            raise PrometheusError(f"query {expr!r}: unexpected result type {kind!r}")
        return _pairs(result, expr)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        data = self._call(
            "query_range",
            {"query": expr, "start": _ts(start), "end": _ts(end), "step": f"{step:g}"},
        )
        kind, result = _result(data, expr)
        if kind != "matrix" or not isinstance(result, list):
            raise PrometheusError(f"range query {expr!r}: unexpected result type {kind!r}")
        out = []
        for item in result:
            if not isinstance(item, dict) or not isinstance(item.get("values"), list):
                raise PrometheusError(f"range query {expr!r}: malformed matrix element")
            pairs = [(_time(p, expr), _value(p, expr)) for p in item["values"]]
            out.append(
                Series(
                    _labels(item.get("metric"), expr),
                    tuple(t for t, _ in pairs),
                    tuple(v for _, v in pairs),
                )
            )
        return out

    def series(self, matchers: Sequence[str], start: float, end: float) -> list[dict[str, str]]:
        """Label sets of the series matching any of ``matchers`` in [start, end]."""
        params = [("match[]", m) for m in matchers]
        params += [("start", _ts(start)), ("end", _ts(end))]
        data = self._call("series", params)
        if not isinstance(data, list):
            raise PrometheusError(f"series {list(matchers)!r}: unexpected answer")
        return [_labels(d, "series") for d in data]

    # --- transport ------------------------------------------------------------------------

    def _call(self, endpoint: str, params: Mapping[str, str] | Sequence[tuple[str, str]]) -> object:
        url = f"{self.base}/api/v1/{endpoint}"
        body = urllib.parse.urlencode(params).encode()
        headers = dict(self._headers, **{"Content-Type": "application/x-www-form-urlencoded"})
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        where = f"Prometheus at {self.base}"
        timeout = self.settings.timeout
        flag = "--prometheus.timeout"
        if self.hook is not None:
            timeout = self.hook.timeout(timeout)
            flag = "--prometheus.timeout" if timeout >= self.settings.timeout else "--deadline"
        cap = self.settings.max_body_bytes
        too_slow = (
            f"{where} did not answer /api/v1/{endpoint} within {timeout:.3g}s "
            f"(overloaded, or a query too large? {flag} raises the limit)"
        )
        try:
            raw, encoding = self._fetch(request, time.monotonic() + timeout)
        except _TooBig:
            raise PrometheusError(
                f"{where} answered /api/v1/{endpoint} with more than {_size(cap)} "
                "(--prometheus.max-body-bytes raises the limit; or narrow --window)"
            ) from None
        except urllib.error.HTTPError as exc:
            raise PrometheusError(_http_error(where, endpoint, exc)) from None
        except urllib.error.URLError as exc:
            raise PrometheusError(_connect_error(where, exc.reason, timeout)) from None
        except TimeoutError:
            raise PrometheusError(too_slow) from None
        except (ConnectionError, http.client.HTTPException, OSError) as exc:
            raise PrometheusError(f"{where}: connection failed: {_one_line(exc)}") from None
        wire = len(raw)
        if encoding.strip().lower() == "gzip":
            raw = _gunzip(raw, f"{where} answered /api/v1/{endpoint} with a gzip body", cap)
        if self.hook is not None:
            self.hook.done(wire, len(raw))
        try:
            answer = json.loads(raw, parse_constant=_no_constant)
        except RecursionError:
            raise PrometheusError(
                f"{where} answered /api/v1/{endpoint} with JSON nested absurdly deep: "
                "is the URL a Prometheus server?"
            ) from None
        except _NotJson as exc:
            raise PrometheusError(
                f"{where} answered /api/v1/{endpoint} with {exc}, which is not JSON: "
                "is the URL a Prometheus server?"
            ) from None
        except (ValueError, UnicodeDecodeError):
            raise PrometheusError(
                f"{where} answered /api/v1/{endpoint} with something that is not JSON "
                f"({_snippet(raw)}): is the URL a Prometheus server?"
            ) from None
        if not isinstance(answer, dict) or "status" not in answer:
            raise PrometheusError(
                f"{where} answered /api/v1/{endpoint} with JSON that is not a Prometheus API "
                "answer: is the URL a Prometheus server?"
            )
        if answer.get("status") != "success":
            raise PrometheusError(
                f"{where} refused the request to /api/v1/{endpoint}: "
                f"{answer.get('errorType', 'error')}: {_one_line(answer.get('error', ''))}"
            )
        return answer.get("data")

    def _fetch(self, request: urllib.request.Request, deadline: float) -> tuple[bytes, str]:
        """The body of the answer to ``request``, by ``deadline`` (monotonic seconds), at most
        ``max_body_bytes`` of it. Runs in a worker thread: the wait for it ends at the
        deadline whatever the server does; the worker notices the deadline between chunks
        (and each read waits at most the timeout), then stops."""
        box: dict[str, object] = {}

        def work() -> None:
            try:
                box["body"] = self._read(request, deadline)
            except BaseException as exc:  # handed to the caller's thread as it is
                box["error"] = exc

        worker = threading.Thread(target=work, name="prometheus-request", daemon=True)
        worker.start()
        worker.join(max(0.0, deadline - time.monotonic()))
        if worker.is_alive():
            raise TimeoutError
        if "error" in box:
            raise cast(BaseException, box["error"])
        return cast(tuple[bytes, str], box["body"])

    def _read(self, request: urllib.request.Request, deadline: float) -> tuple[bytes, str]:
        """The body, as sent (gzip'd or not), and its Content-Encoding."""
        cap = self.settings.max_body_bytes
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        with self._opener.open(request, timeout=left) as response:
            length = response.headers.get("Content-Length")
            if length is not None and length.strip().isdigit() and int(length) > cap:
                raise _TooBig
            chunks: list[bytes] = []
            total = 0
            while True:
                if time.monotonic() > deadline:
                    raise TimeoutError
                chunk = response.read1(_CHUNK)
                if not chunk:
                    return b"".join(chunks), response.headers.get("Content-Encoding", "")
                total += len(chunk)
                if total > cap:
                    raise _TooBig
                chunks.append(chunk)


def _pairs(result: list[object], expr: str) -> list[Pair]:
    """A vector's elements as ``(labels, value)``. An answer as Prometheus writes it (every
    element a dict with a ``metric`` of string labels and a ``value`` of ``[time, "number"]``)
    is read in a few passes over it, in C; anything else element by element, which says what
    is malformed (a 1,024-node job's answers hold 600,000 elements: the careful way took a
    tenth of explain's CPU)."""
    try:
        metrics = [item["metric"] for item in result]  # type: ignore[index]
        values = [item["value"] for item in result]  # type: ignore[index]
        # every label set a dict of strings (dict.values refuses anything but a dict)
        "".join(itertools.chain.from_iterable(map(dict.values, metrics)))
        numbers = [
            float(v[1]) for v in values if type(v) is list and len(v) == 2 and type(v[1]) is str
        ]
    except (TypeError, KeyError, ValueError):
        return _pairs_one_by_one(result, expr)
    if len(numbers) != len(values):
        return _pairs_one_by_one(result, expr)
    return list(zip(metrics, numbers, strict=True))


def _pairs_one_by_one(result: list[object], expr: str) -> list[Pair]:
    out: list[Pair] = []
    append = out.append
    for item in result:
        if type(item) is not dict:
            raise PrometheusError(f"query {expr!r}: malformed vector element")
        pair = item.get("value")
        if type(pair) is list and len(pair) == 2 and type(pair[1]) is str:
            try:
                value = float(pair[1])
            except ValueError:
                value = _value(pair, expr)
        else:
            value = _value(pair, expr)
        append((_labels(item.get("metric"), expr), value))
    return out


class _NotJson(ValueError):  # noqa: N818 - control flow inside this module
    pass


def _no_constant(name: str) -> object:
    """``NaN``, ``Infinity``, ``-Infinity`` as bare JSON tokens: Python's json takes them,
    JSON does not (Prometheus writes non-finite values as strings)."""
    raise _NotJson(f"a bare {name}")


def _gunzip(raw: bytes, what: str, cap: int) -> bytes:
    """Decompress a gzip body to at most ``cap`` bytes (PrometheusError beyond, or when it is
    not gzip or is cut short)."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(raw, cap)
        if inflater.unconsumed_tail:
            raise PrometheusError(
                f"{what} that decompresses to more than {_size(cap)} "
                "(--prometheus.max-body-bytes raises the limit)"
            )
        if not inflater.eof:
            raise PrometheusError(f"{what} that is cut short")
    except zlib.error:
        raise PrometheusError(f"{what} that does not decompress") from None
    return out


def _http_error(where: str, endpoint: str, exc: urllib.error.HTTPError) -> str:
    detail = ""
    try:
        raw = exc.read(_CHUNK) or b"{}"
        if (exc.headers.get("Content-Encoding") or "").strip().lower() == "gzip":
            raw = _gunzip(raw, "error body", _CHUNK)
        payload = json.loads(raw)
        if isinstance(payload, dict) and payload.get("error"):
            detail = f": {payload.get('errorType', 'error')}: {_one_line(payload['error'])}"
    except (ValueError, OSError, UnicodeDecodeError, PrometheusError):
        detail = ""
    hint = ""
    if exc.code in (401, 403):
        hint = (
            " (check --prometheus.username/--prometheus.password-file or "
            "--prometheus.bearer-token-file)"
        )
    elif exc.code == 404:
        hint = " (is the URL's path prefix right?)"
    return f"{where} answered /api/v1/{endpoint} with HTTP {exc.code} {exc.reason}{detail}{hint}"


def _connect_error(where: str, reason: object, timeout: float) -> str:
    if isinstance(reason, ssl.SSLCertVerificationError):
        return (
            f"{where}: TLS certificate not trusted ({reason.verify_message}); give "
            "--prometheus.ca-file, or --prometheus.insecure-skip-verify to skip the check"
        )
    if isinstance(reason, ssl.SSLError):
        return f"{where}: TLS failed: {_one_line(reason)}"
    if isinstance(reason, ConnectionRefusedError):
        return f"{where} refused the connection: is Prometheus running there?"
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return f"{where} did not answer within {timeout:g}s (down or overloaded?)"
    if isinstance(reason, socket.gaierror):
        return f"{where}: cannot resolve the host name ({reason.strerror})"
    if isinstance(reason, OSError) and reason.strerror:
        return f"{where}: cannot connect: {reason.strerror}"
    return f"{where}: cannot connect: {_one_line(reason)}"


def _one_line(value: object) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _snippet(raw: bytes) -> str:
    text = raw[:60].decode("utf-8", "replace")
    return repr(" ".join(text.split())) if text.strip() else "an empty body"


def _ts(t: float) -> str:
    return f"{t:.3f}"


def _result(data: object, expr: str) -> tuple[str, object]:
    if not isinstance(data, dict):
        raise PrometheusError(f"query {expr!r}: answer without data")
    return str(data.get("resultType", "")), data.get("result")


def _labels(raw: object, expr: str) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise PrometheusError(f"query {expr!r}: malformed label set")
    # JSON keys are strings; values are too in every answer Prometheus gives (kept as they
    # came, no copy: a 1,024-node job's answers hold a million label sets). The check is
    # str.join's, in C: it refuses anything but strings with a TypeError
    try:
        "".join(raw.values())
    except TypeError:
        return {str(k): str(v) for k, v in raw.items()}
    return cast("dict[str, str]", raw)


def _value(pair: object, expr: str) -> float:
    if not isinstance(pair, list) or len(pair) != 2:
        raise PrometheusError(f"query {expr!r}: malformed sample")
    try:
        return float(pair[1])
    except (TypeError, ValueError):
        raise PrometheusError(f"query {expr!r}: sample value {pair[1]!r} is not a number") from None


def _time(pair: object, expr: str) -> float:
    if not isinstance(pair, list) or len(pair) != 2:
        raise PrometheusError(f"query {expr!r}: malformed sample")
    try:
        t = float(pair[0])
    except (TypeError, ValueError):
        raise PrometheusError(f"query {expr!r}: timestamp {pair[0]!r} is not a number") from None
    if not math.isfinite(t):
        raise PrometheusError(f"query {expr!r}: timestamp {pair[0]!r} is not finite")
    return t
