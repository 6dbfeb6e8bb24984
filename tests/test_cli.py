"""The `fabricscope` command as a user meets it: clear errors, exit codes, no tracebacks."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from agentrun import fabricscope


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


def test_topo_without_pci_says_so(tmp_path: Path) -> None:
    proc = fabricscope(["topo", f"--path.sysfs={tmp_path}"])
    assert proc.returncode == 1
    assert "no PCI devices found" in proc.stderr


def test_bad_flags_are_clear_errors() -> None:
    proc = fabricscope(["agent", "--once", "--netdev.include=("])
    assert proc.returncode == 2 and "invalid regular expression" in proc.stderr
    proc = fabricscope(["agent", "--once", "--sampling.interval=5", "--sampling.timeout=10"])
    assert (
        proc.returncode == 2 and "timeout must be positive and at most the interval" in proc.stderr
    )
    assert "Traceback" not in proc.stderr


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
