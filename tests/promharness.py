"""A real Prometheus (and promtool) for tests.

    with start_prometheus(tmp_path, [{"job_name": "x", "static_configs": [...]}]) as prom:
        prom.wait_for_targets(job="x")                 # health == "up", by polling the API
        assert prom.query("up{job='x'}")[0].value == 1

Prometheus runs from ``/usr/bin/prometheus`` (Debian's 2.42) in a temp dir, listening on a
free 127.0.0.1 port, with a 1 s global scrape and evaluation interval. The first scrape of
a new target lands ~5 s after start (the discovery manager batches updates every 5 s): wait
with ``wait_for_targets`` / ``wait_for_query``, never sleep. Every wait is bounded and, on
timeout, fails with what Prometheus last reported and the tail of its log.

Also: ``promtool_check_metrics`` / ``promtool_check_web_config`` / ``promtool_check_config``
(raise ``PromtoolError`` with promtool's output), ``write_test_pki`` (a CA, a server
certificate for 127.0.0.1/localhost and client certificates, for TLS scrape tests), and
``wait_until`` (a bounded poll).
"""

from __future__ import annotations

import datetime
import functools
import ipaddress
import json
import os
import random
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

#: Bound on starting Prometheus (ready endpoint answering), seconds.
STARTUP_TIMEOUT = 30.0
#: Default bound on waiting for targets or query results, seconds: the first scrape comes
#: ~5 s after start, so this leaves room on a loaded 2-core CI box.
WAIT_TIMEOUT = 30.0
_POLL_INTERVAL = 0.1

T = TypeVar("T")

# Talk to 127.0.0.1 directly even when the environment sets http_proxy.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class PromtoolError(AssertionError):
    """promtool rejected its input; the message holds promtool's output."""


class PrometheusError(AssertionError):
    """Prometheus failed to start, or a wait ran out; the message says what it saw."""


@dataclass(frozen=True, slots=True)
class Target:
    """One entry of ``/api/v1/targets`` ``activeTargets``."""

    job: str
    scrape_url: str
    health: str  # "up", "down" or "unknown" (not scraped yet)
    last_error: str
    labels: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Sample:
    """One element of an instant query's vector (or a scalar, with no labels)."""

    labels: Mapping[str, str]
    value: float


def wait_until(
    probe: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    interval: float = _POLL_INTERVAL,
) -> T:
    """Call ``probe`` until it returns something other than ``None`` (returned), at most
    ``timeout`` seconds; then raise ``TimeoutError`` naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result is not None:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago (for programs that cannot report
    the port they bound; ``start_prometheus`` retries if another process takes it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def listen_port(taken: set[int]) -> int:
    """A port free on 127.0.0.1 now, below the kernel's ephemeral range and not in ``taken``
    (added to it): for many programs started on ports chosen up front, whose own outgoing
    connections (a Prometheus scraping them) would otherwise take one of those ports from
    the ephemeral range before its program binds it."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for port in random.sample(range(10000, max(low, 10001)), k=min(2000, max(low - 10000, 1))):
        if port in taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        taken.add(port)
        return port
    return free_port()


