"""scripts/gpu_crosscheck.py: its nvidia-smi parsers against real outputs
(tests/fixtures/nvidia-smi/, PROVENANCE.md), and its comparison end to end against a served
/metrics page and a stand-in nvidia-smi."""

from __future__ import annotations

import http.server
import re
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.nvml.record import ReplayNvml
from agent.nvml.sampler import NvmlSampler
from agent.nvml.snapshot import NvmlSnapshot
from agent.nvml.topology import nvlink_matrix
from exporter.metrics import nvml as metrics
from exporter.metrics.exposition import render_text
from exporter.metrics.spec import Families
from tests.nvml.test_nvml_fixtures import h200x2_recording, with_link_down
from tests.scriptmod import load_script

ROOT = Path(__file__).resolve().parents[2]
SMI = ROOT / "tests" / "fixtures" / "nvidia-smi"


cc = load_script("gpu_crosscheck")


# -- parsers, on real outputs ---------------------------------------------------------


def test_parse_smi_query_h100x8() -> None:
    q = cc.parse_smi_query((SMI / "q.h100x8.535.161.08.txt").read_text())
    assert (q.driver_version, q.attached) == ("535.161.08", 8)
    assert [g.pci_bus_id for g in q.gpus] == [
        "0000:19:00.0",
        "0000:3b:00.0",
        "0000:4c:00.0",
        "0000:5d:00.0",
        "0000:9b:00.0",
        "0000:bb:00.0",
        "0000:cb:00.0",
        "0000:db:00.0",
    ]
    assert q.gpus[0] == cc.SmiGpu(
        pci_bus_id="0000:19:00.0",
        product_name="NVIDIA H100 80GB HBM3",
        uuid="GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa",
        serial="1650124031592",
        vbios="96.00.74.00.0D",
        pcie_gen_max=5,
        pcie_gen_current=5,
        pcie_width_max=16,
        pcie_width_current=16,
        pcie_replays=67,
        remap_correctable=0,
        remap_uncorrectable=0,
        remap_pending=False,
        remap_failure=False,
    )
    assert [g.pcie_replays for g in q.gpus] == [67, 63, 52, 43, 49, 53, 82, 67]


def test_parse_smi_query_with_processes_and_na_host_max() -> None:
    q = cc.parse_smi_query((SMI / "q.h100x8.535.183.01.txt").read_text())
    assert (q.driver_version, q.attached, len(q.gpus)) == ("535.183.01", 8, 8)
    first = q.gpus[0]
    assert (first.pci_bus_id, first.pcie_replays, first.pcie_gen_max) == ("0000:53:00.0", 120, 5)
    # the GPU after the one with a Processes block parses like the others
    assert q.gpus[3].pci_bus_id == "0000:86:00.0"
    assert q.gpus[3].product_name == "NVIDIA H100 80GB HBM3"


def test_parse_smi_query_truncated_output() -> None:
    q = cc.parse_smi_query((SMI / "q.h100.535.183.01.invalid.txt").read_text())
    assert q.attached == 8
    assert len(q.gpus) == 1
    g = q.gpus[0]
    assert (g.pci_bus_id, g.pcie_width_current, g.pcie_replays) == ("0000:53:00.0", 16, 120)
    assert (g.remap_correctable, g.remap_failure) == (None, None)  # cut off before


def test_parse_nvlink_status() -> None:
    a100 = cc.parse_nvlink_status((SMI / "nvlink-status.a100x8.txt").read_text())
    assert [s.gpu for s in a100] == list(range(8))
    assert a100[0].name == "NVIDIA A100-SXM4-80GB"
    assert a100[0].uuid == "GPU-5269b708-678a-b1a8-60f0-c90406537486"
    assert all(s.links == tuple((n, 25e9) for n in range(12)) for s in a100)
    (h100,) = cc.parse_nvlink_status((SMI / "nvlink-status.h100-gpu0.txt").read_text())
    assert h100.links == tuple((n, 26.562e9) for n in range(18))
    mixed = cc.parse_nvlink_status(
        "GPU 1: NVIDIA H200\n\t Link 0: <inactive>\n\t Link 1: 26.562 GB/s\n"
    )
    assert mixed[0].links == ((0, None), (1, 26.562e9))
    assert (mixed[0].gpu, mixed[0].uuid) == (1, None)


