"""Issue 22, "the first hour of a new user": every row of its table, run as the user ran it
(the real ``fabricscope`` command in a subprocess), checked for its exit status and its one
line of output. The README walked in order on a fresh virtualenv is tests/docs/test_readme_walk.py.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.agentrun import fabricscope
from tests.promharness import write_test_pki

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


def one_line_error(proc: subprocess.CompletedProcess[str], status: int = 2) -> str:
    """The command failed with ``status`` and said why in exactly one line, no traceback."""
    assert proc.returncode == status, (proc.returncode, proc.stderr[-3000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


# --- fabricscope snapshot -o: the output is checked before anything is sampled ---------------


@pytest.mark.parametrize(
    ("output", "said"),
    [
        ("{tmp}/nonexistent/dir/x.tar.gz", "does not exist"),
        ("{tmp}", "is a directory: name a file"),
        ("/sys/fabricscope-test.tar.gz", "cannot write /sys/fabricscope-test.tar.gz"),
    ],
    ids=["nonexistent-dir", "a-directory", "not-writable"],
)
def test_snapshot_output_is_checked_first(
    tmp_path: Path, dgx_sys_root: Path, output: str, said: str
) -> None:
    began = time.monotonic()
    proc = fabricscope(
        ["snapshot", "-o", output.format(tmp=tmp_path), f"--path.sysfs={dgx_sys_root}"]
    )
    line = one_line_error(proc)
    assert said in line and line.startswith("fabricscope snapshot: error: "), line
    assert "sampling" not in proc.stderr  # refused before the samplers ran
    assert time.monotonic() - began < 20


def test_snapshot_writes_the_file_whole_and_nothing_beside_it(
    tmp_path: Path, dgx_sys_root: Path
) -> None:
    out = tmp_path / "node.tar.gz"
    proc = fabricscope(
        ["snapshot", "-o", str(out), f"--path.sysfs={dgx_sys_root}", "--no-sampler.nvml"]
    )
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["node.tar.gz"]  # no partial file left
    replay = fabricscope(["topo", "--snapshot", str(out)])
    assert replay.returncode == 0 and "PIX" in replay.stdout, replay.stderr


# --- roots that do not exist ----------------------------------------------------------------


@pytest.mark.parametrize("once", [True, False], ids=["once", "serve"])
def test_a_nonexistent_sysfs_root_is_an_error(once: bool) -> None:
    args = ["agent", "--path.sysfs", "/nonexistent/sys"]
    if once:
        args.append("--once")
    else:
        args.append("--web.listen-address=127.0.0.1:0")
    line = one_line_error(fabricscope(args, timeout=60))
    assert line == (
        "fabricscope agent: error: --path.sysfs /nonexistent/sys does not exist "
        "(see fabricscope agent --help)"
    )


def test_a_file_as_procfs_root_is_an_error(tmp_path: Path) -> None:
    f = tmp_path / "proc"
    f.write_text("")
    line = one_line_error(fabricscope(["topo", f"--path.procfs={f}", f"--path.sysfs={tmp_path}"]))
    assert line == (
        f"fabricscope topo: error: --path.procfs {f} is not a directory "
        "(see fabricscope topo --help)"
    )


# --- the HTTP server: no asyncio warning per TLS request; the address it listens on ---------


@contextmanager
def running_agent(
    args: Sequence[str], tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A real serving agent; yields it and its "listening on" log line."""
    cmd = [sys.executable, "-m", "exporter.cli", "agent", f"--path.sysfs={tmp_path}", *args]
    proc = subprocess.Popen(
        cmd, stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1")
    )
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        line = ""
        while "listening on" not in line:
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "agent exited"
            assert time.monotonic() < deadline, "agent did not come up"
        yield proc, line
        # the caller may wait for readiness: /healthz answers 503 until the first pass
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def ready(url: str, context: ssl.SSLContext | None = None) -> None:
    """Poll ``url`` until it answers 200 (the agent's first pass done), 60 s at most."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5, context=context) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"{url} never answered 200"
        time.sleep(0.2)


def test_tls_requests_log_no_asyncio_warning(tmp_path: Path) -> None:
    """Four HTTPS requests (each closing its connection, as kubelet probes do) used to log four
    ``returning true from eof_received() has no effect when using ssl`` warnings."""
    pki = write_test_pki(tmp_path / "pki")
    cfg = tmp_path / "web.yml"
    cfg.write_text(
        f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [f"--web.listen-address=127.0.0.1:{port}", f"--web.config.file={cfg}"]
    with running_agent(args, tmp_path) as (proc, line):
        assert f"listening on 127.0.0.1:{port}" in line, line
        ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
        ready(f"https://127.0.0.1:{port}/healthz", ctx)
        # keep-alive connections closed by the client between requests, as Prometheus and
        # the kubelet's probes do (urllib asks the server to close: not the case at issue)
        for path in ("/healthz", "/metrics", "/healthz", "/metrics"):
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
            conn.request("GET", path)
            resp = conn.getresponse()
            assert resp.status == 200 and resp.read()
            conn.close()
        time.sleep(1.0)  # the server's side of the last close
        proc.terminate()
        _, rest = proc.communicate(timeout=30)
    assert "eof_received" not in rest and "WARNING" not in rest, rest


def test_the_log_names_the_address_listened_on(tmp_path: Path) -> None:
    """The default :10118 listens on every address, IPv4 and IPv6: the log says ``*:PORT``
    (it said ``http://127.0.0.1:10118``). Port 0 here: the port the kernel picked."""
    with running_agent(["--web.listen-address=:0"], tmp_path) as (_, line):
        m = re.search(r"listening on \*:(\d+) ", line)
        assert m, line
        port = int(m.group(1))
        ready(f"http://127.0.0.1:{port}/healthz")
        if socket.has_ipv6:
            with socket.create_connection(("::1", port), timeout=5):
                pass  # IPv6 too


# --- topo -------------------------------------------------------------------------------------


def test_topo_without_pci_shows_ports_and_findings(tmp_path: Path) -> None:
    """gpud's ConnectX-7 capture: an RDMA port with four saturated counters, no PCI tree."""
    root = FIXTURES / "gpud-pr943-cx7" / "sys"
    proc = fabricscope(["topo", f"--path.sysfs={root}"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(
        "GPU/NIC matrix, PCIe links and ACS: unavailable (no PCI devices under "
    )
    assert "  mlx5_1/1 (" in proc.stdout
    assert proc.stdout.count("info     counter_saturated mlx5_1/1/") == 4
    doc = json.loads(fabricscope(["topo", "--format=json", f"--path.sysfs={root}"]).stdout)
    assert doc["gpus"] is None and "no PCI devices" in doc["pci_unavailable"]
    assert [p["device"] for p in doc["rdma_ports"]] == ["mlx5_1"]
    assert len(doc["findings"]) == 4
    ports = fabricscope(["topo", f"--path.sysfs={FIXTURES / 'procfs' / 'sys'}"])
    assert ports.returncode == 0
    assert "hfi1_0/1" in ports.stdout and "mlx4_0/2" in ports.stdout


def test_topo_with_nothing_to_show_exits_1(tmp_path: Path) -> None:
    line = one_line_error(fabricscope(["topo", f"--path.sysfs={tmp_path}"]), status=1)
    assert line == f"fabricscope: nothing to show: no GPU, NIC or RDMA port under {tmp_path}"


def test_topo_on_a_host_with_pci_but_no_gpu_or_nic_exits_1(tmp_path: Path) -> None:
    """A bridge and nothing behind it: devices, but nothing the matrix is about."""
    dgx = FIXTURES / "dgx-h100" / "sys"
    bridge = next(p for p in (dgx / "bus/pci/devices").iterdir() if p.name.endswith(":01.0"))
    target = bridge.resolve()
    dest = tmp_path / target.relative_to(dgx.resolve())
    dest.mkdir(parents=True)
    for name in ("vendor", "device", "class"):
        shutil.copy(target / name, dest / name)
    (tmp_path / "bus/pci/devices").mkdir(parents=True)
    (tmp_path / "bus/pci/devices" / bridge.name).symlink_to(
        Path("../../..") / dest.relative_to(tmp_path)
    )
    one_line_error(fabricscope(["topo", f"--path.sysfs={tmp_path}"]), status=1)


# --- a dual-function NIC behind one x8 link: one link, one finding, one alert ----------------


@pytest.fixture
def dual_function_x8(tmp_path: Path) -> Path:
    """The AMD Genoa tree (tests/fixtures/amd-genoa-rootports) with its dual-port ConnectX-7
    at 21:00.0/.1 retrained at x8 on both functions (one link, both ends x16)."""
    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / "amd-genoa-rootports" / "sys", root, symlinks=True)
    for fn in ("0000:21:00.0", "0000:21:00.1"):
        (root / "bus/pci/devices" / fn / "current_link_width").write_text("8\n")
    return root


def test_a_dual_function_nic_on_one_narrow_link_is_one_alert(
    dual_function_x8: Path, tmp_path: Path
) -> None:
    topo = fabricscope(["topo", f"--path.sysfs={dual_function_x8}"])
    assert topo.returncode == 0, topo.stderr
    assert "6 judged, 1 degraded" in topo.stdout  # 8 functions on 6 links
    assert "0000:20:03.1 -> 0000:21:00.0 (and function 1): x8 of x16 (degraded)" in topo.stdout
    assert topo.stdout.count("pci_link_width_degraded 0000:21:00.0:") == 1
    assert "pci_link_width_degraded 0000:21:00.1" not in topo.stdout
    once = fabricscope(
        ["agent", "--once", "--no-sampler.netdev", f"--path.sysfs={dual_function_x8}"]
    )
    assert once.returncode == 0, once.stderr
    assert 'fabricscope_findings{kind="pci_link_width_degraded"} 1.0' in once.stdout
    degraded = re.findall(
        r'^fabricscope_pci_link_width_degraded\{pci_bus_id="([^"]+)"\} 1\.0$',
        once.stdout,
        re.MULTILINE,
    )
    # each function's series reads 1 (its link is narrow); the alert folds them into one
    assert degraded == ["0000:21:00.0", "0000:21:00.1"]
    series = "\n".join(
        f'  - series: fabricscope_pci_link_width_degraded{{job="fabricscope", instance="n",'
        f' pci_bus_id="{bus}"}}\n    values: 1x20'
        for bus in degraded
    )
    bus, node = "0000:21:00.0", "n"
    summary = f"PCIe link to {bus} on {node} trained narrower than both ends support."
    description = (
        f"The PCIe link between {bus} on {node} (and the other functions of that device, "
        "which share it) and its upstream port runs with fewer lanes than both ends support: "
        "the GPU or NIC behind it gets a fraction of its bandwidth. A reseat or a reboot "
        "usually retrains it."
    )
    test = tmp_path / "dual.test.yaml"
    test.write_text(
        f"rule_files:\n- {ROOT / 'deploy/rules/hardware.rules.yaml'}\n"
        "evaluation_interval: 1m\ntests:\n- interval: 1m\n  input_series:\n"
        f"{series}\n  alert_rule_test:\n  - eval_time: 16m\n"
        "    alertname: FabricscopePcieLinkWidthDegraded\n    exp_alerts:\n"
        f"    - exp_labels: {{job: fabricscope, instance: {node}, pci_bus_id: '{bus}', "
        "severity: warning}\n"
        f"      exp_annotations:\n        summary: {json.dumps(summary)}\n"
        f"        description: {json.dumps(description)}\n"
        "        runbook_url: https://github.com/fabricscope/fabricscope/blob/main/docs/"
        "alerts.md#fabricscopepcielinkwidthdegraded\n"
    )
    run = subprocess.run(
        ["promtool", "test", "rules", str(test)], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stdout + run.stderr


# --- durations, the timeout that follows the interval -----------------------------------------


@pytest.mark.parametrize("timeout", ["1s", "1", "1m30s", "0.5"])
def test_one_duration_syntax_for_the_sampling_timeout(timeout: str, tmp_path: Path) -> None:
    """--once takes one pass: its timeout in any duration syntax, no interval to fit under."""
    proc = fabricscope(
        ["agent", "--once", f"--sampling.timeout={timeout}", f"--path.sysfs={tmp_path}"]
    )
    assert proc.returncode == 0, proc.stderr


def test_a_timeout_longer_than_the_interval_given_is_an_error() -> None:
    proc = fabricscope(["agent", "--sampling.interval=5s", "--sampling.timeout=10s"])
    assert one_line_error(proc) == (
        "fabricscope agent: error: --sampling.timeout 10s is longer than --sampling.interval "
        "5s: a pass must end before the next one starts (see fabricscope agent --help)"
    )


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["agent", "--sampling.interval=1.5m"], "not a duration: '1.5m'"),
        (["agent", "--once", "--web.idle-timeout=30s5m"], "not a duration"),
        (["agent", "--once", "--probe.round-seconds=soon"], "not a duration"),
        (["explain", "--prometheus.url=http://x", "--job=j", "--window=1.5h"], "not a duration"),
        (["probe", "plan", "--nodes=4", "--round-seconds=5x"], "not a duration"),
    ],
)
def test_bad_durations_are_one_line(args: list[str], said: str) -> None:
    assert said in one_line_error(fabricscope(args))


