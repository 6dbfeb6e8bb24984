"""``python -m tests.lab``: list scenarios, backfill one into a TSDB and serve it, or play a
few nodes live (agents, Prometheus with the shipped rules, Alertmanager)."""

from __future__ import annotations

import argparse
import logging
import signal
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
    sv = sub.add_parser("serve", help="serve a TSDB a backfill wrote, until interrupted")
    sv.add_argument("tsdb", type=Path, help="the directory backfill wrote (<out>/tsdb)")
    live = sub.add_parser("live", help="real agents on 127.0.0.x, Prometheus, Alertmanager")
    live.add_argument("--nodes", type=int, default=3)
    live.add_argument("--out", type=Path, required=True, help="directory for logs and data")
    live.add_argument(
        "--down",
        metavar="NODE:DEVICE",
        help="take that RDMA link DOWN after --down-after seconds (e.g. node-01:mlx5_4)",
    )
    live.add_argument("--down-after", type=float, default=20.0)
    ns = p.parse_args(argv)
    # SIGTERM stops everything as Ctrl-C does: the context managers stop Prometheus (and, live,
    # the agents and Alertmanager), which an unhandled SIGTERM would leave running
    signal.signal(signal.SIGTERM, _interrupt)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("agent").setLevel(logging.WARNING)
    if ns.command == "list":
        for s in SCENARIOS.values():
            print(f"{s.name}: {s.summary}\n    cause: {s.cause}")
        return 0
    if ns.command == "live":
        return _live(ns.nodes, ns.out, ns.down, ns.down_after)
    if ns.command == "serve":
        if not ns.tsdb.is_dir():
            p.error(f"no such directory: {ns.tsdb}")
        return _serve(ns.tsdb.name, ns.tsdb)
    tsdb = build_tsdb(SCENARIOS[ns.scenario], ns.hours, ns.step, ns.out)
    print(f"wrote {tsdb}")
    return _serve(ns.scenario, tsdb) if ns.serve else 0


def _serve(name: str, tsdb: Path) -> int:
    """A real Prometheus over ``tsdb`` until Ctrl-C or SIGTERM, which stop it too."""
    with start_prometheus(tsdb) as url:
        print(f"Prometheus serving {name} at {url} (Ctrl-C stops)", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _live(nodes: int, out: Path, down: str | None, down_after: float) -> int:
    from tests.lab.live import LiveLab

    with LiveLab(SCENARIOS["healthy"], out, nodes=nodes) as lab:
        print(f"Prometheus {lab.prometheus.url}, Alertmanager {lab.alertmanager.url}")
        print(f"webhook {lab.webhook.url}; agents: " + ", ".join(a.target for a in lab.agents))
        started = time.monotonic()
        seen = 0
        try:
            while True:
                time.sleep(1)
                lab.check()
                if down and time.monotonic() - started >= down_after:
                    node, _, device = down.partition(":")
                    lab.take_down(node, device)
                    print(f"{node} {device}: link DOWN")
                    down = None
                alerts = lab.webhook.alerts()
                for a in alerts[seen:]:
                    print(f"webhook: {a.get('status')} {a.get('labels')}")
                seen = len(alerts)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
