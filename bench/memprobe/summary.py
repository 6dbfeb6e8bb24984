"""The memory probe's dumps (``bench/soak.py --probe DIR``) summed up, one JSON file: per
process and dump, RSS, pymalloc's arenas and live block bytes, malloc's bytes in use and
free, live container objects and (where traced) tracemalloc's bytes; and the agent's own
source lines that changed most between the first traced snapshot and the last (the probe's
and tracemalloc's own lines left out).

    python bench/memprobe/summary.py DIR [DIR ...] --json OUT
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def role(row: dict[str, Any]) -> str:
    """Which process dumped ``row``: the main process has arguments; a child is known by
    what it mapped (RE2: only the throughput child loads it); the other child is the NVML one."""
    if len(row["argv"]) > 1:
        return "main"
    if "re2" in " ".join(row["smaps_kib"]):
        return "throughput child"
    return "nvml child"  # the soak's only other child; its stand-in library maps under 64 KiB


def summarise(directory: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in sorted(directory.glob("*.jsonl")):
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        if not rows:
            continue
        dumps = []
        for r in rows:
            py = r.get("pymalloc") or {}
            mi = r.get("mallinfo") or {}
            dumps.append(
                {
                    "t": r["t"],
                    "rss_kib": sum(v[0] for v in r["smaps_kib"].values()),
                    "pymalloc_arenas": py.get("arenas allocated current"),
                    "pymalloc_block_kib": (
                        py["bytes in allocated blocks"] // 1024
                        if "bytes in allocated blocks" in py
                        else None
                    ),
                    "malloc_used_kib": mi.get("uordblks", 0) // 1024,
                    "malloc_free_kib": mi.get("fordblks", 0) // 1024,
                    "gc_objects": r["gc_objects"],
                    "traced_kib": None if r.get("traced") is None else r["traced"] // 1024,
                    "trimmed_kib": r.get("trimmed_kib"),
                }
            )
        top = [
            t
            for t in rows[-1].get("top", [])
            if "tracemalloc" not in t[0] and "memprobe" not in t[0]
        ][:10]
        out[f.stem] = {
            "role": role(rows[-1]),
            "threads": rows[-1]["threads"],
            "dumps": dumps,
            "top_growth": top,
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", type=Path, nargs="+")
    ap.add_argument("--json", type=Path, required=True)
    ns = ap.parse_args()
    result = {str(d.name): summarise(d) for d in ns.dirs}
    ns.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