def test_explain_takes_the_same_durations() -> None:
    """``--window 15`` (seconds) and ``1m30s`` parse; what remains is explain's own check."""
    for window in ("15", "1m30s"):
        proc = fabricscope(
            [
                "explain",
                "--prometheus.url=http://127.0.0.1:9",
                "--job=llm",
                f"--window={window}",
                "--prometheus.timeout=500ms",
            ]
        )
        assert one_line_error(proc) == (
            "fabricscope explain: the window must be at least 2 minutes long"
        )


# --- flags: the subcommand's one-line error, no abbreviations --------------------------------


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["agent", "--bogus"], "fabricscope agent: error: unrecognized arguments: --bogus"),
        (
            ["agent", "--sampling.interval", "-1"],
            "fabricscope agent: error: argument --sampling.interval: must not be negative",
        ),
        (
            ["agent", "--path.sys", "X"],
            "fabricscope agent: error: unrecognized arguments: --path.sys X; did you mean "
            "--path.sysfs?",
        ),
        (["topo", "--form", "json"], "fabricscope topo: error: unrecognized arguments: --form"),
        (
            ["snapshot", "-o", "x", "--out", "y"],
            "fabricscope snapshot: error: unrecognized arguments: --out y",
        ),
        (["probe", "--peer-gpu=2"], "fabricscope probe: error: unrecognized arguments"),
        (
            ["probe", "plan", "--nodes", "4", "--bad-nod", "node0001"],
            "fabricscope probe plan: error: unrecognized arguments: --bad-nod",
        ),
        (
            ["explain", "--prometheus.url=http://x", "--job=j", "--win", "6h"],
            "fabricscope explain: error: unrecognized arguments: --win",
        ),
        (["agnet"], "fabricscope: error: argument COMMAND: invalid choice: 'agnet'"),
    ],
)
def test_bad_flags_are_the_subcommands_one_line(args: list[str], said: str) -> None:
    line = one_line_error(fabricscope(args))
    assert line.startswith(said), line