def test_parse_nvlink_errors() -> None:
    # the layout of `nvidia-smi nvlink -e` as Hopper drivers print it (one counter a line)
    classic = (
        "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-abcdefab-cdef-abdc-abcd-abababababab)\n"
        "         Link 0: Replay Errors: 0\n"
        "         Link 0: Recovery Errors: 0\n"
        "         Link 0: CRC Errors: 0\n"
        "\n"
        "         Link 1: Replay Errors: 3\n"
        "         Link 1: Recovery Errors: 1\n"
        "         Link 1: CRC Errors: 12\n"
    )
    assert cc.parse_nvlink_errors(classic) == {
        (0, 0): {"replay": 0, "recovery": 0, "crc_flit": 0},
        (0, 1): {"replay": 3, "recovery": 1, "crc_flit": 12},
    }
    commas = "GPU 2: X\n   Link 1: Replay Errors: 142, Recovery Errors: 3, CRC Errors: 891\n"
    assert cc.parse_nvlink_errors(commas) == {
        (2, 1): {"replay": 142, "recovery": 3, "crc_flit": 891}
    }
    # a driver printing another counter set: kept under its own names, not dropped
    other = "GPU 0: NVIDIA GB200\n\t Link 0: Rx Errors: 0\n\t Link 0: Effective Errors: 5\n"
    assert cc.parse_nvlink_errors(other) == {(0, 0): {"Rx Errors": 0, "Effective Errors": 5}}
    assert cc.parse_nvlink_errors("") == {}


def test_parse_topo_matrix() -> None:
    a100 = cc.parse_topo_matrix((SMI / "topo-m.dgx-a100.txt").read_text())
    assert {k: v for k, v in a100.items() if k[0] == k[1]} == {(i, i): "X" for i in range(8)}
    assert {v for k, v in a100.items() if k[0] != k[1]} == {"NV12"}
    assert len(a100) == 64
    a3 = cc.parse_topo_matrix((SMI / "topo-m.gcp-a3-high.txt").read_text())
    assert len(a3) == 64 and a3[(3, 6)] == "NV18"
    partial = cc.parse_topo_matrix((SMI / "topo-m.h100-9nic.partial.txt").read_text())
    assert len(partial) == 64 and partial[(7, 0)] == "NV18"
    dgx1 = cc.parse_topo_matrix((SMI / "topo-mp.dgx1.txt").read_text())
    assert (dgx1[(0, 1)], dgx1[(0, 2)], dgx1[(0, 4)]) == ("PIX", "PHB", "SYS")
    assert [cc.nv_links(c) for c in ("NV18", "NV4", "PIX", "X", "SYS")] == [18, 4, 0, 0, 0]


# -- the comparison ---------------------------------------------------------------------


def recorded_snapshot(rec: dict[str, object] | None = None) -> NvmlSnapshot:
    """The sampler's snapshot of the recorded H200 x2 node (or of an edited recording)."""
    sampler = NvmlSampler(lambda: ReplayNvml(rec or h200x2_recording()), watch_xid=False)  # type: ignore[arg-type]
    try:
        return sampler.sample()
    finally:
        sampler.close()


def metrics_text(snap: NvmlSnapshot) -> str:
    out = Families()
    metrics.render(snap, out)
    return render_text(out).decode()


H200 = SMI / "h200x2"


def _edit(text: str, old: str, new: str, after: str = "") -> str:
    """Replace the first ``old`` found after ``after`` (which must exist): one derived fault."""
    at = text.index(after) if after else 0
    hit = text.index(old, at)
    return text[:hit] + new + text[hit + len(old) :]


def smi_q(width: int | None = None, replays: int | None = None) -> str:
    """The real `nvidia-smi -q` of the recorded node (same run as its NVML recording);
    with ``width`` / ``replays``, GPU0's current link width / replay count EDITED to them."""
    text = (H200 / "q.txt").read_text()
    if width is not None:
        text = _edit(
            text,
            "Current                                : 16x",
            f"Current                                : {width}x",
            "GPU 00000000:00:06.0",
        )
    if replays is not None:
        text = _edit(
            text,
            "Replays Since Reset                            : 0",
            f"Replays Since Reset                            : {replays}",
            "GPU 00000000:00:06.0",
        )
    return text


def smi_status(down: int | None = None) -> str:
    """The real `nvidia-smi nvlink --status`; with ``down``, GPU0's link ``down`` EDITED to
    ``<inactive>``."""
    text = (H200 / "nvlink-status.txt").read_text()
    if down is not None:
        text = _edit(text, f"Link {down}: 26.562 GB/s", f"Link {down}: <inactive>", "GPU 0:")
    return text


