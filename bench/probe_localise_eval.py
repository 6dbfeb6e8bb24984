"""The shipped probe localisation rules evaluated by a real Prometheus on the scrapes of a live
run (``scripts/gpu_probe_localise.sh`` on a GPU machine):

    python bench/probe_localise_eval.py SCRAPES_DIR [--json OUT.json]

``SCRAPES_DIR`` holds one ``<node>.txt`` per agent: its ``fabricscope_probe_*`` series, each
scrape after a ``# scrape <unix time>`` line. The scrapes are backfilled into a Prometheus TSDB
(``promtool tsdb create-blocks-from openmetrics``, ``instance`` = the node, as the
ServiceMonitor names instances after their nodes), a real Prometheus serves them, and the
localisation group of ``deploy/rules/probe.rules.yaml`` is evaluated at every scrape time:
Prometheus does not run recording rules over backfilled history, so each recorded series is
replaced in the later expressions by its own expression (the rules unchanged otherwise).
Prints, per scrape time, which nodes ``fabricscope:probe_bad_node:last1h`` names and which
pairs ``fabricscope:probe_pair_ok:last1h`` holds bad; the ``FabricscopeProbeBadNode`` alert
fires 5 minutes (its ``for``) after its expression first holds.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.promharness import PROMTOOL, start_prometheus  # noqa: E402

RULES = ROOT / "deploy" / "rules" / "probe.rules.yaml"
GROUP = "fabricscope-probe-localisation"
SCRAPE = re.compile(r"^# scrape (\d+(?:\.\d+)?)$")


@dataclass(frozen=True, slots=True)
class Moment:
    """What the rules said at one scrape time (seconds since the first scrape)."""

    t: float
    bad_nodes: dict[str, float]
    bad_pairs: tuple[tuple[str, str], ...]


def scrapes(directory: Path) -> Iterator[tuple[str, float, list[str]]]:
    """(node, unix time, sample lines) of every scrape of every node."""
    for path in sorted(directory.glob("*.txt")):
        node = path.stem
        ts: float | None = None
        lines: list[str] = []
        for line in path.read_text().splitlines():
            m = SCRAPE.match(line)
            if m:
                if ts is not None:
                    yield node, ts, lines
                ts, lines = float(m.group(1)), []
            elif line and not line.startswith("#"):
                lines.append(line)
        if ts is not None:
            yield node, ts, lines


def openmetrics(directory: Path) -> tuple[str, list[float]]:
    """The scrapes as OpenMetrics with ``instance``/``job`` labels, and the scrape times."""
    out: list[str] = []
    times: set[float] = set()
    for node, ts, lines in scrapes(directory):
        times.add(round(ts, 3))
        extra = f'instance="{node}",job="fabricscope"'
        for line in lines:
            series, _, value = line.rpartition(" ")
            name, brace, labels = series.partition("{")
            labels = labels.rstrip("}")
            joined = f"{extra},{labels}" if brace and labels else extra
            out.append(f"{name}{{{joined}}} {value} {ts:.3f}\n")
    out.append("# EOF\n")
    return "".join(out), sorted(times)


def expanded_rules() -> dict[str, str]:
    """The localisation group's recorded series, each as a self-contained expression."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    (group,) = [g for g in groups if g["name"] == GROUP]
    out: dict[str, str] = {}
    for rule in group["rules"]:
        if "record" not in rule:
            continue
        expr = str(rule["expr"])
        for name, body in out.items():
            expr = re.sub(rf"(?<![\w:]){re.escape(name)}(?![\w:])", f"({body})", expr)
        out[str(rule["record"])] = expr
    return out


def evaluate(directory: Path, work: Path) -> list[Moment]:
    om, times = openmetrics(directory)
    (work / "in.om").write_text(om)
    tsdb = work / "tsdb"
    result = subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(work / "in.om"), str(tsdb)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"promtool create-blocks-from failed: {result.stderr[-2000:]}")
    rules = expanded_rules()
    moments: list[Moment] = []
    with start_prometheus(work / "prom", [], tsdb_path=tsdb) as prom:
        for t in times:
            bad = prom.api(
                "query",
                {"query": rules["fabricscope:probe_bad_node:last1h"], "time": f"{t:.3f}"},
            )
            pairs = prom.api(
                "query",
                {"query": rules["fabricscope:probe_pair_ok:last1h"] + " == 0", "time": f"{t:.3f}"},
            )
            moments.append(
                Moment(
                    round(t - times[0], 1),
                    {r["metric"]["instance"]: float(r["value"][1]) for r in _result(bad)},
                    tuple(
                        sorted(
                            (r["metric"]["instance"], r["metric"]["peer"]) for r in _result(pairs)
                        )
                    ),
                )
            )
    return moments


def _result(data: object) -> list[dict[str, Any]]:
    assert isinstance(data, dict)
    result = data["result"]
    assert isinstance(result, list)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("scrapes", type=Path)
    ap.add_argument("--json")
    ns = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="localise-"))
    try:
        moments = evaluate(ns.scrapes, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    first: dict[str, float] = {}
    for m in moments:
        for node in m.bad_nodes:
            first.setdefault(node, m.t)
        print(f"{m.t:7.1f} s  bad nodes: {m.bad_nodes or '-'}  bad pairs: {len(m.bad_pairs)}")
    print("first named (s after the first scrape):", first or "none")
    if ns.json:
        Path(ns.json).write_text(
            json.dumps(
                [{"t": m.t, "bad_nodes": m.bad_nodes, "bad_pairs": m.bad_pairs} for m in moments],
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
