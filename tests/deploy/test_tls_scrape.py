"""TLS end to end, as docs/install.md tells a user to do it: ``scripts/tls-certs.sh`` makes the CA,
the serving certificate and the two Secrets; the chart, given the documented values, renders the
agent's flags and the ServiceMonitor's ``tlsConfig``; a real agent serves HTTPS with the web
config from the Secret, and a real Prometheus scrapes it with the scrape config the Prometheus
Operator generates from that ServiceMonitor (:mod:`tests.operatorcfg`: the CA file where the
Operator puts a Secret key, ``server_name`` from ``serverName``), at the node's IP address.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.helmchart import NAMESPACE, ROOT, render
from tests.operatorcfg import endpoints_target, service_monitor_config
from tests.promharness import free_port, start_prometheus

Doc = dict[str, Any]
SCRIPT = ROOT / "scripts" / "tls-certs.sh"
INSTALL = ROOT / "docs" / "install.md"
DGX = ROOT / "tests" / "fixtures" / "dgx-h100" / "sys"
NODE_IP = "127.0.0.2"  # the node's address: the agent is on the host network


def one(docs: list[Doc], kind: str) -> Doc:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def documented_values() -> dict[str, str]:
    """The ``--set`` values of docs/install.md's TLS section (its first helm command there)."""
    text = INSTALL.read_text()
    section = text[text.index("#### TLS end to end") :]
    command = re.search(r"helm upgrade fabricscope .*?\n```", section, re.S)
    assert command, "docs/install.md's TLS section has no helm upgrade command"
    return dict(re.findall(r"--set ([\w.]+)=(\S+)", command.group(0)))


def as_values(flat: dict[str, str]) -> Doc:
    out: Doc = {}
    for key, raw in flat.items():
        value: Any = {"true": True, "false": False}.get(raw, raw)
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def mount(secret: Doc, directory: Path) -> dict[str, Path]:
    """What the kubelet makes of a Secret volume: one file per key, read-only."""
    directory.mkdir(parents=True)
    out = {}
    for key, data in secret["data"].items():
        path = directory / key
        path.write_bytes(base64.b64decode(data))
        path.chmod(0o400)
        out[key] = path
    return out


def test_a_prometheus_scrapes_the_agent_over_https_as_documented(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    made = subprocess.run(
        ["bash", str(SCRIPT), "-n", NAMESPACE, "--ip", NODE_IP, str(pki)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    secrets = {
        d["metadata"]["name"]: d for d in yaml.safe_load_all((pki / "secrets.yaml").read_text())
    }
    assert all(s["metadata"]["namespace"] == NAMESPACE for s in secrets.values())
    assert not (set(secrets["fabricscope-ca"]["data"]) & {"ca.key", "tls.key"})  # no key leaks

    # the documented values name exactly the Secrets the script made
    flat = documented_values()
    assert flat["web.existingSecret"] in secrets
    assert flat["serviceMonitor.tlsConfig.ca.secret.name"] in secrets
    docs = render(as_values(flat), tmp_path)
    monitor = one(docs, "ServiceMonitor")
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "https"

    # the agent as the DaemonSet runs it, the Secret where the chart mounts it
    web = mount(secrets[flat["web.existingSecret"]], tmp_path / "etc-fabricscope-web")
    args = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["args"]
    (config_flag,) = [a for a in args if a.startswith("--web.config.file=")]
    assert config_flag == "--web.config.file=/etc/fabricscope/web/web.yml"
    port, health = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["NODE_NAME"] = ""
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "exporter.cli",
            "agent",
            f"--path.sysfs={DGX}",
            f"--web.listen-address={NODE_IP}:{port}",
            f"--web.config.file={web['web.yml']}",
            f"--web.health-listen-address=127.0.0.1:{health}",
            "--no-sampler.nvml",
            "--no-sampler.netdev",
            "--log.level=warning",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        # the Operator's copy of the CA key, under the name it gives Secret keys
        ca = mount(secrets["fabricscope-ca"], tmp_path / "etc-prometheus-certs")["ca.crt"]
        operator_path = ca.with_name(f"secret_{NAMESPACE}_fabricscope-ca_ca.crt")
        ca.rename(operator_path)
        targets = tmp_path / "targets.json"
        pod = "fabricscope-7xk2p"
        service = one(docs, "Service")
        targets.write_text(
            json.dumps(
                [
                    endpoints_target(
                        f"{NODE_IP}:{port}",
                        namespace=NAMESPACE,
                        service=service,
                        pod=pod,
                        node="gpu-node-01",
                    )
                ]
            )
        )
        secret_files = {("fabricscope-ca", "ca.crt"): operator_path}
        config = service_monitor_config(monitor, targets, secret_files)
        assert config["tls_config"] == {
            "ca_file": str(operator_path),
            "server_name": flat["serviceMonitor.tlsConfig.serverName"],
            "insecure_skip_verify": False,
        }
        config["scrape_interval"] = config["scrape_timeout"] = "1s"
        # the same endpoint checked against a name the certificate does not hold: refused
        wrong = json.loads(json.dumps(config))
        wrong["job_name"] = "wrong-server-name"
        wrong["tls_config"]["server_name"] = "not-fabricscope"
        with start_prometheus(tmp_path / "prometheus", [config, wrong]) as prom:
            (up,) = prom.wait_for_targets(job=config["job_name"], timeout=60)
            assert up.scrape_url == f"https://{NODE_IP}:{port}/metrics"
            prom.wait_for_query('fabricscope_infiniband_port_up{job="fabricscope"}', timeout=30)
            (refused,) = prom.wait_for_targets(job="wrong-server-name", health="down")
            assert "certificate" in refused.last_error, refused.last_error
        assert agent.poll() is None, "the agent died"
    finally:
        agent.terminate()
        try:
            agent.wait(15)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait(5)


def test_the_script_refuses_bad_input(tmp_path: Path) -> None:
    for args, message in (
        (["--ip", "10.0.0.1;rm", str(tmp_path / "a")], "not an IP address"),
        (["--days", "soon", str(tmp_path / "b")], "--days must be a whole number"),
        (["--extra-web-config", str(tmp_path / "none"), str(tmp_path / "c")], "no such file"),
        (["--bogus", str(tmp_path / "d")], "unknown option --bogus"),
    ):
        made = subprocess.run(
            ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=30, check=False
        )
        assert made.returncode == 2 and message in made.stderr, (args, made.stderr)


def test_a_second_run_keeps_the_ca(tmp_path: Path) -> None:
    """Renewing the serving certificate or adding nodes must not change what Prometheus
    trusts: the CA in the directory is reused."""
    for ip in ("10.0.0.11", "10.0.0.12"):
        made = subprocess.run(
            ["bash", str(SCRIPT), "--ip", ip, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert made.returncode == 0, made.stderr
        if ip == "10.0.0.11":
            first_ca = (tmp_path / "ca.crt").read_bytes()
    assert (tmp_path / "ca.crt").read_bytes() == first_ca
    text = subprocess.run(
        ["openssl", "x509", "-in", str(tmp_path / "tls.crt"), "-noout", "-ext", "subjectAltName"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "IP Address:10.0.0.12" in text and "DNS:fabricscope" in text
    assert (tmp_path / "ca.key").stat().st_mode & 0o077 == 0