def smi_errors(crc: int | None = None) -> str:
    """The real `nvidia-smi nvlink -e`; with ``crc``, GPU1 link 2's CRC count EDITED."""
    text = (H200 / "nvlink-e.txt").read_text()
    if crc is not None:
        text = _edit(text, "Link 2: CRC Errors: 0", f"Link 2: CRC Errors: {crc}", "GPU 1:")
    return text


def smi_topo(nv: str = "NV18") -> str:
    """The real `nvidia-smi topo -m` (ANSI underline escapes and all); ``nv`` EDITED in."""
    return (H200 / "topo-m.txt").read_text().replace("NV18", nv)


def run_checks(
    snap: NvmlSnapshot, q: str, status: str, errors: str, topo: str, *, from_metrics: bool = False
) -> list[object]:
    return cc.crosscheck(  # type: ignore[no-any-return]
        cc.parse_metrics(metrics_text(snap)),
        query=cc.parse_smi_query(q),
        status=cc.parse_nvlink_status(status),
        errors=cc.parse_nvlink_errors(errors),
        topo=cc.parse_topo_matrix(topo),
        matrix=None if from_metrics else nvlink_matrix(snap),
    )


def by_status(checks: list[object]) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    for c in checks:
        out.setdefault(c.status, []).append((c.check, c.subject))  # type: ignore[attr-defined]
    return out


def test_the_recorded_node_agrees_with_its_own_nvidia_smi() -> None:
    """Real NVML answers against real nvidia-smi output of the same run: every check runs
    and passes (36 rows: count, 12 per GPU, links up + speed per GPU, 3 error kinds per GPU,
    and the NV18 between the two GPUs)."""
    checks = run_checks(recorded_snapshot(), smi_q(), smi_status(), smi_errors(), smi_topo())
    got = by_status(checks)
    assert set(got) == {"PASS"}
    assert ("topo NV#", "gpu0-gpu1") in got["PASS"]
    assert ("nvlink speed", "gpu1") in got["PASS"]
    assert ("pcie replays", "gpu1 0000:00:07.0") in got["PASS"]
    assert len(got["PASS"]) == 1 + 2 * 12 + 2 * 2 + 2 * 3 + 1


@pytest.mark.parametrize(
    ("smi", "failing"),
    [
        ({"q": smi_q(width=8)}, ("pcie width current", "gpu0 0000:00:06.0")),
        ({"q": smi_q(replays=4)}, ("pcie replays", "gpu0 0000:00:06.0")),
        ({"status": smi_status(down=5)}, ("nvlinks up", "gpu0")),
        ({"errors": smi_errors(crc=9)}, ("nvlink crc_flit", "gpu1")),
        ({"topo": smi_topo("NV12")}, ("topo NV#", "gpu0-gpu1")),
    ],
)
def test_each_disagreement_fails(smi: dict[str, str], failing: tuple[str, str]) -> None:
    outputs = {"q": smi_q(), "status": smi_status(), "errors": smi_errors(), "topo": smi_topo()}
    outputs.update(smi)
    checks = run_checks(recorded_snapshot(), **outputs)  # type: ignore[arg-type]
    assert by_status(checks)["FAIL"] == [failing]


def test_a_down_link_agrees_with_nvidia_smi_showing_it_inactive() -> None:
    snap = recorded_snapshot(with_link_down(h200x2_recording(), 0, 5))  # type: ignore[arg-type]
    checks = run_checks(snap, smi_q(), smi_status(down=5), smi_errors(), smi_topo("NV17"))
    assert "FAIL" not in by_status(checks)


def test_from_metrics_alone_the_nvswitch_matrix_still_checks() -> None:
    """The VM's far ends are NVSwitches it cannot see (FFFFFFFF:FF:FF.0); remote_type says
    so, which is enough to rebuild NV18 from /metrics alone."""
    checks = run_checks(
        recorded_snapshot(), smi_q(), smi_status(), smi_errors(), smi_topo(), from_metrics=True
    )
    got = by_status(checks)
    assert set(got) == {"PASS"} and ("topo NV#", "gpu0-gpu1") in got["PASS"]


def test_an_unparsable_topo_is_a_visible_skip_not_silence() -> None:
    checks = run_checks(recorded_snapshot(), smi_q(), smi_status(), smi_errors(), "garbage\n")
    assert by_status(checks)["SKIP"] == [("topo NV#", "node")]


