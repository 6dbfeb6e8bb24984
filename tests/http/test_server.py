"""exporter.http.server: real sockets, real TLS, and a real Prometheus scraping it."""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import logging
import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

import exporter.http.basicauth as basicauth_module
from agent.core.errors import ConfigError
from exporter.http.authlimit import AuthLimits
from exporter.http.server import (
    HEALTH_REUSE_SECONDS,
    ConnectionLimits,
    MetricsServer,
    accepts_gzip,
    parse_listen_address,
    serve,
)
from exporter.http.webconfig import WebConfig, load_web_config
from exporter.metrics.exposition import CONTENT_TYPE, ExpositionCache, render_text
from exporter.metrics.spec import Families, MetricSpec
from tests.promharness import (
    TestPKI,
    promtool_check_metrics,
    promtool_check_web_config,
    start_prometheus,
    wait_until,
    write_test_pki,
)

USER = "prometheus"
PASSWORD = "s3cret pass"

EVENTS = MetricSpec(
    "fabricscope_test_events_total", "counter", "Events seen by the test.", labels=("device",)
)
INFO = MetricSpec("fabricscope_test_build_info", "gauge", "Test build.", labels=("version",))


# --- fixtures and helpers ----------------------------------------------------------------


@pytest.fixture
def cache() -> ExpositionCache:
    families = Families()
    families.add(EVENTS, 7, "mlx5_0")
    families.add(EVENTS, 0, "mlx5_1")
    families.add(INFO, 1, "0.1.0")
    cache = ExpositionCache()
    cache.set_fragment("test", render_text(families))
    return cache


@pytest.fixture
def plain_server(cache: ExpositionCache) -> Iterator[MetricsServer]:
    with serve(cache, "127.0.0.1:0") as srv:
        yield srv


@pytest.fixture(scope="module")
def bcrypt_hash() -> str:
    # Cost 4 keeps tests fast; exporter-toolkit (promtool) accepts it.
    return bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()


@pytest.fixture
def pki(tmp_path: Path) -> TestPKI:
    return write_test_pki(tmp_path / "pki")


def write_web_config(path: Path, text: str) -> WebConfig:
    """Write a web config, prove exporter-toolkit accepts it, and load it."""
    path.write_text(text)
    promtool_check_web_config(path)
    return load_web_config(str(path))


@pytest.fixture
def tls_auth_config(tmp_path: Path, pki: TestPKI, bcrypt_hash: str) -> WebConfig:
    return write_web_config(
        tmp_path / "web-auth.yml",
        f"""\
tls_server_config:
  cert_file: pki/server.crt
  key_file: pki/server.key
basic_auth_users:
  {USER}: '{bcrypt_hash}'
""",
    )


@pytest.fixture
def mtls_config(tmp_path: Path, pki: TestPKI) -> WebConfig:
    return write_web_config(
        tmp_path / "web-mtls.yml",
        """\
tls_server_config:
  cert_file: pki/server.crt
  key_file: pki/server.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: pki/ca.crt
""",
    )


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str]
    body: bytes


def client_context(pki: TestPKI, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    return ctx


def connect(
    srv: MetricsServer, context: ssl.SSLContext | None = None
) -> http.client.HTTPConnection:
    if context is not None:
        return http.client.HTTPSConnection("127.0.0.1", srv.port, timeout=10, context=context)
    return http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)


def request(
    conn: http.client.HTTPConnection,
    path: str,
    *,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
    auth: tuple[str, str] | None = None,
) -> Response:
    hdrs = dict(headers or {})
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        hdrs["Authorization"] = f"Basic {token}"
    conn.request(method, path, headers=hdrs)
    r = conn.getresponse()
    body = r.read()
    return Response(r.status, {k.lower(): v for k, v in r.getheaders()}, body)


def fetch(
    srv: MetricsServer,
    path: str,
    *,
    context: ssl.SSLContext | None = None,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
    auth: tuple[str, str] | None = None,
) -> Response:
    """One request on a fresh connection."""
    conn = connect(srv, context)
    try:
        return request(conn, path, method=method, headers=headers, auth=auth)
    finally:
        conn.close()


# --- a real Prometheus -------------------------------------------------------------------


