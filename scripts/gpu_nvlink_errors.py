#!/usr/bin/env python3
"""NVLink error counters side by side on a GPU machine, for every GPU and active link: what
each NVML path answers for each counter, between two readings of ``nvidia-smi nvlink -e``
and ``nvidia-smi nvlink -ec`` (a counter only grows, so a path that reads the same counter as
nvidia-smi answers a value between its two readings)::

    python3 scripts/gpu_nvlink_errors.py [--json OUT.json]

The paths: ``nvmlDeviceGetNvLinkErrorCounter`` for replay, recovery, crc_flit, crc_data and
ecc_data (what fabricscope reads crc_data and ecc_data with); the per-link DL fields 161-163
(``NVML_FI_DEV_NVLINK_ERROR_DL_*``, scopeId = link: what it reads replay, recovery and crc_flit
with); the older per-link fields (``*_ERROR_COUNT_L<n>``, links 0-11) and the NVLink5
``NVML_FI_DEV_NVLINK_COUNT_*`` fields, which answer only on the generations that have them.
nvidia-smi's ``-e`` prints replay, recovery and CRC errors per link, ``-ec`` an ECC correction
count per lane; each is compared with every NVML counter it could be (a lane sum with
crc_data and ecc_data), and the table says which agree. Exit status 1 when a counter that
nvidia-smi's ``-e`` prints has no NVML path within its two readings on every link (the
``-ec`` lane sums are reported, not judged), 0 otherwise. Reads only.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from typing import Any

COUNTERS = ("replay", "recovery", "crc_flit", "crc_data", "ecc_data")
DL_FIELDS = {"replay": 161, "recovery": 162, "crc_flit": 163}
LEGACY_FIRST = {"crc_flit": 32, "crc_data": 39, "replay": 46, "recovery": 53}  # L0; L6 = +64
COUNT_FIELDS = {"symbol_errors": 221, "effective_errors": 219, "rcv_errors": 208}
SMI_E = re.compile(r"^\s*Link (\d+): (Replay|Recovery|CRC) Errors: (\d+)", re.M)
SMI_GPU = re.compile(r"^GPU (\d+):", re.M)
SMI_LANE = re.compile(r"Lane (\d+) ECC Correction Count: (\d+)")
MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def smi(args: list[str]) -> str:
    return subprocess.run(
        ["nvidia-smi", "nvlink", *args], capture_output=True, text=True, timeout=120, check=False
    ).stdout


def parse_e(text: str) -> dict[tuple[int, int, str], int]:
    """``nvidia-smi nvlink -e``: (gpu, link, replay|recovery|crc) -> count."""
    out: dict[tuple[int, int, str], int] = {}
    parts = SMI_GPU.split(text)
    for i in range(1, len(parts) - 1, 2):
        gpu = int(parts[i])
        for m in SMI_E.finditer(parts[i + 1]):
            out[(gpu, int(m.group(1)), m.group(2).lower())] = int(m.group(3))
    return out


def parse_ec(text: str) -> dict[tuple[int, int], int]:
    """``nvidia-smi nvlink -ec``: (gpu, link) -> the sum of its lanes' ECC correction counts."""
    out: dict[tuple[int, int], int] = {}
    parts = SMI_GPU.split(text)
    for i in range(1, len(parts) - 1, 2):
        gpu = int(parts[i])
        chunks = re.split(r"^\s*Link (\d+):\s*$", parts[i + 1], flags=re.M)
        for j in range(1, len(chunks) - 1, 2):
            lanes = [int(c) for _, c in SMI_LANE.findall(chunks[j + 1])]
            if lanes:
                out[(gpu, int(chunks[j]))] = sum(lanes)
    return out