def test_metrics_nvlink_matrix_from_remote_info() -> None:
    text = (
        'fabricscope_gpu_info{gpu="0",uuid="a",pci_bus_id="0000:01:00.0",model="m",fw_ver=""} 1\n'
        'fabricscope_gpu_info{gpu="1",uuid="b",pci_bus_id="0000:02:00.0",model="m",fw_ver=""} 1\n'
        'fabricscope_nvlink_up{gpu="0",link="0"} 1\n'
        'fabricscope_nvlink_up{gpu="0",link="1"} 1\n'
        'fabricscope_nvlink_up{gpu="0",link="2"} 0\n'
        'fabricscope_nvlink_up{gpu="1",link="0"} 1\n'
        'fabricscope_nvlink_remote_info{gpu="0",link="0",pci_bus_id="0000:02:00.0"} 1\n'
        'fabricscope_nvlink_remote_info{gpu="0",link="1",pci_bus_id="0000:02:00.0"} 1\n'
        'fabricscope_nvlink_remote_info{gpu="1",link="0",pci_bus_id="0000:01:00.0"} 1\n'
    )
    assert cc.metrics_nvlink_matrix(cc.parse_metrics(text)) == {(0, 1): 2, (1, 0): 1}
    unresolved = text + 'fabricscope_nvlink_up{gpu="1",link="1"} 1\n'
    assert cc.metrics_nvlink_matrix(cc.parse_metrics(unresolved)) is None


# -- the command, end to end ----------------------------------------------------------


@pytest.fixture
def served_metrics() -> Iterator[list[str]]:
    """An HTTP server on 127.0.0.1 answering /metrics with whatever text the list holds."""
    page: list[str] = [""]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page[0].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    page.append(f"http://127.0.0.1:{server.server_address[1]}/metrics")
    yield page
    server.shutdown()
    server.server_close()


def fake_nvidia_smi(tmp_path: Path, outputs: dict[str, str], errors_rc: int = 0) -> Path:
    """An executable printing the given outputs for -q, nvlink --status, nvlink -e, topo -m."""
    for name, text in outputs.items():
        (tmp_path / name).write_text(text)
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'd="{tmp_path}"\n'
        'case "$*" in\n'
        '  "-q") cat "$d/q" ;;\n'
        '  "nvlink --status") cat "$d/status" ;;\n'
        f'  "nvlink -e") cat "$d/errors"; exit {errors_rc} ;;\n'
        '  "topo -m") cat "$d/topo" ;;\n'
        '  *) echo "unexpected: $*" >&2; exit 2 ;;\n'
        "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_main_checks_a_running_agent(
    tmp_path: Path, served_metrics: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    served_metrics[0] = metrics_text(recorded_snapshot())
    outputs = {"q": smi_q(), "status": smi_status(), "errors": smi_errors(), "topo": smi_topo()}
    smi = fake_nvidia_smi(tmp_path, outputs)
    args = ["--metrics-url", served_metrics[1], "--nvidia-smi", str(smi)]
    assert cc.main(args) == 0
    out = capsys.readouterr().out
    assert "FAIL=0" in out and "MISSING=0" in out and "SKIP=0" in out
    assert cc.main([*args, "--strict"]) == 0
    capsys.readouterr()
    (tmp_path / "topo").write_text(smi_topo("NV12"))
    (tmp_path / "q").write_text(smi_q(width=4))
    assert cc.main(args) == 1
    table = capsys.readouterr().out
    assert re.search(r"pcie width current +gpu0 0000:00:06.0 +4 +16 +FAIL", table)
    assert re.search(r"topo NV# +gpu0-gpu1 +NV12 +NV18 +FAIL", table)


def test_main_copes_with_nvlink_e_unsupported(
    tmp_path: Path, served_metrics: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    served_metrics[0] = metrics_text(recorded_snapshot())
    outputs = {
        "q": smi_q(),
        "status": smi_status(),
        "errors": "Not supported\n",
        "topo": smi_topo(),
    }
    smi = fake_nvidia_smi(tmp_path, outputs, errors_rc=3)
    assert cc.main(["--metrics-url", served_metrics[1], "--nvidia-smi", str(smi)]) == 0
    assert re.search(r"nvlink errors +node +\(nothing printed\) +- +SKIP", capsys.readouterr().out)


def test_main_fails_when_nvidia_smi_is_missing(
    tmp_path: Path, served_metrics: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    served_metrics[0] = metrics_text(recorded_snapshot())
    rc = cc.main(["--metrics-url", served_metrics[1], "--nvidia-smi", str(tmp_path / "none")])
    assert rc == 1
    assert "nvidia-smi -q" in capsys.readouterr().out
