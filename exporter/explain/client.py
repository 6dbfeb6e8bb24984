"""A small client for Prometheus's HTTP API (``/api/v1/query``, ``query_range``, ``series``).

Every failure becomes one ``PrometheusError`` whose message is a single line a person can
act on (server down, refused, too slow, TLS, authentication, an HTTP error, an answer that is
not Prometheus JSON, a query Prometheus rejected). Requests are POSTed as form data, so a
query naming 64 instances does not run into URL length limits.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


class PrometheusError(Exception):
    """A Prometheus request failed; ``str()`` is one line saying why."""


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """How to reach Prometheus.

    ``timeout`` is seconds per request. ``password_file`` and ``bearer_token_file`` are read
    at start (secrets never go on a command line); ``ca_file`` verifies the server,
    ``cert_file``/``key_file`` are a client certificate; ``insecure`` skips verification.
    """

    url: str
    timeout: float = 10.0
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


@dataclass(frozen=True, slots=True)
class Series:
    """One element of a range query's matrix: timestamps (unix seconds) and values."""

    labels: Mapping[str, str]
    times: tuple[float, ...]
    values: tuple[float, ...]


def _read_secret(path: str, what: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise PrometheusError(f"cannot read the {what} file {path}: {exc.strerror}") from exc


class PrometheusClient:
    """Talks to one Prometheus server. Thread-safe (one connection per request)."""

    def __init__(self, settings: ClientSettings) -> None:
        parsed = urllib.parse.urlsplit(settings.url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise PrometheusError(
                f"--prometheus.url must be http(s)://host:port[/prefix], got {settings.url!r}"
            )
        self.settings = settings
        self.base = settings.url.rstrip("/")
        self._headers: dict[str, str] = {"Accept": "application/json"}
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
        data = self._call("query", {"query": expr, "time": _ts(at)})
        kind, result = _result(data, expr)
        if kind == "scalar":
            return [Sample({}, _value(result, expr))]
        if kind != "vector" or not isinstance(result, list):
            raise PrometheusError(f"query {expr!r}: unexpected result type {kind!r}")
        out = []
        for item in result:
            if not isinstance(item, dict):
                raise PrometheusError(f"query {expr!r}: malformed vector element")
            out.append(Sample(_labels(item.get("metric"), expr), _value(item.get("value"), expr)))
        return out

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
        try:
            with self._opener.open(request, timeout=timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise PrometheusError(_http_error(where, endpoint, exc)) from None
        except urllib.error.URLError as exc:
            raise PrometheusError(_connect_error(where, exc.reason, timeout)) from None
        except TimeoutError:
            raise PrometheusError(
                f"{where} did not answer /api/v1/{endpoint} within {timeout:g}s "
                "(overloaded, or a query too large? --prometheus.timeout raises the limit)"
            ) from None
        except (ConnectionError, http.client.HTTPException, OSError) as exc:
            raise PrometheusError(f"{where}: connection failed: {_one_line(exc)}") from None
        try:
            answer = json.loads(raw)
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


def _http_error(where: str, endpoint: str, exc: urllib.error.HTTPError) -> str:
    detail = ""
    try:
        payload = json.loads(exc.read() or b"{}")
        if isinstance(payload, dict) and payload.get("error"):
            detail = f": {payload.get('errorType', 'error')}: {_one_line(payload['error'])}"
    except (ValueError, OSError, UnicodeDecodeError):
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
    return {str(k): str(v) for k, v in raw.items()}


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