def nvml_side(n: Any) -> dict[str, Any]:
    """Every path for every counter of every active link: {"gpu/link/counter/path": value or
    "NAME" of the error}."""
    out: dict[str, Any] = {}

    def field(h: Any, fid: int, scope: int) -> Any:
        try:
            v = n.nvmlDeviceGetFieldValues(h, [(fid, scope)])[0]
        except n.NVMLError as exc:
            return f"call:{exc}"
        if int(v.nvmlReturn) != 0:
            return f"ret:{int(v.nvmlReturn)}"
        return getattr(v.value, MEMBER.get(int(v.valueType), "ullVal"))

    for g in range(n.nvmlDeviceGetCount()):
        h = n.nvmlDeviceGetHandleByIndex(g)
        for link in range(18):
            try:
                if n.nvmlDeviceGetNvLinkState(h, link) != 1:
                    continue
            except n.NVMLError:
                continue
            for c, name in enumerate(COUNTERS):
                try:
                    out[f"{g}/{link}/{name}/call"] = int(
                        n.nvmlDeviceGetNvLinkErrorCounter(h, link, c)
                    )
                except n.NVMLError as exc:
                    out[f"{g}/{link}/{name}/call"] = f"call:{exc}"
                if name in DL_FIELDS:
                    out[f"{g}/{link}/{name}/dl_field"] = field(h, DL_FIELDS[name], link)
                if name in LEGACY_FIRST and link < 12:
                    fid = LEGACY_FIRST[name] + (link if link < 6 else 64 + link - 6)
                    out[f"{g}/{link}/{name}/legacy_field"] = field(h, fid, 0)
            for name, fid in COUNT_FIELDS.items():
                out[f"{g}/{link}/{name}/count_field"] = field(h, fid, link)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--json", help="write every reading here")
    ns = ap.parse_args()
    import pynvml as n

    e0, ec0 = parse_e(smi(["-e"])), parse_ec(smi(["-ec"]))
    n.nvmlInit()
    try:
        side = nvml_side(n)
        driver = n.nvmlSystemGetDriverVersion()
    finally:
        n.nvmlShutdown()
    e1, ec1 = parse_e(smi(["-e"])), parse_ec(smi(["-ec"]))
    rows: list[dict[str, Any]] = []
    smi_names = {"replay": "replay", "recovery": "recovery", "crc": "crc_flit"}
    for (g, link, what), before in sorted(e0.items()):
        after = e1.get((g, link, what), before)
        rows.append(_compare(side, (g, link), f"-e {what}", (before, after), (smi_names[what],)))
    for (g, link), before in sorted(ec0.items()):
        after = ec1.get((g, link), before)
        rows.append(
            _compare(side, (g, link), "-ec lanes", (before, after), ("crc_data", "ecc_data"))
        )
    # per nvidia-smi column, which NVML paths agree on every link
    summary: dict[str, dict[str, list[int]]] = {}
    for r in rows:
        for path, ok in r["agrees"].items():
            tally = summary.setdefault(r["smi"], {}).setdefault(path, [0, 0])
            tally[0 if ok else 1] += 1
    print(f"driver {driver}: {len(rows)} (link, nvidia-smi counter) readings")
    print(f"{'nvidia-smi':12} {'NVML path':28} {'agree':>6} {'differ':>6}")
    bad = False
    for column, paths in summary.items():
        for path, (agree, differ) in sorted(paths.items()):
            print(f"{column:12} {path:28} {agree:>6} {differ:>6}")
        if not any(d == 0 and a > 0 for a, d in paths.values()):
            # -e's three columns are what fabricscope's replay/recovery/crc_flit claim to be;
            # -ec's lane sums are compared for information (which counter NVML folds them in)
            bad |= column.startswith("-e ")
            print(
                f"{'FAIL' if column.startswith('-e ') else 'NOTE'}: no NVML path agrees "
                f"with nvidia-smi {column} on every link"
            )
    nonzero = [r for r in rows if r["after"] > 0]
    print(f"non-zero nvidia-smi counters: {len(nonzero)} of {len(rows)}")
    for r in nonzero[:12]:
        print(
            f"  gpu {r['gpu']} link {r['link']} {r['smi']}: {r['before']}..{r['after']} "
            f"nvml {r['nvml']}"
        )
    unsupported = sorted(
        {k.split("/", 3)[3] + " " + str(v) for k, v in side.items() if isinstance(v, str)}
    )
    print("NVML paths that answered an error:", ", ".join(unsupported[:20]) or "none")
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(
                {
                    "driver": driver,
                    "rows": rows,
                    "nvml": side,
                    "smi": {
                        "e_before": {str(k): v for k, v in e0.items()},
                        "ec_before": {str(k): v for k, v in ec0.items()},
                    },
                },
                f,
                indent=1,
            )
    print("FAIL" if bad else "PASS: every nvidia-smi counter has an NVML path that agrees")
    return 1 if bad else 0


def _compare(
    side: dict[str, Any],
    where: tuple[int, int],
    column: str,
    readings: tuple[int, int],
    names: tuple[str, ...],
) -> dict[str, Any]:
    """One nvidia-smi counter of one link (its readings before and after the NVML reads)
    against every NVML path of the counters it could be."""
    (g, link), (before, after) = where, readings
    got: dict[str, Any] = {}
    agrees: dict[str, bool] = {}
    for name in names:
        for path in ("call", "dl_field", "legacy_field"):
            v = side.get(f"{g}/{link}/{name}/{path}")
            if v is None:
                continue
            got[f"{name}/{path}"] = v
            agrees[f"{name}/{path}"] = isinstance(v, int) and before <= v <= after
    return {
        "gpu": g,
        "link": link,
        "smi": column,
        "before": before,
        "after": after,
        "nvml": got,
        "agrees": agrees,
    }


if __name__ == "__main__":
    sys.exit(main())