def test_prometheus_scrapes_plain_server(
    tmp_path: Path, cache: ExpositionCache, plain_server: MetricsServer
) -> None:
    body = fetch(plain_server, "/metrics").body
    assert body == cache.body()
    promtool_check_metrics(body)
    job = {
        "job_name": "fabricscope",
        "static_configs": [{"targets": [f"127.0.0.1:{plain_server.port}"]}],
    }
    with start_prometheus(tmp_path / "prom", [job]) as prom:
        prom.wait_for_targets(job="fabricscope")
        samples = prom.wait_for_query('fabricscope_test_events_total{job="fabricscope"}')
        assert {s.labels["device"]: s.value for s in samples} == {"mlx5_0": 7.0, "mlx5_1": 0.0}


def test_prometheus_scrapes_over_tls_with_basic_auth_and_client_certs(
    tmp_path: Path,
    cache: ExpositionCache,
    pki: TestPKI,
    tls_auth_config: WebConfig,
    mtls_config: WebConfig,
) -> None:
    tls = {"ca_file": str(pki.ca_cert)}
    client_tls = {**tls, "cert_file": str(pki.client_cert), "key_file": str(pki.client_key)}
    with (
        serve(cache, "127.0.0.1:0", web_config=tls_auth_config) as auth_srv,
        serve(cache, "127.0.0.1:0", web_config=mtls_config) as mtls_srv,
    ):

        def job(name: str, srv: MetricsServer, **extra: object) -> dict[str, object]:
            return {
                "job_name": name,
                "scheme": "https",
                "static_configs": [{"targets": [f"127.0.0.1:{srv.port}"]}],
                **extra,
            }

        jobs = [
            job(
                "auth",
                auth_srv,
                tls_config=tls,
                basic_auth={"username": USER, "password": PASSWORD},
            ),
            job("noauth", auth_srv, tls_config=tls),
            job("plain", auth_srv, scheme="http"),
            job("mtls", mtls_srv, tls_config=client_tls),
            job("mtls_nocert", mtls_srv, tls_config=tls),
        ]
        with start_prometheus(tmp_path / "prom", jobs) as prom:
            prom.wait_for_targets(job="auth")
            prom.wait_for_targets(job="mtls")
            (noauth,) = prom.wait_for_targets(job="noauth", health="down")
            assert "401" in noauth.last_error
            (plain,) = prom.wait_for_targets(job="plain", health="down")
            assert "400" in plain.last_error
            prom.wait_for_targets(job="mtls_nocert", health="down")
            for name in ("auth", "mtls"):
                samples = prom.wait_for_query(f'fabricscope_test_events_total{{job="{name}"}}')
                assert {s.labels["device"]: s.value for s in samples} == {
                    "mlx5_0": 7.0,
                    "mlx5_1": 0.0,
                }


# --- plain HTTP behaviour ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("accept_encoding", "gzipped"),
    [(None, False), ("gzip", True), ("identity", False), ("gzip;q=0", False), ("*", True)],
)
def test_metrics_gzip_follows_accept_encoding(
    plain_server: MetricsServer,
    cache: ExpositionCache,
    accept_encoding: str | None,
    gzipped: bool,
) -> None:
    headers = {"Accept-Encoding": accept_encoding} if accept_encoding else {}
    r = fetch(plain_server, "/metrics", headers=headers)
    assert r.status == 200
    assert r.headers["content-type"] == CONTENT_TYPE
    assert r.headers["vary"] == "Accept-Encoding"
    assert int(r.headers["content-length"]) == len(r.body)
    if gzipped:
        assert r.headers["content-encoding"] == "gzip"
        assert gzip.decompress(r.body) == cache.body()
    else:
        assert "content-encoding" not in r.headers
        assert r.body == cache.body()
    assert b'fabricscope_test_events_total{device="mlx5_0"} 7.0' in cache.body()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("gzip", True),
        ("GZip", True),
        ("x-gzip", True),
        ("gzip, deflate, br", True),
        ("br;q=1.0, gzip;q=0.5", True),
        ("gzip;q=0", False),
        ("gzip; q=0.0", False),
        ("gzip;q=bogus", False),
        ("*", True),
        ("*;q=0", False),
        ("*, gzip;q=0", False),
        ("identity", False),
        ("", False),
        ("deflate, br", False),
    ],
)
def test_accepts_gzip(value: str, expected: bool) -> None:
    assert accepts_gzip(value) is expected