# --- fast start: import what the command needs ------------------------------------------------


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["agent", "--help"]])
def test_version_and_help_import_no_sampler_or_server(args: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "exporter.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if "|" in line}
    heavy = {
        "agent.samplers",
        "agent.core.runner",
        "agent.infiniband.sampler",
        "agent.pci.sampler",
        "exporter.app",
        "exporter.http.server",
        "exporter.explain.client",
        "prometheus_client",
        "yaml",
        "grpc",
        "kubernetes",
        "pyroute2",
        "h11",
    }
    assert imported & heavy == set()


# --- flags that would be ignored are refused ----------------------------------------------------


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["agent", "--once", "--probe"], "--probe has no effect with --once"),
        (
            ["agent", "--once", "--web.config.file", "bad.yml"],
            "--web.config.file has no effect with --once: nothing is served",
        ),
        (
            ["agent", "--once", "--web.listen-address=:9999"],
            "--web.listen-address has no effect with --once",
        ),
        (
            ["topo", "--snapshot", "X", "--path.sysfs", "Y"],
            "--path.sysfs has no effect with --snapshot",
        ),
        (
            ["agent", "--once", "--snapshot=X", "--path.procfs=/proc"],
            "--path.procfs has no effect with --snapshot",
        ),
    ],
)
def test_flags_that_would_be_ignored_are_refused(args: list[str], said: str) -> None:
    line = one_line_error(fabricscope(args))
    assert line.startswith(f"fabricscope {args[0]}: error: {said}"), line
    assert line.endswith(f"(see fabricscope {args[0]} --help)"), line


# --- probe plan assumes the agent's defaults and says so --------------------------------------


def test_probe_plan_uses_the_agents_round_length() -> None:
    proc = fabricscope(["probe", "plan", "--nodes", "16", "--bad-node", "node0003"])
    assert proc.returncode == 0, proc.stderr
    assert "round 300 s (the agent's default --probe.round-seconds), probe 30 s" in proc.stdout
    short = fabricscope(["probe", "plan", "--nodes", "16", "--round-seconds", "1m"])
    assert "round 60 s, probe 30 s" in short.stdout, short.stdout
