#!/usr/bin/env python3
"""Cross-check fabricscope's NVML metrics against nvidia-smi on a GPU machine.

Runs the NVML sampler once, renders its metrics in-process (or, with ``--metrics-url``,
fetches a running agent's /metrics), runs ``nvidia-smi -q``, ``nvidia-smi nvlink --status``,
``nvidia-smi nvlink -e`` and ``nvidia-smi topo -m`` right after, and compares: GPU count,
identity, PCIe generation/width/replays, remapped rows, per GPU the NVLinks up and their
speed, NVLink error counters, and the NV<n> link count between GPU pairs.

Prints one row per check: PASS, FAIL (the two disagree), MISSING (nvidia-smi shows a
value fabricscope does not export) or SKIP (nvidia-smi shows nothing to compare). Exits 1 on
any FAIL (and on MISSING with ``--strict``), 0 otherwise.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client.parser import text_string_to_metric_families

PASS, FAIL, MISSING, SKIP = "PASS", "FAIL", "MISSING", "SKIP"

# -- nvidia-smi parsers (pure) ----------------------------------------------------------


def smi_bus_id(text: str) -> str:
    """``00000000:19:00.0`` -> ``0000:19:00.0`` (the sysfs form fabricscope exports)."""
    m = re.fullmatch(r"\s*([0-9A-Fa-f]+):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])\s*", text)
    if m is None:
        raise ValueError(f"not a PCI bus id: {text!r}")
    return f"{int(m.group(1), 16):04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


@dataclass
class _Node:
    key: str
    value: str | None
    children: list[_Node] = field(default_factory=list)

    def find(self, *path: str) -> _Node | None:
        node: _Node | None = self
        for key in path:
            if node is None:
                return None
            node = next((c for c in node.children if c.key == key), None)
        return node

    def get(self, *path: str) -> str | None:
        node = self.find(*path)
        if node is None or node.value is None or node.value.strip() in ("", "N/A"):
            return None
        return node.value.strip()


_GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_KEY_VALUE = re.compile(r"^(?P<key>[^:]*?\S)\s*:\s?(?P<value>.*)$")


def _tree(text: str) -> _Node:
    """``nvidia-smi -q``'s indented ``Key : Value`` lines as a tree (sections: no value)."""
    root = _Node("", None)
    stack: list[tuple[int, _Node]] = [(-1, root)]
    for raw in text.expandtabs(4).splitlines():
        if not raw.strip():
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        line = raw.strip()
        header = _GPU_HEADER.match(line) if indent == 0 else None
        if header is not None:
            node = _Node("GPU", header.group(1))
        else:
            m = _KEY_VALUE.match(line)
            node = _Node(m.group("key"), m.group("value")) if m else _Node(line, None)
        while stack[-1][0] >= indent:
            stack.pop()
        stack[-1][1].children.append(node)
        stack.append((indent, node))
    return root


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    m = re.fullmatch(r"(\d+)\s*x?", text)
    return int(m.group(1)) if m else None


def _yes(text: str | None) -> bool | None:
    return None if text is None else {"yes": True, "no": False}.get(text.lower())


@dataclass(frozen=True, slots=True)
class SmiGpu:
    """One GPU of ``nvidia-smi -q``; ``None`` where it printed N/A or nothing."""

    pci_bus_id: str
    product_name: str | None
    uuid: str | None
    serial: str | None
    vbios: str | None
    pcie_gen_max: int | None
    pcie_gen_current: int | None
    pcie_width_max: int | None
    pcie_width_current: int | None
    pcie_replays: int | None
    remap_correctable: int | None
    remap_uncorrectable: int | None
    remap_pending: bool | None
    remap_failure: bool | None


@dataclass(frozen=True, slots=True)
class SmiQuery:
    driver_version: str | None
    attached: int | None
    gpus: tuple[SmiGpu, ...]


def parse_smi_query(text: str) -> SmiQuery:
    """``nvidia-smi -q`` (drivers 470-580 print the same layout)."""
    root = _tree(text)
    gpus = []
    for node in root.children:
        if node.key != "GPU" or node.value is None:
            continue
        link = ("PCI", "GPU Link Info")
        rows = "Remapped Rows"
        gpus.append(
            SmiGpu(
                pci_bus_id=smi_bus_id(node.value),
                product_name=node.get("Product Name"),
                uuid=node.get("GPU UUID"),
                serial=node.get("Serial Number"),
                vbios=node.get("VBIOS Version"),
                pcie_gen_max=_int(node.get(*link, "PCIe Generation", "Max")),
                pcie_gen_current=_int(node.get(*link, "PCIe Generation", "Current")),
                pcie_width_max=_int(node.get(*link, "Link Width", "Max")),
                pcie_width_current=_int(node.get(*link, "Link Width", "Current")),
                pcie_replays=_int(node.get("PCI", "Replays Since Reset")),
                remap_correctable=_int(node.get(rows, "Correctable Error")),
                remap_uncorrectable=_int(node.get(rows, "Uncorrectable Error")),
                remap_pending=_yes(node.get(rows, "Pending")),
                remap_failure=_yes(node.get(rows, "Remapping Failure Occurred")),
            )
        )
    return SmiQuery(root.get("Driver Version"), _int(root.get("Attached GPUs")), tuple(gpus))