def test_cache_updates_are_served(plain_server: MetricsServer, cache: ExpositionCache) -> None:
    cache.set_fragment(
        "test", b"# HELP fabricscope_x X.\n# TYPE fabricscope_x gauge\nfabricscope_x 2.0\n"
    )
    assert fetch(plain_server, "/metrics").body.endswith(b"fabricscope_x 2.0\n")
    r = fetch(plain_server, "/metrics", headers={"Accept-Encoding": "gzip"})
    assert gzip.decompress(r.body) == cache.body()


def test_healthz_follows_ready(cache: ExpositionCache) -> None:
    state = {"ready": False}
    with serve(cache, "127.0.0.1:0", ready=lambda: state["ready"]) as srv:
        r = fetch(srv, "/healthz")
        assert (r.status, r.body) == (503, b"not ready")
        state["ready"] = True
        # the answer is reused for HEALTH_REUSE_SECONDS (a flood costs one ready() a second)
        time.sleep(HEALTH_REUSE_SECONDS)
        r = fetch(srv, "/healthz")
        assert (r.status, r.body) == (200, b"ok")


def test_healthz_is_not_ready_when_ready_raises(cache: ExpositionCache) -> None:
    def broken() -> bool:
        raise RuntimeError("boom")

    with serve(cache, "127.0.0.1:0", ready=broken) as srv:
        assert fetch(srv, "/healthz").status == 503
        assert fetch(srv, "/metrics").status == 200


def test_landing_page_links_metrics(plain_server: MetricsServer) -> None:
    r = fetch(plain_server, "/")
    assert r.status == 200
    assert r.headers["content-type"].startswith("text/html")
    assert b'<a href="metrics">' in r.body


@pytest.mark.parametrize("path", ["/nope", "/metrics/", "/healthz/x", "/favicon.ico"])
def test_unknown_paths_are_404(plain_server: MetricsServer, path: str) -> None:
    assert fetch(plain_server, path).status == 404


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "OPTIONS", "PATCH", "BREW"])
def test_other_methods_are_405(plain_server: MetricsServer, method: str) -> None:
    r = fetch(plain_server, "/metrics", method=method)
    assert r.status == 405
    assert r.headers["allow"] == "GET, HEAD"


def test_query_string_is_ignored(plain_server: MetricsServer, cache: ExpositionCache) -> None:
    assert fetch(plain_server, "/metrics?collect[]=x").body == cache.body()


def test_head_sends_headers_only(plain_server: MetricsServer, cache: ExpositionCache) -> None:
    r = fetch(plain_server, "/metrics", method="HEAD")
    assert r.status == 200
    assert r.body == b""
    assert int(r.headers["content-length"]) == len(cache.body())


def test_keep_alive_reuses_one_connection(
    plain_server: MetricsServer, cache: ExpositionCache
) -> None:
    conn = connect(plain_server)
    try:
        first = request(conn, "/metrics")
        sock = conn.sock
        for path in ("/metrics", "/healthz", "/nope", "/metrics"):
            r = request(conn, path)
            assert "connection" not in r.headers
        assert conn.sock is sock  # http.client reconnects silently if the server closed
        assert first.body == cache.body()
    finally:
        conn.close()


def test_request_body_does_not_corrupt_the_next_request(plain_server: MetricsServer) -> None:
    conn = connect(plain_server)
    try:
        # A small body is read and discarded; the connection stays usable.
        conn.request("POST", "/metrics", body=b"GET /nope HTTP/1.1\r\n\r\n")
        r = conn.getresponse()
        r.read()
        assert (r.status, r.getheader("Connection")) == (405, None)
        assert request(conn, "/healthz").status == 200
        # A large one makes the server hang up after replying.
        conn.request("POST", "/metrics", body=b"x" * 1_000_000)
        r = conn.getresponse()
        r.read()
        assert (r.status, r.getheader("Connection")) == (405, "close")
    finally:
        conn.close()


