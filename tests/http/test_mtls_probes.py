"""The chart's health probes against an agent whose web config requires client certificates.

The certificates are made by the openssl command line, the web config is the one an
administrator puts in the chart's Secret (``client_auth_type: RequireAndVerifyClientCert``),
and the agent runs with the web flags ``helm template`` renders, verbatim. Then the test does
what the kubelet does for each rendered probe: an HTTP(S) GET of its path, on its host (the
pod's address by default) and port, with no client certificate and no server certificate
check. Every probe must pass, while the metrics port still refuses a client without a
certificate. (Before, the chart probed ``/healthz`` over HTTPS on the metrics port: the
handshake failed for want of a client certificate and the agent never became ready.)

Everything runs in a private network namespace whose ``lo`` also carries a stand-in for the
node's (and, with ``hostNetwork``, the pod's) address, so that the agent can listen where the
chart tells it to, on every address, ports included.
"""

from __future__ import annotations

import http.client
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.config import DEFAULT_OFF, SAMPLER_NAMES
from tests.helmchart import TLS, render
from tests.loopnet import inside, private_net

#: the node's address (with hostNetwork, also the pod's): where the kubelet probes by default
NODE_IP = "10.31.0.1"
WEB_DIR = "/etc/fabricscope/web"
WAIT = 60.0

Doc = dict[str, Any]


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture
def web_dir(tmp_path: Path) -> Path:
    """A CA, a server certificate for 127.0.0.1 and the node address, a client certificate,
    all EC P-256 from the openssl command line, and a web config requiring client
    certificates, with paths relative to it as in the chart's Secret."""
    d = tmp_path / "web"
    d.mkdir()
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
            "-subj", "/CN=fabricscope test CA", cwd=d)  # fmt: skip
    for name, usage in (("server", "serverAuth"), ("client", "clientAuth")):
        ext = d / f"{name}.ext"
        ext.write_text(
            f"extendedKeyUsage={usage}\n"
            + (f"subjectAltName=IP:127.0.0.1,IP:{NODE_IP}\n" if name == "server" else "")
        )
        openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={name}", cwd=d)  # fmt: skip
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.crt", "-days", "1", "-extfile", str(ext),
                cwd=d)  # fmt: skip
    (d / "web.yml").write_text(
        "tls_server_config:\n"
        "  cert_file: server.crt\n"
        "  key_file: server.key\n"
        "  client_ca_file: ca.crt\n"
        "  client_auth_type: RequireAndVerifyClientCert\n"
    )
    return d


def daemonset_container(host_network: bool, tmp_path: Path) -> Doc:
    docs = render({**TLS, "hostNetwork": host_network}, tmp_path)
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def agent_argv(container: Doc, web_dir: Path) -> list[str]:
    """The rendered ``--web.*`` flags as they are, the web config read from ``web_dir``
    instead of the Secret's mount; no samplers (ready at once: readiness is not the point)."""
    web = [a for a in container["args"] if a.startswith("--web.")]
    web = [a.replace(WEB_DIR, str(web_dir)) for a in web]
    off = [f"--no-sampler.{n}" for n in SAMPLER_NAMES if n not in DEFAULT_OFF]
    return [sys.executable, "-m", "exporter.cli", "agent", *web, *off, "--log.level=error"]


@pytest.fixture
def netns() -> Iterator[str]:
    with private_net([NODE_IP]) as name, inside(name):
        yield name


def kubelet_get(container: Doc, probe: str) -> int:
    """What the kubelet does for ``probe``: GET its path on its host (default: the pod's
    address) and port (a named one looked up in the container's ports) over its scheme, with
    no client certificate and without checking the server's."""
    get = container[probe]["httpGet"]
    port = get["port"]
    if isinstance(port, str):
        port = next(p["containerPort"] for p in container["ports"] if p["name"] == port)
    host = get.get("host", NODE_IP)
    if get.get("scheme", "HTTP") == "HTTPS":
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            host, port, timeout=5, context=context
        )
    else:
        conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        conn.request("GET", get["path"])
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


def until_probe_passes(container: Doc, probe: str, agent: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + WAIT
    last: object = None
    while True:
        assert agent.poll() is None, "the agent exited"
        try:
            last = kubelet_get(container, probe)
            if last == 200:
                return
        except (OSError, ssl.SSLError) as exc:  # not listening yet, or a refused handshake
            last = exc
        assert time.monotonic() < deadline, f"{probe} never passed: {last!r}"
        time.sleep(0.2)


def metrics_status(port: int, web_dir: Path, *, client_cert: bool) -> int:
    context = ssl.create_default_context(cafile=str(web_dir / "ca.crt"))
    if client_cert:
        context.load_cert_chain(web_dir / "client.crt", web_dir / "client.key")
    conn = http.client.HTTPSConnection(NODE_IP, port, timeout=5, context=context)
    try:
        conn.request("GET", "/metrics")
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


@pytest.mark.parametrize("host_network", [True, False], ids=["hostNetwork", "pod-network"])
def test_the_charts_probes_pass_while_the_metrics_port_requires_client_certificates(
    host_network: bool, web_dir: Path, tmp_path: Path, netns: str
) -> None:
    container = daemonset_container(host_network, tmp_path)
    metrics_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "metrics")
    agent = subprocess.Popen(
        agent_argv(container, web_dir), env=dict(os.environ, PYTHONUNBUFFERED="1")
    )
    try:
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            until_probe_passes(container, probe, agent)
        # the metrics port still requires a client certificate...
        with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
            metrics_status(metrics_port, web_dir, client_cert=False)
        assert metrics_status(metrics_port, web_dir, client_cert=True) == 200
        # ...and the probes' port serves nothing but /healthz
        get = container["livenessProbe"]["httpGet"]
        health = http.client.HTTPConnection(get.get("host", NODE_IP), get["port"], timeout=5)
        try:
            health.request("GET", "/metrics")
            assert health.getresponse().status == 404
        finally:
            health.close()
        if host_network:  # on the node's loopback only, not on its network address
            with pytest.raises(ConnectionRefusedError):
                http.client.HTTPConnection(NODE_IP, get["port"], timeout=5).connect()
    finally:
        agent.terminate()
        agent.wait(30)
