"""``python -m tests.lab``: list scenarios, backfill one into a TSDB, serve it."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from tests.lab.backfill import build_tsdb, start_prometheus
from tests.lab.scenarios import SCENARIOS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.lab", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the scenarios and their planted causes")
    b = sub.add_parser("backfill", help="play a scenario with the real agent into a TSDB")
    b.add_argument("scenario", choices=sorted(SCENARIOS))
    b.add_argument("--hours", type=float, default=3.0)
    b.add_argument("--step", type=float, default=60.0, help="seconds between samples")
    b.add_argument("--out", type=Path, required=True, help="directory for the TSDB")
    b.add_argument("--serve", action="store_true", help="then serve it until interrupted")
    ns = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("agent").setLevel(logging.WARNING)
    if ns.command == "list":
        for s in SCENARIOS.values():
            print(f"{s.name}: {s.summary}\n    cause: {s.cause}")
        return 0
    tsdb = build_tsdb(SCENARIOS[ns.scenario], ns.hours, ns.step, ns.out)
    print(f"wrote {tsdb}")
    if ns.serve:
        with start_prometheus(tsdb) as url:
            print(f"Prometheus serving {ns.scenario} at {url} (Ctrl-C stops)")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