def test_expect_100_continue_is_answered_at_once(plain_server: MetricsServer) -> None:
    with socket.create_connection(("127.0.0.1", plain_server.port), timeout=5) as sock:
        sock.sendall(
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
            b"Expect: 100-continue\r\n\r\n"
        )
        assert sock.recv(4096).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(b"abc")
        assert sock.recv(4096).startswith(b"HTTP/1.1 405 ")


def test_a_client_that_half_closes_after_its_request_gets_the_reply(
    plain_server: MetricsServer, cache: ExpositionCache
) -> None:
    with socket.create_connection(("127.0.0.1", plain_server.port), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert body == cache.body()


def test_configured_headers_are_sent_and_auth_without_tls_warns(
    tmp_path: Path, cache: ExpositionCache, bcrypt_hash: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = write_web_config(
        tmp_path / "web.yml",
        f"""\
http_server_config:
  headers:
    X-Frame-Options: deny
    X-Content-Type-Options: nosniff
basic_auth_users:
  {USER}: '{bcrypt_hash}'
""",
    )
    with caplog.at_level(logging.WARNING, logger="exporter.http.server"):
        srv = serve(cache, "127.0.0.1:0", web_config=config)
    with srv:
        assert "clear text" in caplog.text
        assert bcrypt_hash not in caplog.text
        for path, auth, status in [
            ("/metrics", (USER, PASSWORD), 200),
            ("/metrics", None, 401),
            ("/healthz", None, 200),
            ("/nope", (USER, PASSWORD), 404),
        ]:
            r = fetch(srv, path, auth=auth)
            assert r.status == status
            assert r.headers["x-frame-options"] == "deny"
            assert r.headers["x-content-type-options"] == "nosniff"


# --- addresses ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        (":10118", ("", 10118)),
        ("127.0.0.1:10118", ("127.0.0.1", 10118)),
        ("[::1]:10118", ("::1", 10118)),
        ("[::]:0", ("::", 0)),
        ("localhost:9", ("localhost", 9)),
    ],
)
def test_parse_listen_address(address: str, expected: tuple[str, int]) -> None:
    assert parse_listen_address(address) == expected


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("10118", "expected [host]:port"),
        ("::1:10118", "IPv6 address goes in brackets"),
        ("[::1:10118", "expected [host]:port"),
        (":99999", "port must be 0-65535"),
        (":http", "port must be 0-65535"),
        ("127.0.0.1:", "port must be 0-65535"),
    ],
)
def test_bad_listen_address(cache: ExpositionCache, address: str, problem: str) -> None:
    with pytest.raises(
        ConfigError,
        match=f"^invalid listen address {re.escape(repr(address))}.*{re.escape(problem)}",
    ):
        serve(cache, address)


def test_address_in_use_is_a_clear_config_error(cache: ExpositionCache) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError) as caught:
            serve(cache, f"127.0.0.1:{port}")
    assert str(caught.value) == f"cannot listen on 127.0.0.1:{port}: address already in use"
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__


def test_all_interfaces_address_serves_loopback(cache: ExpositionCache) -> None:
    with serve(cache, ":0") as srv:
        assert srv.url == f"http://127.0.0.1:{srv.port}"
        assert fetch(srv, "/metrics").body == cache.body()


# --- TLS and basic auth ------------------------------------------------------------------


def test_basic_auth_over_tls(
    cache: ExpositionCache, pki: TestPKI, tls_auth_config: WebConfig
) -> None:
    ctx = client_context(pki)
    # 12 wrong attempts from one address: more than the default budget allows unchecked
    lenient = AuthLimits(failures_burst=100)
    with serve(cache, "127.0.0.1:0", web_config=tls_auth_config, auth_limits=lenient) as srv:
        assert srv.url.startswith("https://127.0.0.1:")
        ok = fetch(srv, "/metrics", context=ctx, auth=(USER, PASSWORD))
        assert (ok.status, ok.body) == (200, cache.body())
        for auth in [
            None,
            (USER, "wrong"),
            ("mallory", PASSWORD),
            (USER, PASSWORD + "x"),
            (USER, ""),
        ]:
            for path in ("/metrics", "/", "/nope"):
                r = fetch(srv, path, context=ctx, auth=auth)
                assert r.status == 401, (auth, path)
                assert r.headers["www-authenticate"] == 'Basic realm="fabricscope"'
                assert b"fabricscope_test" not in r.body
        # Malformed Authorization headers are refused, not crashed on.
        for value in ["Basic !!!", "Basic " + "cHJvbWV0aGV1cw==", "Bearer abc", "Basic"]:
            assert (
                fetch(srv, "/metrics", context=ctx, headers={"Authorization": value}).status == 401
            )
        # /healthz stays open for kubelet probes.
        assert fetch(srv, "/healthz", context=ctx).status == 200


