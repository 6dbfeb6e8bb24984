"""The `fabricscope` command as a user meets it: clear errors, exit codes, no tracebacks."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.agentrun import fabricscope


def test_once_prints_a_valid_exposition_and_exits_zero(procfs_sys_root: Path) -> None:
    proc = fabricscope(
        ["agent", "--once", "--no-sampler.netdev", f"--path.sysfs={procfs_sys_root}"]
    )
    assert proc.returncode == 0, proc.stderr
    assert 'fabricscope_sampler_success{sampler="infiniband"} 1.0' in proc.stdout
    assert 'fabricscope_sampler_hardware_present{sampler="infiniband"} 1.0' in proc.stdout


def test_disabled_sampler_is_not_run(procfs_sys_root: Path) -> None:
    proc = fabricscope(
        [
            "agent",
            "--once",
            "--no-sampler.netdev",
            "--no-sampler.infiniband",
            f"--path.sysfs={procfs_sys_root}",
        ]
    )
    assert proc.returncode == 0, proc.stderr
    assert 'sampler="infiniband"' not in proc.stdout
    assert 'fabricscope_sampler_success{sampler="pci"}' in proc.stdout


def test_empty_sysfs_means_no_hardware_not_failure(tmp_path: Path) -> None:
    proc = fabricscope(["agent", "--once", "--no-sampler.netdev", f"--path.sysfs={tmp_path}"])
    assert proc.returncode == 0, proc.stderr
    assert 'fabricscope_sampler_success{sampler="infiniband"} 1.0' in proc.stdout
    assert 'fabricscope_sampler_hardware_present{sampler="infiniband"} 0.0' in proc.stdout
    assert 'fabricscope_sampler_hardware_present{sampler="pci"} 0.0' in proc.stdout


def test_topo_json_and_table(dgx_sys_root: Path) -> None:
    proc = fabricscope(["topo", "--format=json", f"--path.sysfs={dgx_sys_root}"])
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert isinstance(doc, dict) and doc
    table = fabricscope(["topo", f"--path.sysfs={dgx_sys_root}"])
    assert table.returncode == 0, table.stderr
    assert "PIX" in table.stdout and "SYS" in table.stdout


def test_topo_without_anything_says_so(tmp_path: Path) -> None:
    proc = fabricscope(["topo", f"--path.sysfs={tmp_path}"])
    assert proc.returncode == 1
    assert "nothing to show" in proc.stderr


def test_bad_flags_are_clear_errors() -> None:
    proc = fabricscope(["agent", "--once", "--netdev.include=("])
    assert proc.returncode == 2 and "invalid regular expression" in proc.stderr
    proc = fabricscope(["agent", "--sampling.interval=5", "--sampling.timeout=10"])
    assert proc.returncode == 2 and "--sampling.timeout 10s is longer than" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_explain_flags_are_one_line_errors() -> None:
    """explain's flags use the value types every subcommand shares: one line, exit 2."""
    base = ["explain", "--prometheus.url", "http://127.0.0.1:9", "--job", "j"]
    for flag, value, message in (
        ("--prometheus.max-body-bytes", "0", "must be at least 1 byte: '0'"),
        ("--prometheus.max-nodes-per-query", "x", "not an integer: 'x'"),
        ("--deadline", "-5m", "must not be negative: '-5m'"),
        ("--since", "yesterday", "not a time (now, unix seconds, RFC 3339"),
    ):
        proc = fabricscope([*base, f"{flag}={value}"])
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and f"argument {flag}:" in proc.stderr


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = fabricscope(
            ["agent", f"--path.sysfs={tmp_path}", f"--web.listen-address=127.0.0.1:{port}"],
            timeout=60,
        )
    assert proc.returncode == 2
    assert "address already in use" in proc.stderr and "Traceback" not in proc.stderr


def test_malformed_web_config_is_a_clear_error(tmp_path: Path) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_text("tls_server_config:\n  cert_file: /nonexistent.crt\n")
    proc = fabricscope(
        [
            "agent",
            f"--path.sysfs={tmp_path}",
            f"--web.config.file={cfg}",
            "--web.listen-address=127.0.0.1:0",
        ],
        timeout=60,
    )
    assert proc.returncode == 2 and str(cfg) in proc.stderr and "Traceback" not in proc.stderr


def test_connection_limit_flags_reach_the_server(tmp_path: Path) -> None:
    """A real agent with --web.header-timeout 0.5 closes a half-sent request within a second
    or two (the default, 5 s, would keep it open) and serves what it did as a series; an
    out-of-range limit is a one-line error."""
    proc = fabricscope(["agent", "--once", "--web.max-connections-per-address=0"])
    assert proc.returncode == 2 and "must be at least 1" in proc.stderr
    assert "Traceback" not in proc.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "exporter.cli", "agent", f"--path.sysfs={tmp_path}"]
    cmd += [f"--web.listen-address=127.0.0.1:{port}", "--web.header-timeout=0.5"]
    cmd += ["--web.max-connections-per-address=4", "--web.idle-timeout=30"]
    agent = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "agent did not come up"
                time.sleep(0.2)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as half:
            half.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # no blank line: half-sent
            began = time.monotonic()
            assert half.recv(1024) == b""  # closed by the server
            assert time.monotonic() - began < 3.0
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                body = r.read().decode()
            if 'fabricscope_http_connections_closed_total{reason="header_timeout"} 1.0' in body:
                break
            assert time.monotonic() < deadline, body[-2000:]
            time.sleep(0.3)
    finally:
        agent.terminate()
        agent.wait(timeout=30)