class Prometheus:
    """A running Prometheus process; stop it with ``stop()`` or use it as a context
    manager."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, workdir: Path) -> None:
        self.process = process
        self.port = port
        self.workdir = workdir
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = workdir / "prometheus.log"

    def __enter__(self) -> Prometheus:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds."""
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as e:
            return f"(no log: {e})"
        return "\n".join(text.splitlines()[-lines:])

    def api(self, path: str, params: Mapping[str, str] | None = None) -> object:
        """GET ``/api/v1/<path>`` and return its ``data`` (raises if status != success)."""
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with _OPENER.open(url, timeout=10) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as e:
            raise PrometheusError(f"GET {url}: HTTP {e.code}: {e.read()[:500]!r}") from e
        if not isinstance(body, dict) or body.get("status") != "success":
            raise PrometheusError(f"GET {url}: {body!r}")
        data: object = body.get("data")
        return data

    def targets(self) -> list[Target]:
        data = self.api("targets", {"state": "active"})
        assert isinstance(data, dict)
        out = []
        for t in data.get("activeTargets", []):
            labels = {str(k): str(v) for k, v in t.get("labels", {}).items()}
            out.append(
                Target(
                    job=str(t.get("scrapePool", labels.get("job", ""))),
                    scrape_url=str(t.get("scrapeUrl", "")),
                    health=str(t.get("health", "")),
                    last_error=str(t.get("lastError", "")),
                    labels=labels,
                )
            )
        return out

    def wait_for_targets(
        self,
        *,
        job: str | None = None,
        health: str = "up",
        timeout: float = WAIT_TIMEOUT,
    ) -> list[Target]:
        """Wait until at least one target (of ``job``, if given) exists and every one of
        them has ``health``; return them."""

        def probe() -> list[Target] | None:
            self._check_running()
            targets = [t for t in self.targets() if job is None or t.job == job]
            return targets if targets and all(t.health == health for t in targets) else None

        try:
            return wait_until(probe, timeout=timeout, what=f"targets of {job or 'any job'}")
        except TimeoutError as e:
            raise PrometheusError(
                f"{e}: want health {health!r}, have {self.targets()!r}\n"
                f"prometheus log:\n{self.log_tail()}"
            ) from None

    def query(self, expr: str) -> list[Sample]:
        """Instant query; a vector becomes its samples, a scalar one unlabelled sample."""
        data = self.api("query", {"query": expr})
        assert isinstance(data, dict)
        result = data.get("result")
        if data.get("resultType") == "scalar":
            assert isinstance(result, list)
            return [Sample(labels={}, value=float(result[1]))]
        if data.get("resultType") != "vector":
            raise PrometheusError(f"query {expr!r}: unsupported result type {data!r}")
        assert isinstance(result, list)
        return [
            Sample(
                labels={str(k): str(v) for k, v in r["metric"].items()},
                value=float(r["value"][1]),
            )
            for r in result
        ]

    def wait_for_query(
        self,
        expr: str,
        *,
        accept: Callable[[list[Sample]], bool] = bool,
        timeout: float = WAIT_TIMEOUT,
    ) -> list[Sample]:
        """Repeat the query until ``accept(result)`` (default: non-empty); return it."""
        last: list[Sample] = []

        def probe() -> list[Sample] | None:
            nonlocal last
            self._check_running()
            last = self.query(expr)
            return last if accept(last) else None

        try:
            return wait_until(probe, timeout=timeout, what=f"query {expr!r}")
        except TimeoutError as e:
            raise PrometheusError(
                f"{e}: last result {last!r}; targets {self.targets()!r}\n"
                f"prometheus log:\n{self.log_tail()}"
            ) from None

    def _check_running(self) -> None:
        if self.process.poll() is not None:
            raise PrometheusError(
                f"prometheus exited with {self.process.returncode}:\n{self.log_tail()}"
            )


def start_prometheus(
    workdir: Path,
    scrape_configs: Sequence[Mapping[str, object]],
    *,
    scrape_interval: str = "1s",
    rule_files: Sequence[Path] = (),
    alertmanager_url: str | None = None,
    extra_args: Sequence[str] = (),
    tsdb_path: Path | None = None,
) -> Prometheus:
    """Write ``prometheus.yml`` into ``workdir`` (a fresh temp dir), check it with promtool,
    start Prometheus on a free 127.0.0.1 port and wait until it is ready.

    ``scrape_configs`` are Prometheus ``scrape_configs`` entries as dicts. The global
    ``scrape_interval``, ``scrape_timeout`` and ``evaluation_interval`` are all
    ``scrape_interval``. ``alertmanager_url`` (``http://127.0.0.1:9093``) adds an
    ``alerting`` section."""
    workdir.mkdir(parents=True, exist_ok=True)
    config: dict[str, object] = {
        "global": {
            "scrape_interval": scrape_interval,
            "scrape_timeout": scrape_interval,
            "evaluation_interval": scrape_interval,
        },
        "scrape_configs": [dict(c) for c in scrape_configs],
    }
    if rule_files:
        config["rule_files"] = [str(p) for p in rule_files]
    if alertmanager_url:
        parsed = urllib.parse.urlsplit(alertmanager_url)
        config["alerting"] = {
            "alertmanagers": [
                {"scheme": parsed.scheme, "static_configs": [{"targets": [parsed.netloc]}]}
            ]
        }
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    promtool_check_config(config_path)

    def argv(port: int, attempt: int) -> list[str]:
        data = tsdb_path if tsdb_path is not None else workdir / f"data-{attempt}"
        return [
            PROMETHEUS,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            *extra_args,
        ]

    return _launch(Prometheus, argv, workdir, "prometheus")


def openmetrics_blocks(lines: Iterable[str], om: Path, tsdb: Path, *, timeout: float) -> Path:
    """Write ``lines`` (OpenMetrics samples) to ``om`` with the final ``# EOF`` and turn them
    into TSDB blocks under ``tsdb`` (``promtool tsdb create-blocks-from openmetrics``);
    returns ``tsdb``. RuntimeError with promtool's last words when it fails."""
    om.write_text("".join(lines) + "# EOF\n")
    done = subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(om), str(tsdb)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"promtool create-blocks-from failed: {done.stderr[-2000:]}")
    return tsdb