_SMI_GPU_LINE = re.compile(r"^GPU (\d+):\s*(.*?)\s*(?:\(UUID:\s*(\S+?)\))?\s*$")
_SMI_LINK_LINE = re.compile(r"^\s*Link (\d+):\s*(.*?)\s*$")
_SPEED = re.compile(r"^([\d.]+)\s*GB/s$")


@dataclass(frozen=True, slots=True)
class SmiLinks:
    """One GPU of ``nvidia-smi nvlink --status``: speed per link in bytes/second, ``None``
    for an inactive link."""

    gpu: int
    name: str
    uuid: str | None
    links: tuple[tuple[int, float | None], ...]


def parse_nvlink_status(text: str) -> tuple[SmiLinks, ...]:
    """``GPU 0: NAME (UUID: GPU-...)`` then ``Link N: 26.562 GB/s`` or ``Link N: <inactive>``."""
    out: list[SmiLinks] = []
    cur: tuple[int, str, str | None] | None = None
    links: list[tuple[int, float | None]] = []

    def flush() -> None:
        if cur is not None:
            out.append(SmiLinks(cur[0], cur[1], cur[2], tuple(links)))

    for line in text.splitlines():
        g = _SMI_GPU_LINE.match(line.strip())
        if g is not None:
            flush()
            cur, links = (int(g.group(1)), g.group(2), g.group(3)), []
            continue
        m = _SMI_LINK_LINE.match(line)
        if m is not None and cur is not None:
            speed = _SPEED.match(m.group(2))
            links.append((int(m.group(1)), float(speed.group(1)) * 1e9 if speed else None))
    flush()
    return tuple(out)


#: ``nvidia-smi nvlink -e`` counter names -> fabricscope's ``reason`` label values
SMI_ERROR_NAMES = {
    "Replay Errors": "replay",
    "Recovery Errors": "recovery",
    "CRC Errors": "crc_flit",
    "CRC FLIT Errors": "crc_flit",
    "CRC Data Errors": "crc_data",
}


def parse_nvlink_errors(text: str) -> dict[tuple[int, int], dict[str, int]]:
    """``nvidia-smi nvlink -e``: ``Link N: Replay Errors: 0`` lines (or several counters on
    one line, comma-separated) under ``GPU i: ...`` headers, as {(gpu, link): {name: n}}.
    Names fabricscope knows are mapped (:data:`SMI_ERROR_NAMES`); others are kept as
    printed, so a driver that prints another counter set is visible, not silently dropped."""
    out: dict[tuple[int, int], dict[str, int]] = {}
    gpu: int | None = None
    for line in text.splitlines():
        g = _SMI_GPU_LINE.match(line.strip())
        if g is not None:
            gpu = int(g.group(1))
            continue
        m = _SMI_LINK_LINE.match(line)
        if m is None or gpu is None:
            continue
        for part in m.group(2).split(","):
            name, sep, value = part.rpartition(":")
            if not sep or not value.strip().isdigit():
                continue
            key = SMI_ERROR_NAMES.get(name.strip(), name.strip())
            out.setdefault((gpu, int(m.group(1))), {})[key] = int(value)
    return out


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_topo_matrix(text: str) -> dict[tuple[int, int], str]:
    """The GPU-by-GPU cells of ``nvidia-smi topo -m`` (``NV18``, ``PIX``, ``SYS``, ``X``).
    Driver 580 underlines the header with ANSI escapes even when writing to a file."""
    header: list[str] | None = None
    out: dict[tuple[int, int], str] = {}
    for line in _ANSI.sub("", text).splitlines():
        cells = [c.strip() for c in line.split("\t")]
        if header is None:
            if len(cells) > 1 and cells[0] == "" and "GPU0" in cells:
                header = cells
            continue
        if not line.strip():
            break
        row = re.fullmatch(r"GPU(\d+)", cells[0])
        if row is None:
            continue
        for col, cell in zip(header[1:], cells[1:], strict=False):
            c = re.fullmatch(r"GPU(\d+)", col)
            if c is not None:
                out[(int(row.group(1)), int(c.group(1)))] = cell
    return out


