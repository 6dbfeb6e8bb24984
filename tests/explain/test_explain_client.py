"""The Prometheus client behind ``fabricscope explain``: every way a server can fail gives one
line and exit 2, never a traceback. Real Prometheus (plain, and with TLS + basic auth from
its own --web.config.file) where it can play the part; small real HTTP servers on
127.0.0.1 for what a healthy Prometheus never does (hang, answer HTML, 500)."""

from __future__ import annotations

import functools
import gzip
import http.server
import io
import json
import subprocess
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
import yaml

from exporter.explain.checks import CHECKS
from exporter.explain.client import ClientSettings, PrometheusClient, PrometheusError
from exporter.explain.plan import RunLedger, groups
from exporter.explain.switches import UPLINK_CHECKS
from tests.agentrun import fabricscope
from tests.promharness import PROMETHEUS, Prometheus, free_port, start_prometheus, write_test_pki


class _Handler(http.server.BaseHTTPRequestHandler):
    behaviour = "ok"
    seen: list[dict[str, str]] = []  # noqa: RUF012  # shared per server class

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(length)
        type(self).seen.append(dict(self.headers.items()))
        b = self.behaviour
        if b == "slow":
            time.sleep(3)
        if b == "html":
            self._send(200, b"<html><body>Welcome to nginx</body></html>", "text/html")
        elif b == "json_not_prometheus":
            self._send(200, b'{"hello": "world"}')
        elif b == "500":
            body = {"status": "error", "errorType": "internal", "error": "storage\nfailed"}
            self._send(500, json.dumps(body).encode())
        elif b == "502":
            self._send(502, b"Bad Gateway", "text/plain")
        elif b == "gzip":
            body = {"status": "success", "data": {"resultType": "vector", "result": [
                {"metric": {"instance": "node-01"}, "value": [1, "2.5"]}]}}  # fmt: skip
            self._send(200, gzip.compress(json.dumps(body).encode()), encoding="gzip")
        elif b == "gzip_bomb":
            self._send(200, _bomb(), encoding="gzip")
        elif b == "gzip_corrupt":
            self._send(200, b"\x1f\x8b\x08\x00garbage, not deflate", encoding="gzip")
        elif b == "gzip_truncated":
            self._send(200, gzip.compress(b'{"status": "success"}')[:-12], encoding="gzip")
        else:
            body = {"status": "success", "data": {"resultType": "vector", "result": []}}
            self._send(200, json.dumps(body).encode())

    def _send(
        self, code: int, body: bytes, ctype: str = "application/json", encoding: str = ""
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        if encoding:
            self.send_header("Content-Encoding", encoding)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@functools.cache
def _bomb() -> bytes:
    """512 MiB of zeros, gzip'd to about half a MiB (8 times the client's limit)."""
    deflate = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = bytes(1 << 20)
    out = [deflate.compress(chunk) for _ in range(512)]
    return b"".join(out) + deflate.flush()


def _server(behaviour: str) -> Iterator[tuple[str, type[_Handler]]]:
    handler = type("H", (_Handler,), {"behaviour": behaviour, "seen": []})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", handler
    finally:
        srv.shutdown()
        srv.server_close()


def _error(url: str, **kw: object) -> str:
    client = PrometheusClient(ClientSettings(url, **kw))  # type: ignore[arg-type]
    with pytest.raises(PrometheusError) as info:
        client.query("up", time.time())
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def _cli(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return fabricscope(
        [
            "explain",
            "--prometheus.url",
            url,
            "--namespace",
            "training",
            "--job",
            "llm",
            "--window",
            "1h",
            *extra,
        ],
        timeout=60,
    )


def _one_line_exit_2(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 2, out
    assert out.stdout == "" and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    return out.stderr


def test_refused_port_cli() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    err = _one_line_exit_2(_cli(url))
    expected = f"Prometheus at {url} refused the connection: is Prometheus running there?"
    assert err == f"fabricscope explain: {expected}\n"


def test_slow_server_cli_times_out() -> None:
    for url, _ in _server("slow"):
        started = time.monotonic()
        err = _one_line_exit_2(_cli(url, "--prometheus.timeout", "1s"))
        assert "did not answer" in err and "within 1s" in err
        assert time.monotonic() - started < 15


@pytest.mark.parametrize(
    ("behaviour", "expected"),
    [
        ("html", "with something that is not JSON ('<html><body>Welcome to nginx</body></html>')"),
        ("json_not_prometheus", "with JSON that is not a Prometheus API answer"),
        ("500", "with HTTP 500 Internal Server Error: internal: storage failed"),
        ("502", "with HTTP 502 Bad Gateway"),
    ],
)
def test_bad_answers(behaviour: str, expected: str) -> None:
    for url, _ in _server(behaviour):
        assert expected in _error(url)


def test_bad_url_and_unresolvable_host() -> None:
    with pytest.raises(PrometheusError, match="must be http"):
        PrometheusClient(ClientSettings("prometheus:9090"))
    assert "cannot resolve the host name" in _error("http://no-such-host.invalid:9090")


def test_bearer_token_from_file(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cr3t-token\n")
    for url, handler in _server("ok"):
        client = PrometheusClient(ClientSettings(url, bearer_token_file=str(token)))
        assert client.query("up", time.time()) == []
        assert handler.seen[-1]["Authorization"] == "Bearer s3cr3t-token"
    with pytest.raises(PrometheusError, match="cannot read the bearer token file"):
        PrometheusClient(ClientSettings("http://x:1", bearer_token_file=str(tmp_path / "no")))


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    with start_prometheus(tmp_path_factory.mktemp("prom"), []) as p:
        yield p


def test_real_prometheus_rejects_a_bad_query(prom: Prometheus) -> None:
    client = PrometheusClient(ClientSettings(prom.url))
    assert client.query("vector(1)", time.time())[0].value == 1.0
    with pytest.raises(PrometheusError) as info:
        client.query("rate(up[5m]", time.time())
    assert "HTTP 400 Bad Request: bad_data: " in str(info.value)


def test_real_prometheus_wrong_path_prefix(prom: Prometheus) -> None:
    assert "HTTP 404" in _error(prom.url + "/prometheus")


def test_an_empty_prometheus_is_could_not_judge_not_all_clear(prom: Prometheus) -> None:
    """The issue: against an empty Prometheus, ``--job llm --change-at 30m --nodes
    node-00`` printed "no fabric cause found" and exited 0 with every check "[no data]".
    Now it says it could not judge, why, on stdout (table and JSON) and stderr, exit 1."""
    args = ["--job", "llm", "--change-at", "30m", "--nodes", "node-00", "--window", "1h"]
    base = ["explain", "--prometheus.url", prom.url, *args]
    out = fabricscope(base, timeout=60)
    assert out.returncode == 1, out
    assert "no fabric cause found" not in out.stdout
    checks = len(CHECKS) + 1 + len(UPLINK_CHECKS)  # the table, NCCL settings, uplinks
    assert f"could not judge: only 0 of {checks} checks compared data" in out.stdout
    assert "[no data]" in out.stdout and "Traceback" not in out.stderr
    assert f"fabricscope explain: could not judge: only 0 of {checks} checks" in out.stderr
    js = fabricscope([*base, "--format", "json"], timeout=60)
    assert js.returncode == 1
    doc = json.loads(js.stdout)
    assert (doc["verdict"], doc["exit_code"]) == ("could not judge", 1)
    assert doc["judged"] == {"checks": 0, "of_checks": checks, "nodes": 0, "of_nodes": 1}
    helped = fabricscope(["explain", "--help"], timeout=60)
    assert helped.returncode == 0
    flat = " ".join(helped.stdout.split())
    assert "Exit codes: 0 judged (causes found, or no fabric cause found); 1 could not" in flat
    assert "2 could not run" in flat


def test_real_prometheus_with_tls_and_basic_auth(tmp_path: Path) -> None:
    pki = write_test_pki(tmp_path / "pki")
    hashed = bcrypt.hashpw(b"pa55word", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {
                    "cert_file": str(pki.server_cert),
                    "key_file": str(pki.server_key),
                },
                "basic_auth_users": {"alice": hashed},
            }
        )
    )
    (tmp_path / "prometheus.yml").write_text("global: {}\n")
    port = free_port()
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--web.config.file={web}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"https://127.0.0.1:{port}"
    password = tmp_path / "password"
    password.write_text("pa55word\n")
    good = ClientSettings(
        url, ca_file=str(pki.ca_cert), username="alice", password_file=str(password)
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                PrometheusClient(good).query("vector(1)", time.time())
                break
            except PrometheusError as exc:
                if "refused" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert "TLS certificate not trusted" in _error(
            url, username="alice", password_file=str(password)
        )
        insecure = PrometheusClient(
            ClientSettings(url, insecure=True, username="alice", password_file=str(password))
        )
        assert insecure.query("vector(2)", time.time())[0].value == 2.0
        err = _error(url, ca_file=str(pki.ca_cert), username="alice")
        assert "HTTP 401 Unauthorized" in err and "--prometheus.password-file" in err
        out = _cli(
            url,
            "--prometheus.ca-file",
            str(pki.ca_cert),
            "--prometheus.username",
            "alice",
            "--prometheus.password-file",
            str(password),
        )
        # reached and authenticated: the job simply is not there
        assert "no throughput series for job_name='llm'" in _one_line_exit_2(out)
    finally:
        proc.terminate()
        proc.wait(10)


# --- hostile answers (issue 19) -----------------------------------------------------------


class _Hostile(http.server.BaseHTTPRequestHandler):
    """A server that answers the way no healthy Prometheus does; ``behaviour`` picks how."""

    behaviour = ""
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        b = self.behaviour
        try:
            if b == "trickle_body":  # headers at once, then a byte every 0.2 s
                body = json.dumps(_VECTOR).encode()
                self._head(len(body))
                for i in range(len(body)):
                    self.wfile.write(body[i : i + 1])
                    self.wfile.flush()
                    time.sleep(0.2)
            elif b == "trickle_headers":  # the status line itself, a byte every 0.2 s
                for ch in b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n":
                    self.wfile.write(bytes([ch]))
                    self.wfile.flush()
                    time.sleep(0.2)
            elif b == "huge_declared":  # says 200 MB up front
                self._head(200 << 20)
                self.wfile.write(b"[" * 1024)
            elif b == "huge_streamed":  # no length: 8 MiB until the connection closes
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Connection", "close")
                self.end_headers()
                for _ in range(128):
                    self.wfile.write(b" " * 65536)
            elif b == "deep":
                self._body(
                    b'{"status": "success", "data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
                )
            elif b == "nan_literal":
                self._body(
                    b'{"status": "success", "data": {"resultType": "scalar", "result": NaN}}'
                )
            elif b == "nan_series":
                self._nan_series()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up, as it should

    def _nan_series(self) -> None:
        if self.path.endswith("/series"):
            data: object = [
                {
                    "__name__": "fabricscope_throughput_tokens_per_second",
                    "namespace": "training",
                    "job_name": "llm",
                    "pod": "llm-0",
                    "instance": "node0:10118",
                }
            ]
        else:
            now = time.time()
            values = [[now - 60 * i, v] for i, v in enumerate(["NaN", "+Inf", "-Inf"] * 20)]
            data = {"resultType": "matrix", "result": [{"metric": {}, "values": values}]}
        self._body(json.dumps({"status": "success", "data": data}).encode())

    def _head(self, length: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(length))
        self.end_headers()

    def _body(self, body: bytes) -> None:
        self._head(len(body))
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


_VECTOR = {"status": "success", "data": {"resultType": "vector", "result": []}}


def _hostile(behaviour: str) -> Iterator[str]:
    handler = type("H", (_Hostile,), {"behaviour": behaviour})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("behaviour", ["trickle_body", "trickle_headers"])
def test_one_deadline_covers_connect_headers_and_body(behaviour: str) -> None:
    """A byte every 0.2 s never times out a per-read timeout; the answer's deadline does
    (the issue: --prometheus.timeout 5s held for 65 s)."""
    for url in _hostile(behaviour):
        started = time.monotonic()
        msg = _error(url, timeout=1.0)
        assert "did not answer /api/v1/query within 1s" in msg
        assert time.monotonic() - started < 1.5
        started = time.monotonic()
        err = _one_line_exit_2(_cli(url, "--prometheus.timeout", "1s"))
        assert "within 1s" in err
        assert time.monotonic() - started < 10  # interpreter start included


@pytest.mark.parametrize("behaviour", ["huge_declared", "huge_streamed"])
def test_an_answer_bigger_than_the_cap_is_refused(behaviour: str) -> None:
    for url in _hostile(behaviour):
        assert "with more than 1 MiB (--prometheus.max-body-bytes" in _error(
            url, max_body_bytes=1 << 20
        )
        err = _one_line_exit_2(_cli(url, "--prometheus.max-body-bytes", str(1 << 20)))
        assert "more than 1 MiB" in err


def test_absurdly_nested_json_is_one_line_not_a_traceback() -> None:
    for url in _hostile("deep"):
        assert "JSON nested absurdly deep" in _error(url)
        assert "nested absurdly deep" in _one_line_exit_2(_cli(url))


def test_bare_nan_is_not_json() -> None:
    for url in _hostile("nan_literal"):
        assert "with a bare NaN, which is not JSON" in _error(url)


def test_a_throughput_of_only_nan_and_inf_is_an_error_not_a_verdict() -> None:
    """The issue: NaN/+Inf values gave a confident "no fabric cause found", exit 0."""
    for url in _hostile("nan_series"):
        err = _one_line_exit_2(_cli(url))
        assert "only NaN or infinite values for the job's throughput" in err


def test_gzip_is_asked_for_and_decoded_and_counted() -> None:
    for url, handler in _server("gzip"):
        ledger = RunLedger(60.0)
        samples = PrometheusClient(ClientSettings(url), hook=ledger).query("up", time.time())
        assert [(dict(x.labels), x.value) for x in samples] == [({"instance": "node-01"}, 2.5)]
        assert handler.seen[0]["Accept-Encoding"] == "gzip"
        assert ledger.requests == 1 and 0 < ledger.wire_bytes < ledger.body_bytes


@pytest.mark.parametrize(
    ("behaviour", "expected"),
    [
        ("gzip_bomb", "a gzip body that decompresses to more than 64 MiB"),
        ("gzip_corrupt", "a gzip body that does not decompress"),
        ("gzip_truncated", "a gzip body that is cut short"),
    ],
)
def test_hostile_gzip_answers_cost_one_line(behaviour: str, expected: str) -> None:
    assert len(_bomb()) < 1 << 20  # built before the server answers with it
    for url, _ in _server(behaviour):
        assert expected in _error(url)


def test_the_run_deadline_bounds_every_request_and_then_refuses() -> None:
    now = [100.0]
    out = io.StringIO()
    ledger = RunLedger(30.0, stream=out, every=5.0, clock=lambda: now[0])
    assert ledger.timeout(10.0) == 10.0
    now[0] += 25.0
    assert ledger.timeout(10.0) == 5.0  # the time left, not the per-request timeout
    ledger.done(1_000, 9_000)
    assert out.getvalue() == (
        "fabricscope explain: 1 queries, 0.0 MB received (0.0 MB uncompressed), 25s of 30s\n"
    )
    ledger.done(1_000, 9_000)  # within 5 s of the last line: quiet
    assert out.getvalue().count("\n") == 1
    now[0] += 5.0
    with pytest.raises(PrometheusError) as info:
        ledger.timeout(10.0)
    assert str(info.value) == (
        "the run's deadline of 30s passed after 2 queries (a large job or a slow Prometheus? "
        "--deadline raises it)"
    )


def test_the_deadline_cuts_a_slow_run_short_cli() -> None:
    for url, _ in _server("slow"):
        started = time.monotonic()
        err = _one_line_exit_2(_cli(url, "--prometheus.timeout", "30s", "--deadline", "1s"))
        assert "--deadline raises the limit" in err, err
        assert time.monotonic() - started < 15


def test_groups_cut_a_job_into_bounded_queries() -> None:
    names = [f"node-{i:04d}" for i in range(1024)]
    cut = groups(names, 64)
    assert len(cut) == 16 and all(len(g) == 64 for g in cut)
    assert [n for g in cut for n in g] == sorted(names)
    assert groups(["b", "a", "c"], 64) == [("a", "b", "c")]
    with pytest.raises(ValueError, match="at least 1"):
        groups(names, 0)
    assert groups(names) == [tuple(sorted(names))]  # up to 1,024 nodes: one query a check


def test_a_run_answers_with_the_cycle_collector_paused_and_leaves_it_as_it_was() -> None:
    """The collector walked every parsed answer of a 1,024-node job again and again (63 % of
    the CPU on that job's answers): paused while a run answers, as it was afterwards, also
    when the run fails."""
    import gc

    from exporter.explain.plan import without_cycle_collector

    seen: list[bool] = []

    @without_cycle_collector
    def run(fail: bool) -> int:
        seen.append(gc.isenabled())
        if fail:
            raise PrometheusError("down")
        return 7

    was = gc.isenabled()
    try:
        gc.enable()
        assert run(False) == 7 and gc.isenabled()
        with pytest.raises(PrometheusError):
            run(True)
        assert gc.isenabled()
        gc.disable()
        run(False)
        assert not gc.isenabled()  # left as it was
    finally:
        if was:
            gc.enable()
    assert seen == [False, False, False]
