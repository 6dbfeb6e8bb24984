"""Generates fabricscope's Grafana dashboards (``dashboards/*.json``) and their ConfigMap
with grafana-foundation-sdk, from the panel tables in ``dashboards/boards/``.

    python dashboards/generate.py            # rewrite dashboards/*.json
    python dashboards/generate.py --check    # exit 1 if a committed file differs

Each panel is a :class:`Panel` row (``boards/model.py``): title, kind, PromQL targets,
unit, and ``shows``: the planted cause kinds (``tests/lab/scenarios.py``) whose faulty
node/port/GPU this panel must put first, and by which labels. One module per dashboard
(``boards/fleet.py``, ``node.py``, ``job.py``, ``probe.py``); ``builder.py`` turns a table
into JSON. ``tests/deploy/test_dashboards.py`` runs every target against a real Prometheus holding
each backfilled lab scenario and checks exactly that.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from boards import BOARDS, FLEET, JOB, NODE_BOARD, PROBE
from boards.model import Board, Panel, Show
from builder import build, render

HERE = Path(__file__).resolve().parent

__all__ = [
    "BOARDS",
    "FLEET",
    "JOB",
    "NODE_BOARD",
    "PROBE",
    "Board",
    "Panel",
    "Show",
    "build",
    "outputs",
    "path_of",
    "render",
]


def path_of(board: Board) -> Path:
    return HERE / f"{board.uid.removeprefix('fabricscope-')}.json"


def outputs() -> dict[Path, str]:
    # the Helm chart ships them as ConfigMaps for the Grafana sidecar, from copies that
    # scripts/sync_chart.py makes (tests/deploy/test_helm.py checks them)
    return {path_of(board): render(board) for board in BOARDS}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for path, text in outputs().items():
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}; run python dashboards/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