def nv_links(cell: str) -> int:
    """``NV18`` -> 18; any other path type -> 0."""
    m = re.fullmatch(r"NV(\d+)", cell)
    return int(m.group(1)) if m else 0


# -- fabricscope's side -----------------------------------------------------------------


Labels = dict[str, str]


@dataclass
class Metrics:
    """Samples by name (counters keep their ``_total``)."""

    samples: dict[str, list[tuple[Labels, float]]] = field(default_factory=dict)

    def find(self, name: str, **labels: str) -> float | None:
        for have, value in self.samples.get(name, []):
            if all(have.get(k) == v for k, v in labels.items()):
                return value
        return None

    def all(self, name: str) -> list[tuple[Labels, float]]:
        return self.samples.get(name, [])


def parse_metrics(text: str) -> Metrics:
    out = Metrics()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def metrics_nvlink_matrix(m: Metrics) -> dict[tuple[int, int], int] | None:
    """GPU pairs' NVLink counts from ``fabricscope_nvlink_remote_info``, by the rule of
    ``agent.nvml.topology.nvlink_matrix``: links to another GPU of this node count for that
    pair; links to an NVSwitch (``remote_type="NVSwitch"``) join one switch fabric, and two
    GPUs on it get the smaller of their switch-link counts. ``None`` when some active link's
    far end is neither (not exported, or an unknown device): the metrics cannot say."""
    gpu_of = {lab["pci_bus_id"]: int(lab["gpu"]) for lab, _ in m.all("fabricscope_gpu_info")}
    remote = {
        (lab["gpu"], lab["link"]): (lab["pci_bus_id"], lab.get("remote_type", ""))
        for lab, _ in m.all("fabricscope_nvlink_remote_info")
    }
    out: dict[tuple[int, int], int] = {}
    switch_links: dict[int, int] = {}
    for lab, up in m.all("fabricscope_nvlink_up"):
        if up != 1:
            continue
        far = remote.get((lab["gpu"], lab["link"]))
        gpu = int(lab["gpu"])
        if far is not None and far[1] == "NVSwitch":
            switch_links[gpu] = switch_links.get(gpu, 0) + 1
            continue
        if far is None or far[0] not in gpu_of:
            return None
        pair = (gpu, gpu_of[far[0]])
        out[pair] = out.get(pair, 0) + 1
    for i, a in switch_links.items():
        for j, b in switch_links.items():
            if i != j:
                out[(i, j)] = out.get((i, j), 0) + min(a, b)
    return out


# -- the comparison ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Check:
    check: str
    subject: str
    smi: str
    fabricscope: str
    status: str