def backfill_recording_rules(
    tsdb: Path, rule_files: Sequence[Path], start: float, end: float, *, interval: float = 60.0
) -> None:
    """Evaluate the recording rules of ``rule_files`` every ``interval`` seconds over
    ``[start, end]`` with ``promtool tsdb create-blocks-from rules`` against a real Prometheus
    serving ``tsdb``, and add the blocks it writes to ``tsdb`` (Prometheus 2.39+ reads
    overlapping blocks). Alerting rules are ignored; a rule reading another rule's records
    sees them only from a second call."""
    work = tsdb.parent / "rules-backfill"
    shutil.rmtree(work, ignore_errors=True)
    out = work / "blocks"
    with start_prometheus(work / "prometheus", [], tsdb_path=tsdb) as prom:
        _promtool(
            [
                "tsdb",
                "create-blocks-from",
                "rules",
                f"--url={prom.url}",
                f"--start={start:.0f}",
                f"--end={end + interval:.0f}",
                f"--output-dir={out}",
                f"--eval-interval={interval:g}s",
                "--quiet",
                *(str(p) for p in rule_files),
            ],
            timeout=1800,  # a 500-node history on a loaded 2-core machine
        )
    for block in sorted(out.iterdir()):
        if block.is_dir():
            shutil.move(str(block), tsdb / block.name)
    shutil.rmtree(work, ignore_errors=True)


D = TypeVar("D", bound="Prometheus")


def _launch(
    make: Callable[[subprocess.Popen[bytes], int, Path], D],
    argv: Callable[[int, int], list[str]],
    workdir: Path,
    name: str,
) -> D:
    """Start ``name`` (``argv(port, attempt)``) on a free 127.0.0.1 port, its output in
    ``workdir/<name>.log``, and wait for ``/-/ready``; a port another process took between
    ``free_port()`` and the bind is retried (3 attempts in all)."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    attempts = 3
    for attempt in range(attempts):
        port = free_port()
        with (workdir / f"{name}.log").open("wb") as log_file:
            process = subprocess.Popen(
                argv(port, attempt),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
            )
        daemon = make(process, port, workdir)
        try:
            wait_until(
                functools.partial(_ready, daemon),
                timeout=STARTUP_TIMEOUT,
                what=f"{name} /-/ready",
                interval=0.05,
            )
        except TimeoutError as e:
            daemon.stop()
            raise PrometheusError(f"{e}\n{name} log:\n{daemon.log_tail()}") from None
        except PrometheusError:
            if "address already in use" in daemon.log_tail() and attempt + 1 < attempts:
                continue  # another process took the port between free_port() and bind
            raise
        return daemon
    raise AssertionError("unreachable")


def _ready(prom: Prometheus) -> bool | None:
    prom._check_running()
    try:
        with _OPENER.open(f"{prom.url}/-/ready", timeout=2) as response:
            return True if response.status == 200 else None
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


# --- promtool -----------------------------------------------------------------------------


def _promtool(
    args: Sequence[str], stdin: bytes | None = None, *, silent: bool = False, timeout: float = 60
) -> None:
    """Run promtool; raise with its output if it fails, or (``silent``) if it says anything."""
    result = subprocess.run(
        [PROMTOOL, *args],
        input=stdin,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    output = (result.stdout + result.stderr).decode(errors="replace").strip()
    if result.returncode != 0 or (silent and output):
        raise PromtoolError(f"promtool {' '.join(args)} exited {result.returncode}:\n{output}")


def promtool_check_metrics(text: bytes | str) -> None:
    """``promtool check metrics`` (lints the classic text format; fails on OpenMetrics): it
    must exit 0 and say nothing, not even a warning."""
    stdin = text.encode() if isinstance(text, str) else text
    _promtool(["check", "metrics"], stdin=stdin, silent=True)


def promtool_check_web_config(path: Path) -> None:
    """``promtool check web-config``: the exporter-toolkit parser, on our web config files."""
    _promtool(["check", "web-config", str(path)])


def promtool_check_config(path: Path) -> None:
    """``promtool check config`` on a Prometheus configuration file."""
    _promtool(["check", "config", str(path)])


# --- TLS material for tests --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TestPKI:
    """PEM files written by ``write_test_pki``."""

    __test__ = False  # not a pytest test class

    ca_cert: Path
    server_cert: Path  # for 127.0.0.1, ::1 and localhost
    server_key: Path
    client_cert: Path  # signed by ca_cert
    client_key: Path
    stranger_cert: Path  # a client certificate from another, untrusted CA
    stranger_key: Path


def write_test_pki(directory: Path, *, server_name: str = "fabricscope-test") -> TestPKI:
    """A throwaway CA with a server and a client certificate (EC P-256, valid for a day),
    plus a client certificate from an unrelated CA. ``server_name`` is the server
    certificate's common name (distinct names tell two certificates apart)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _self_signed_ca("fabricscope test CA")
    other_ca_key, other_ca_cert = _self_signed_ca("untrusted test CA")

    def issue(
        name: str, key_name: str, issuer: tuple[ec.EllipticCurvePrivateKey, x509.Certificate]
    ) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        server = key_name == "server"
        builder = _base_builder(name, key).issuer_name(issuer[1].subject)
        builder = builder.add_extension(
            x509.BasicConstraints(ca=False, path_length=None), critical=True
        ).add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName("localhost"),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                        x509.IPAddress(ipaddress.ip_address("::1")),
                    ]
                ),
                critical=False,
            )
        cert = builder.sign(issuer[0], hashes.SHA256())
        return (
            _write(directory / f"{key_name}.crt", cert.public_bytes(serialization.Encoding.PEM)),
            _write(directory / f"{key_name}.key", _key_pem(key)),
        )

    ca_path = _write(directory / "ca.crt", ca_cert.public_bytes(serialization.Encoding.PEM))
    server_cert, server_key = issue(server_name, "server", (ca_key, ca_cert))
    client_cert, client_key = issue("prometheus", "client", (ca_key, ca_cert))
    stranger_cert, stranger_key = issue("stranger", "stranger", (other_ca_key, other_ca_cert))
    return TestPKI(
        ca_cert=ca_path,
        server_cert=server_cert,
        server_key=server_key,
        client_cert=client_cert,
        client_key=client_key,
        stranger_cert=stranger_cert,
        stranger_key=stranger_key,
    )