def test_plain_http_client_to_tls_port_gets_no_metrics(
    cache: ExpositionCache, tls_auth_config: WebConfig
) -> None:
    with serve(cache, "127.0.0.1:0", web_config=tls_auth_config) as srv:
        r = fetch(srv, "/metrics")
        assert r.status == 400
        assert b"HTTP request to an HTTPS server" in r.body
        assert b"fabricscope_test" not in r.body


def test_successful_credentials_are_cached_failures_are_not(
    monkeypatch: pytest.MonkeyPatch,
    cache: ExpositionCache,
    pki: TestPKI,
    tls_auth_config: WebConfig,
) -> None:
    calls: list[bytes] = []
    real = basicauth_module.verify_password

    def counting(password: bytes, hashed: bytes) -> bool:
        calls.append(password)
        return real(password, hashed)

    monkeypatch.setattr(basicauth_module, "verify_password", counting)
    ctx = client_context(pki)
    with serve(cache, "127.0.0.1:0", web_config=tls_auth_config) as srv:
        conn = connect(srv, ctx)
        try:
            for _ in range(3):
                assert request(conn, "/metrics", auth=(USER, PASSWORD)).status == 200
            assert len(calls) == 1  # bcrypt ran once; the other two hit the cache
            # A new connection shares the cache.
            assert fetch(srv, "/metrics", context=ctx, auth=(USER, PASSWORD)).status == 200
            assert len(calls) == 1
            for _ in range(2):
                assert request(conn, "/metrics", auth=(USER, "wrong")).status == 401
            assert len(calls) == 3  # every failure is checked again
            # An unknown user still costs a bcrypt check (no user enumeration by timing).
            assert request(conn, "/metrics", auth=("mallory", "x")).status == 401
            assert len(calls) == 4
            # A wrong password after a good one is not let through by the cache.
            assert request(conn, "/metrics", auth=(USER, PASSWORD + "!")).status == 401
            assert request(conn, "/metrics", auth=(USER, PASSWORD)).status == 200
            assert len(calls) == 5
        finally:
            conn.close()


def test_client_certificate_is_required_and_verified(
    cache: ExpositionCache, pki: TestPKI, mtls_config: WebConfig
) -> None:
    with serve(cache, "127.0.0.1:0", web_config=mtls_config) as srv:
        good = fetch(
            srv, "/metrics", context=client_context(pki, (pki.client_cert, pki.client_key))
        )
        assert (good.status, good.body) == (200, cache.body())
        for ctx in (
            client_context(pki),
            client_context(pki, (pki.stranger_cert, pki.stranger_key)),
        ):
            with pytest.raises(OSError):  # ssl.SSLError or a reset: never a response
                fetch(srv, "/metrics", context=ctx)