def _show(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def compare(check: str, subject: str, smi: object, ours: object) -> Check:
    if smi is None:
        status = SKIP
    elif ours is None:
        status = MISSING
    else:
        status = PASS if _same(smi, ours) else FAIL
    return Check(check, subject, _show(smi), _show(ours), status)


def _same(a: object, b: object) -> bool:
    if isinstance(a, bool | int | float) and isinstance(b, bool | int | float):
        return abs(float(a) - float(b)) <= 1e-3 * max(abs(float(a)), 1.0)
    return a == b


def crosscheck(
    m: Metrics,
    *,
    query: SmiQuery,
    status: Sequence[SmiLinks],
    errors: Mapping[tuple[int, int], Mapping[str, int]],
    topo: Mapping[tuple[int, int], str],
    matrix: Mapping[tuple[int, int], int] | None,
) -> list[Check]:
    """Every check, in a stable order. ``matrix`` is fabricscope's NVLink matrix
    (``agent.nvml.topology.nvlink_matrix``); ``None`` to derive it from the metrics."""
    out: list[Check] = []
    info = {int(lab["gpu"]): lab for lab, _ in m.all("fabricscope_gpu_info")}
    by_bus = {lab["pci_bus_id"]: g for g, lab in info.items()}
    by_uuid = {lab["uuid"]: g for g, lab in info.items()}
    out.append(compare("gpu count", "node", query.attached or len(query.gpus), len(info)))
    for sg in query.gpus:
        gi = by_bus.get(sg.pci_bus_id)
        subject = f"{sg.pci_bus_id}"
        if gi is None:
            out.append(Check("gpu present", subject, "yes", "no", FAIL))
            continue
        g = str(gi)
        subject = f"gpu{g} {sg.pci_bus_id}"
        lab = info[gi]

        def num(name: str, gpu: str = g, **labels: str) -> float | None:
            return m.find(name, gpu=gpu, **labels)

        out += [
            compare("uuid", subject, sg.uuid, lab.get("uuid") or None),
            compare("model", subject, sg.product_name, lab.get("model") or None),
            compare("vbios", subject, sg.vbios, lab.get("fw_ver") or None),
            compare(
                "pcie gen current",
                subject,
                sg.pcie_gen_current,
                num("fabricscope_gpu_pcie_current_link_generation"),
            ),
            compare(
                "pcie gen max",
                subject,
                sg.pcie_gen_max,
                num("fabricscope_gpu_pcie_max_link_generation"),
            ),
            compare(
                "pcie width current",
                subject,
                sg.pcie_width_current,
                num("fabricscope_gpu_pcie_current_link_width"),
            ),
            compare(
                "pcie width max",
                subject,
                sg.pcie_width_max,
                num("fabricscope_gpu_pcie_max_link_width"),
            ),
            compare(
                "pcie replays", subject, sg.pcie_replays, num("fabricscope_gpu_pcie_replays_total")
            ),
            compare(
                "remapped rows corr",
                subject,
                sg.remap_correctable,
                num("fabricscope_gpu_remapped_rows_total", reason="correctable"),
            ),
            compare(
                "remapped rows uncorr",
                subject,
                sg.remap_uncorrectable,
                num("fabricscope_gpu_remapped_rows_total", reason="uncorrectable"),
            ),
            compare(
                "row remap pending",
                subject,
                sg.remap_pending,
                _bool(num("fabricscope_gpu_row_remap_pending")),
            ),
            compare(
                "row remap failure",
                subject,
                sg.remap_failure,
                _bool(num("fabricscope_gpu_row_remap_failure")),
            ),
        ]
    for sl in status:
        gi = by_uuid.get(sl.uuid or "", sl.gpu)
        g = str(gi)
        subject = f"gpu{g}"
        ours_up = {
            int(lab["link"]): v for lab, v in m.all("fabricscope_nvlink_up") if lab["gpu"] == g
        }
        smi_up = [link for link, speed in sl.links if speed is not None]
        out.append(
            compare(
                "nvlinks up",
                subject,
                len(smi_up),
                sum(1 for v in ours_up.values() if v == 1) if ours_up else None,
            )
        )
        speeds = {
            int(lab["link"]): v
            for lab, v in m.all("fabricscope_nvlink_speed_bytes_per_second")
            if lab["gpu"] == g
        }
        out.append(_per_link("nvlink speed", subject, dict(sl.links), speeds, lambda s: s / 1e9))
    if not errors:
        out.append(Check("nvlink errors", "node", "(nothing printed)", "-", SKIP))
    for gi in sorted({gpu for gpu, _ in errors}):
        g = str(gi)
        for reason in ("replay", "recovery", "crc_flit"):
            smi_counts = {
                link: c[reason] for (gpu, link), c in errors.items() if gpu == gi and reason in c
            }
            ours = {
                int(lab["link"]): v
                for lab, v in m.all("fabricscope_nvlink_errors_total")
                if lab["gpu"] == g and lab["reason"] == reason
            }
            out.append(
                _per_link(f"nvlink {reason}", f"gpu{g}", dict(smi_counts), ours, lambda v: v)
            )
    if matrix is None:
        matrix = metrics_nvlink_matrix(m)
    if not topo:
        out.append(Check("topo NV#", "node", "(no GPU matrix parsed)", "-", SKIP))
    for (i, j), cell in sorted(topo.items()):
        if i >= j:
            continue
        smi_n = nv_links(cell)
        if matrix is None:
            out.append(Check("topo NV#", f"gpu{i}-gpu{j}", cell, "far ends not exported", SKIP))
        else:
            mine = matrix.get((i, j), 0)
            out.append(
                Check(
                    "topo NV#",
                    f"gpu{i}-gpu{j}",
                    cell,
                    f"NV{mine}" if mine else "-",
                    PASS if mine == smi_n else FAIL,
                )
            )
    return out


def _bool(v: float | None) -> bool | None:
    return None if v is None else v == 1


def _per_link(
    check: str,
    subject: str,
    smi: Mapping[int, float | None],
    ours: Mapping[int, float],
    unit: Callable[[float], float],
) -> Check:
    """One row for a per-link quantity: FAIL names the links that differ."""
    wanted = {link: v for link, v in smi.items() if v is not None}
    if not wanted:
        return Check(check, subject, "-", _show(len(ours)) + " links", SKIP)
    if not ours:
        return Check(check, subject, _summary(wanted, unit), "-", MISSING)
    bad = [
        link for link, v in sorted(wanted.items()) if link not in ours or not _same(v, ours[link])
    ]
    mine = {link: ours[link] for link in wanted if link in ours}
    status = FAIL if bad else PASS
    detail = _summary(mine, unit) + (f" (links {bad} differ)" if bad else "")
    return Check(check, subject, _summary(wanted, unit), detail, status)


def _summary(values: Mapping[int, float], unit: Callable[[float], float]) -> str:
    distinct = sorted({round(unit(v), 3) for v in values.values()})
    return f"{len(values)} links: " + ",".join(_show(v) for v in distinct)


def format_table(checks: Iterable[Check]) -> str:
    rows = [("CHECK", "SUBJECT", "NVIDIA-SMI", "FABRICSCOPE", "RESULT")]
    rows += [(c.check, c.subject, c.smi, c.fabricscope, c.status) for c in checks]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


# -- the command ------------------------------------------------------------------------


def run_smi(smi: str, *args: str, timeout: float = 60.0) -> tuple[int, str]:
    try:
        proc = subprocess.run(
            [smi, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, str(exc)
    return proc.returncode, proc.stdout if proc.returncode == 0 else proc.stdout + proc.stderr


def _in_process(recording: str | None = None) -> tuple[str, dict[tuple[int, int], int]]:
    """One pass of the sampler over the live library, or over ``recording`` (a recording
    made on this node in this run: live against live, through the replay path)."""
    from agent.nvml.findings import findings
    from agent.nvml.record import ReplayNvml, load
    from agent.nvml.sampler import NvmlSampler
    from agent.nvml.topology import nvlink_matrix
    from exporter.metrics import nvml
    from exporter.metrics.exposition import render_text
    from exporter.metrics.spec import Families

    if recording is None:
        sampler = NvmlSampler(watch_xid=False)
    else:
        data = load(recording)
        sampler = NvmlSampler(lambda: ReplayNvml(data), watch_xid=False)
    try:
        snap = sampler.sample()
    finally:
        sampler.close()
    for issue in snap.issues:
        print(f"sampler issue: {issue.path}: {issue.reason}: {issue.detail}")
    for finding in findings(snap):
        print(f"finding: {finding.kind} {finding.subject}: {finding.detail}")
    out = Families()
    nvml.render(snap, out)
    return render_text(out).decode(), nvlink_matrix(snap)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--metrics-url", help="check a running agent's /metrics instead")
    p.add_argument(
        "--recording",
        metavar="FILE",
        help="replay this NVML recording (scripts/nvml_record.py, made on this node just "
        "before) instead of calling NVML",
    )
    p.add_argument("--nvidia-smi", default="nvidia-smi", help="nvidia-smi binary")
    p.add_argument("--strict", action="store_true", help="MISSING fails too")
    p.add_argument("--show-metrics", action="store_true", help="print the metrics text too")
    ns = p.parse_args(argv)

    matrix: dict[tuple[int, int], int] | None = None
    if ns.metrics_url:
        with urllib.request.urlopen(ns.metrics_url, timeout=30) as resp:
            text = resp.read().decode()
    else:
        text, matrix = _in_process(ns.recording)
    if ns.show_metrics:
        print(text)
    checks: list[Check] = []
    outputs = {}
    for name, args in (
        ("q", ("-q",)),
        ("status", ("nvlink", "--status")),
        ("errors", ("nvlink", "-e")),
        ("topo", ("topo", "-m")),
    ):
        rc, out = run_smi(ns.nvidia_smi, *args)
        if rc != 0 and name != "errors":  # `nvlink -e` may be unsupported: handled below
            checks.append(Check("nvidia-smi " + " ".join(args), "node", f"rc={rc}", "-", FAIL))
            out = ""
        outputs[name] = out if rc == 0 else ""
    checks += crosscheck(
        parse_metrics(text),
        query=parse_smi_query(outputs["q"]),
        status=parse_nvlink_status(outputs["status"]),
        errors=parse_nvlink_errors(outputs["errors"]),
        topo=parse_topo_matrix(outputs["topo"]),
        matrix=matrix,
    )
    print(format_table(checks))
    failed = [c for c in checks if c.status == FAIL or (ns.strict and c.status == MISSING)]
    counts = {s: sum(1 for c in checks if c.status == s) for s in (PASS, FAIL, MISSING, SKIP)}
    print(" ".join(f"{k}={v}" for k, v in counts.items()))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
