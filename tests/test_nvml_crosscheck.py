"""scripts/gpu_crosscheck.py: its nvidia-smi parsers against real outputs
(tests/fixtures/nvidia-smi/, PROVENANCE.md), and its comparison end to end against a served
/metrics page and a stand-in nvidia-smi."""

from __future__ import annotations

import http.server
import importlib.util
import re
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from agent.gpu_topology import nvlink_matrix
from agent.nvml import NvmlSampler, NvmlSnapshot
from agent.nvml_record import ReplayNvml
from exporter import nvml as metrics
from exporter.exposition import render_text
from exporter.spec import Families
from tests.test_nvml_fixtures import h200x2_standin, with_link_down

ROOT = Path(__file__).resolve().parent.parent
SMI = ROOT / "tests" / "fixtures" / "nvidia-smi"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gpu_crosscheck", ROOT / "scripts" / "gpu_crosscheck.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


cc = _load()


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


def standin_snapshot(rec: dict[str, object] | None = None) -> NvmlSnapshot:
    sampler = NvmlSampler(lambda: ReplayNvml(rec or h200x2_standin()), watch_xid=False)  # type: ignore[arg-type]
    try:
        return sampler.sample()
    finally:
        sampler.close()


def metrics_text(snap: NvmlSnapshot) -> str:
    out = Families()
    metrics.render(snap, out)
    return render_text(out).decode()


def smi_q(width: int = 16, replays: int = 0) -> str:
    """`nvidia-smi -q` for the stand-in H200 x2 node: CONSTRUCTED in nvidia-smi's layout
    (the sections the cross-check reads), from the stand-in's values."""
    head = (
        "\n==============NVSMI LOG==============\n\n"
        "Timestamp                                 : Sat Nov 22 02:00:00 2026\n"
        "Driver Version                            : 580.159.04\n"
        "CUDA Version                              : 13.0\n\n"
        "Attached GPUs                             : 2\n"
    )
    gpus = ""
    for i, bus in ((0, "00000000:00:06.0"), (1, "00000000:00:07.0")):
        uuid = f"GPU-00000000-0000-0000-0000-00000000000{i}"
        gpus += (
            f"GPU {bus}\n"
            "    Product Name                          : NVIDIA H200\n"
            f"    Serial Number                         : 165000000000{i}\n"
            f"    GPU UUID                              : {uuid}\n"
            "    VBIOS Version                         : 96.00.A5.00.01\n"
            "    PCI\n"
            f"        Bus Id                            : {bus}\n"
            "        GPU Link Info\n"
            "            PCIe Generation\n"
            "                Max                       : 5\n"
            "                Current                   : 5\n"
            "            Link Width\n"
            "                Max                       : 16x\n"
            f"                Current                   : {width if i == 0 else 16}x\n"
            f"        Replays Since Reset               : {replays if i == 0 else 0}\n"
            "    Remapped Rows\n"
            "        Correctable Error                 : 0\n"
            "        Uncorrectable Error               : 0\n"
            "        Pending                           : No\n"
            "        Remapping Failure Occurred        : No\n\n"
        )
    return head + gpus


def smi_status(down: int | None = None) -> str:
    out = ""
    for i in range(2):
        out += f"GPU {i}: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-00000000000{i})\n"
        for n in range(18):
            speed = "<inactive>" if (i, n) == (0, down) else "26.562 GB/s"
            out += f"\t Link {n}: {speed}\n"
    return out


def smi_errors(crc: int = 0) -> str:
    out = ""
    for i in range(2):
        out += f"GPU {i}: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-00000000000{i})\n"
        for n in range(18):
            out += f"\t Link {n}: Replay Errors: 0\n\t Link {n}: Recovery Errors: 0\n"
            out += f"\t Link {n}: CRC Errors: {crc if (i, n) == (1, 2) else 0}\n"
    return out


def smi_topo(nv: str = "NV18") -> str:
    return (
        "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
        f"GPU0\t X \t{nv}\t0-31\t0\t\tN/A\n"
        f"GPU1\t{nv}\t X \t0-31\t0\t\tN/A\n\n"
        "Legend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks\n"
    )


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


def test_a_consistent_node_passes() -> None:
    checks = run_checks(standin_snapshot(), smi_q(), smi_status(), smi_errors(), smi_topo())
    got = by_status(checks)
    assert "FAIL" not in got
    # the stand-in's NVML offers no link speed: visible, not hidden
    assert got["MISSING"] == [("nvlink speed", "gpu0"), ("nvlink speed", "gpu1")]
    assert ("topo NV#", "gpu0-gpu1") in got["PASS"]
    assert ("nvlinks up", "gpu1") in got["PASS"]
    assert ("nvlink crc_flit", "gpu1") in got["PASS"]
    assert ("gpu count", "node") in got["PASS"]
    assert len(got["PASS"]) == 1 + 2 * 12 + 2 + 2 * 3 + 1


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
    checks = run_checks(standin_snapshot(), **outputs)  # type: ignore[arg-type]
    assert by_status(checks)["FAIL"] == [failing]


def test_a_down_link_agrees_with_nvidia_smi_showing_it_inactive() -> None:
    snap = standin_snapshot(with_link_down(h200x2_standin(), 0, 5))  # type: ignore[arg-type]
    checks = run_checks(snap, smi_q(), smi_status(down=5), smi_errors(), smi_topo("NV17"))
    assert "FAIL" not in by_status(checks)


def test_without_the_snapshot_the_nvswitch_matrix_is_skipped() -> None:
    checks = run_checks(
        standin_snapshot(), smi_q(), smi_status(), smi_errors(), smi_topo(), from_metrics=True
    )
    assert by_status(checks)["SKIP"] == [("topo NV#", "gpu0-gpu1")]


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
    served_metrics[0] = metrics_text(standin_snapshot())
    outputs = {"q": smi_q(), "status": smi_status(), "errors": smi_errors(), "topo": smi_topo()}
    smi = fake_nvidia_smi(tmp_path, outputs)
    args = ["--metrics-url", served_metrics[1], "--nvidia-smi", str(smi)]
    assert cc.main(args) == 0
    out = capsys.readouterr().out
    assert "FAIL=0" in out and "MISSING=2" in out
    assert cc.main([*args, "--strict"]) == 1  # MISSING counts with --strict
    capsys.readouterr()
    (tmp_path / "topo").write_text(smi_topo("NV12"))
    (tmp_path / "q").write_text(smi_q(width=4))
    assert cc.main(args) == 1
    table = capsys.readouterr().out
    assert re.search(r"pcie width current +gpu0 0000:00:06.0 +4 +16 +FAIL", table)
    assert re.search(r"topo NV# +gpu0-gpu1 +NV12 +far ends not exported +SKIP", table)


def test_main_copes_with_nvlink_e_unsupported(
    tmp_path: Path, served_metrics: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    served_metrics[0] = metrics_text(standin_snapshot())
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
    served_metrics[0] = metrics_text(standin_snapshot())
    rc = cc.main(["--metrics-url", served_metrics[1], "--nvidia-smi", str(tmp_path / "none")])
    assert rc == 1
    assert "nvidia-smi -q" in capsys.readouterr().out