def test_rotated_certificate_is_used_for_new_connections(
    tmp_path: Path,
    cache: ExpositionCache,
    pki: TestPKI,
    tls_auth_config: WebConfig,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def served_cert(srv: MetricsServer) -> bytes:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        with (
            socket.create_connection(("127.0.0.1", srv.port), timeout=10) as raw,
            ctx.wrap_socket(raw) as tls_sock,
        ):
            der = tls_sock.getpeercert(binary_form=True)
            assert der is not None
            return der

    def der(path: Path) -> bytes:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
        return cert.public_bytes(Encoding.DER)

    new = write_test_pki(tmp_path / "rotated", server_name="rotated")
    with serve(cache, "127.0.0.1:0", web_config=tls_auth_config) as srv:
        assert served_cert(srv) == der(pki.server_cert)
        # Replace files the way a Secret update does: new files renamed into place.
        for src, dst in ((new.server_key, pki.server_key), (new.server_cert, pki.server_cert)):
            os.replace(src, dst)
        assert served_cert(srv) == der(pki.server_cert)
        rotated = der(pki.server_cert)
        # A certificate without its key is refused; the server keeps the last good pair.
        other = write_test_pki(tmp_path / "other", server_name="other")
        os.replace(other.server_cert, pki.server_cert)
        with caplog.at_level(logging.WARNING, logger="exporter.http.tlsreload"):
            assert served_cert(srv) == rotated
        assert "keeping the old ones" in caplog.text


# --- limits and lifecycle ----------------------------------------------------------------


def test_concurrent_healthz_share_one_ready_call_and_scrapes_are_not_delayed(
    cache: ExpositionCache,
) -> None:
    entered = threading.Event()
    release = threading.Event()
    calls: list[float] = []

    def slow_ready() -> bool:
        calls.append(time.monotonic())
        entered.set()
        return release.wait(10)

    with serve(cache, "127.0.0.1:0", ready=slow_ready, max_requests=1) as srv:
        answers: list[Response] = []
        threads = [
            threading.Thread(target=lambda: answers.append(fetch(srv, "/healthz")))
            for _ in range(5)
        ]
        threads[0].start()
        try:
            assert entered.wait(10)
            for t in threads[1:]:  # more than max_requests: they wait for the same call
                t.start()
            # a scrape is answered on the loop meanwhile
            assert fetch(srv, "/metrics").status == 200
        finally:
            release.set()
            for t in threads:
                t.join(10)
        assert [a.status for a in answers] == [200] * 5
        assert len(calls) == 1
        # a second later the answer is asked again
        time.sleep(HEALTH_REUSE_SECONDS)
        assert fetch(srv, "/healthz").status == 200
        assert len(calls) == 2


def test_a_new_connection_closes_the_oldest_idle_one_at_the_cap(cache: ExpositionCache) -> None:
    limits = ConnectionLimits(max_connections=4, max_per_address=4)
    with serve(cache, "127.0.0.1:0", limits=limits) as srv:
        held = [connect(srv) for _ in range(4)]
        try:
            for conn in held:
                assert request(conn, "/metrics").status == 200  # accepted and kept alive
            # A fifth connection is served; the oldest idle one is closed for it.
            assert fetch(srv, "/healthz").status == 200
            oldest = held[0].sock
            assert oldest is not None
            oldest.settimeout(10)
            assert oldest.recv(1) == b""
            for conn in held[1:]:
                sock = conn.sock
                assert sock is not None
                assert request(conn, "/healthz").status == 200
                assert conn.sock is sock  # still the same connection
        finally:
            for conn in held:
                conn.close()


def test_a_connection_is_refused_only_when_all_are_busy(cache: ExpositionCache) -> None:
    entered = threading.Event()
    release = threading.Event()

    def slow_ready() -> bool:
        entered.set()
        return release.wait(10)

    limits = ConnectionLimits(max_connections=1)
    with serve(cache, "127.0.0.1:0", ready=slow_ready, limits=limits) as srv:
        first: list[Response] = []
        t = threading.Thread(target=lambda: first.append(fetch(srv, "/healthz")))
        t.start()
        try:
            assert entered.wait(10)
            with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as extra:
                extra.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                reply = b""
                while chunk := extra.recv(4096):
                    reply += chunk
            assert reply.startswith(b"HTTP/1.1 503 ")
            assert reply.endswith(b"too many connections\n")
        finally:
            release.set()
            t.join(10)
        assert first[0].status == 200
        assert fetch(srv, "/metrics").status == 200


def test_connections_per_address_displace_only_their_own(
    cache: ExpositionCache, caplog: pytest.LogCaptureFixture
) -> None:
    limits = ConnectionLimits(max_per_address=2)

    def from_other() -> socket.socket:
        return socket.create_connection(
            ("127.0.0.1", srv.port), timeout=10, source_address=("127.0.0.2", 0)
        )

    def closed(sock: socket.socket) -> bytes:
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
        return reply

    with (
        caplog.at_level(logging.WARNING, logger="exporter.http.server"),
        serve(cache, "127.0.0.1:0", limits=limits) as srv,
    ):
        scraper = connect(srv)  # from 127.0.0.1
        others: list[socket.socket] = []
        try:
            assert request(scraper, "/metrics").status == 200
            # Two half-sent requests from 127.0.0.2 fill its share...
            for _ in range(2):
                others.append(from_other())
                others[-1].sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            wait_until(lambda: srv.table.count("127.0.0.2") == 2 or None, timeout=10, what="2")
            # ...so a third connection that sends only part of a request is refused at once,
            silent = from_other()
            others.append(silent)
            silent.sendall(b"GET /metrics HTTP/1.1\r\n")
            assert closed(silent).startswith(b"HTTP/1.1 503 ")
            # while one that sends a whole request at once replaces the oldest half-sent one.
            asking = from_other()
            others.append(asking)
            asking.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert closed(asking).startswith(b"HTTP/1.1 200 OK\r\n")
            assert closed(others[0]) == b""
            # Said once, naming the address.
            warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
            assert len([w for w in warnings if "127.0.0.2 reached 2 connections" in w]) == 1
            # The scraper at 127.0.0.1 kept its connection throughout.
            sock = scraper.sock
            assert request(scraper, "/metrics").status == 200
            assert scraper.sock is sock
        finally:
            scraper.close()
            for s in others:
                s.close()


def test_a_silent_or_half_sent_request_is_closed_after_the_header_timeout(
    cache: ExpositionCache,
) -> None:
    limits = ConnectionLimits(header_timeout=0.3, idle_timeout=0.6)
    with serve(cache, "127.0.0.1:0", limits=limits) as srv:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as idle:
            assert idle.recv(1) == b""  # the server hung up; recv() would raise after 10 s
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as half:
            half.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            started = time.monotonic()
            assert half.recv(1) == b""
            assert time.monotonic() - started < 2
        # An idle keep-alive connection is kept for idle_timeout, longer than header_timeout.
        conn = connect(srv)
        try:
            assert request(conn, "/metrics").status == 200
            sock = conn.sock
            assert sock is not None
            time.sleep(0.4)
            assert request(conn, "/healthz").status == 200
            assert conn.sock is sock
            sock.settimeout(10)
            assert sock.recv(1) == b""
        finally:
            conn.close()


def test_shutdown_closes_open_connections(cache: ExpositionCache) -> None:
    srv = serve(cache, "127.0.0.1:0")
    conn = connect(srv)
    assert request(conn, "/metrics").status == 200
    assert conn.sock is not None
    sock: socket.socket = conn.sock
    srv.shutdown()
    sock.settimeout(10)
    assert sock.recv(1) == b""
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    srv.shutdown()  # twice is fine
    conn.close()


def test_max_requests_must_be_positive(cache: ExpositionCache) -> None:
    with pytest.raises(ConfigError, match="max_requests"):
        serve(cache, "127.0.0.1:0", max_requests=0)


_LATENCY_CLIENT = """
import http.client, json, sys, threading, time
port, clients, requests = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
latencies = []
def work():
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for _ in range(requests):
        start = time.perf_counter()
        conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
        response = conn.getresponse()
        response.read()
        assert response.status == 200
        latencies.append(time.perf_counter() - start)
threads = [threading.Thread(target=work) for _ in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(latencies))
"""


def test_ten_concurrent_scrapers_get_millisecond_latency(cache: ExpositionCache) -> None:
    """Serving is a cached write: 10 keep-alive clients (in another process, so they do
    not share our GIL) see a p99 of a few ms on a 2-core box. The bounds are loose enough
    for a busy CI machine but catch the classic stalls (a 40 ms Nagle/delayed-ACK wait per
    response, per-request rendering)."""
    families = Families()
    for i in range(2000):
        families.add(EVENTS, i, f"mlx5_{i}")
    cache.set_fragment("test", render_text(families))
    with serve(cache, "127.0.0.1:0") as srv:
        out = subprocess.run(
            [sys.executable, "-c", _LATENCY_CLIENT, str(srv.port), "10", "50"],
            capture_output=True,
            timeout=60,
            check=True,
        )
    latencies = sorted(json.loads(out.stdout))
    assert len(latencies) == 500
    p50, p99 = latencies[250], latencies[495]
    # Measured here: p50 ~2 ms, p99 ~7 ms (p99 up to ~35 ms with both cores busy elsewhere).
    assert p50 < 0.010, f"p50 {p50 * 1000:.1f} ms"
    assert p99 < 0.100, f"p99 {p99 * 1000:.1f} ms"
