"""Where Prometheus's work for one explain answer goes: explain's last run in Prometheus's
own query log (``global.query_log_file``, which ``bench_explain.py --query-log`` turns on),
its samples read (``stats.samples.totalQueryableSamples``, as Prometheus counts them) summed
by source (``infiniband``, ``pci`` ...), by metric family and by the range function that
reads them. Samples read is what a query
costs the server whatever else runs on the machine; the logged evaluation times are given
beside them but ran 8 at a time on a shared CPU.

    python bench/bench_explain.py --nodes 1024 --hours 1 --runs 1 --workdir W --query-log Q
    python bench/explain_samples.py --query-log Q [--json FILE] [--top 12]

A family is the first ``fabricscope_*`` name a query selects (a query joining an info
series to a counter is the counter's); a function, the range functions the query applies
(``rate``, ``avg_over_time`` ...; none for an instant selector). Lines of the log that are
not a query entry (a line cut short when Prometheus stopped) are passed over and counted.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.explain_query_shapes import last_run_entries  # noqa: E402

FAMILY = re.compile(r"\bfabricscope_[a-zA-Z0-9_]+")
RANGE_FUNCTION = re.compile(
    r"\b(rate|irate|increase|delta|idelta|deriv|resets|changes|"
    r"(?:avg|min|max|sum|count|last|present|stddev|quantile)_over_time)\s*\("
)


def _samples(entry: dict[str, Any]) -> int:
    try:
        return int(entry["stats"]["samples"]["totalQueryableSamples"])
    except (KeyError, TypeError, ValueError):
        return 0  # a Prometheus that does not log per-query samples


def _seconds(entry: dict[str, Any]) -> float:
    try:
        return float(entry["stats"]["timings"]["evalTotalTime"])
    except (KeyError, TypeError, ValueError):
        return 0.0


def summarise(entries: list[dict[str, Any]], top: int = 12) -> dict[str, Any]:
    """Samples and logged seconds per family and per function, largest first; the
    families past ``top`` summed as one row."""
    by_family: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0.0])
    by_source: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0.0])
    by_function: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0.0])
    total = 0
    for e in entries:
        query = str(e["params"]["query"])
        names = FAMILY.findall(query)
        family = names[0] if names else "(no fabricscope family)"
        functions = sorted(set(RANGE_FUNCTION.findall(query))) or ["(instant)"]
        n, t = _samples(e), _seconds(e)
        total += n
        source = family.split("_")[1] if names else family
        keys = ((family, by_family), (source, by_source), ("+".join(functions), by_function))
        for key, table in keys:
            row = table[key]
            row[0] += 1
            row[1] += n
            row[2] += t

    def rows(table: dict[str, list[float]], limit: int | None) -> list[dict[str, Any]]:
        ordered = sorted(table.items(), key=lambda kv: (-kv[1][1], kv[0]))
        kept, rest = (ordered, []) if limit is None else (ordered[:limit], ordered[limit:])
        out = [
            {
                "name": k,
                "queries": int(v[0]),
                "samples": int(v[1]),
                "share": v[1] / total if total else 0.0,
                "eval_seconds_logged": round(v[2], 3),
            }
            for k, v in kept
        ]
        if rest:
            q, n, t = (sum(v[i] for _, v in rest) for i in range(3))
            out.append(
                {
                    "name": f"({len(rest)} more families)",
                    "queries": int(q),
                    "samples": int(n),
                    "share": n / total if total else 0.0,
                    "eval_seconds_logged": round(t, 3),
                }
            )
        return out

    return {
        "queries": len(entries),
        "samples": total,
        "by_source": rows(by_source, None),
        "by_family": rows(by_family, top),
        "by_function": rows(by_function, None),
    }


def markdown(summary: dict[str, Any]) -> str:
    lines = []
    titles = (("by_source", "source"), ("by_family", "family"), ("by_function", "range function"))
    for key, title in titles:
        lines += [
            f"| {title} | queries | samples read | share |",
            "| --- | ---: | ---: | ---: |",
        ]
        lines += [
            f"| `{r['name']}` | {r['queries']} | {r['samples']:,} | {r['share']:.1%} |"
            for r in summary[key]
        ]
        lines.append("")
    lines.append(f"{summary['queries']} queries, {summary['samples']:,} samples read in all.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--query-log", type=Path, required=True)
    ap.add_argument("--top", type=int, default=12, help="families listed before the rest")
    ap.add_argument("--json", type=Path, default=None)
    ns = ap.parse_args(argv)
    try:
        entries, bad = last_run_entries(ns.query_log)
    except OSError as exc:
        print(f"explain_samples: cannot read {ns.query_log}: {exc.strerror}", file=sys.stderr)
        return 2
    summary = summarise(entries, ns.top)
    summary["lines_passed_over"] = bad
    summary["query_log"] = str(ns.query_log)
    print(markdown(summary))
    if bad:
        print(f"{bad} lines of the log were not a query entry and were passed over")
    if ns.json is not None:
        ns.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