def _base_builder(name: str, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def _self_signed_ca(name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _base_builder(name, key)
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# --- Alertmanager and a webhook receiver ----------------------------------------------------

ALERTMANAGER = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"


class WebhookReceiver:
    """An HTTP server on 127.0.0.1 that keeps every Alertmanager webhook notification it
    receives (the JSON body: ``status``, ``alerts`` with ``labels``/``annotations``...).

        with WebhookReceiver() as hook:   # hook.url for the Alertmanager receiver
            alert = hook.wait_for(lambda a: a["labels"]["alertname"] == "X", timeout=30)
    """

    def __init__(self) -> None:
        import http.server
        import threading

        self.notifications: list[dict[str, object]] = []
        self._lock = threading.Lock()
        received = self.notifications
        lock = self._lock

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                with lock:
                    received.append(body)
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                return None

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/alerts"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def alerts(self) -> list[dict[str, object]]:
        """Every alert of every notification so far, in arrival order (with the
        notification's ``status`` of each alert as Alertmanager sent it)."""
        with self._lock:
            notes = list(self.notifications)
        out: list[dict[str, object]] = []
        for n in notes:
            alerts = n.get("alerts")
            if isinstance(alerts, list):
                out.extend(a for a in alerts if isinstance(a, dict))
        return out

    def wait_for(
        self, match: Callable[[dict[str, object]], bool], *, timeout: float, what: str
    ) -> dict[str, object]:
        """The first alert received for which ``match`` is true, waiting up to ``timeout``."""

        def probe() -> dict[str, object] | None:
            return next((a for a in self.alerts() if match(a)), None)

        return wait_until(probe, timeout=timeout, what=what, interval=0.2)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> WebhookReceiver:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class Alertmanager(Prometheus):
    """A running Alertmanager (same process handling as :class:`Prometheus`)."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, workdir: Path) -> None:
        super().__init__(process, port, workdir)
        self.log_path = workdir / "alertmanager.log"

    def __enter__(self) -> Alertmanager:
        return self


def start_alertmanager(
    workdir: Path,
    webhook_url: str,
    *,
    group_wait: str = "1s",
    group_interval: str = "1s",
    config: Mapping[str, object] | None = None,
) -> Alertmanager:
    """Alertmanager 0.25 on a free 127.0.0.1 port routing every alert to ``webhook_url``
    (``send_resolved``), grouped by alert name and instance, with short group timers; or,
    with ``config``, that configuration as it is. No clustering
    (``--cluster.listen-address=`` empty: it would gossip on 0.0.0.0:9094)."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = (
        dict(config)
        if config is not None
        else {
            "route": {
                "receiver": "webhook",
                "group_by": ["alertname", "instance"],
                "group_wait": group_wait,
                "group_interval": group_interval,
                "repeat_interval": "1h",
            },
            "receivers": [
                {
                    "name": "webhook",
                    "webhook_configs": [{"url": webhook_url, "send_resolved": True}],
                }
            ],
        }
    )
    config_path = workdir / "alertmanager.yml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))

    def argv(port: int, attempt: int) -> list[str]:
        return [
            ALERTMANAGER,
            f"--config.file={config_path}",
            f"--storage.path={workdir / f'data-{attempt}'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ]

    return _launch(Alertmanager, argv, workdir, "alertmanager")
