"""Copies the alert rules and the dashboards into the Helm chart, which ships them.

Helm reads only files inside the chart directory (``.Files.Get``; it does not follow a
symlink out of it), so the chart holds copies:

    deploy/rules/*.rules.yaml  ->  deploy/helm/fabricscope/files/rules/
    dashboards/*.json          ->  deploy/helm/fabricscope/files/dashboards/

The sources stay where they are edited and tested (promtool, dashboards/generate.py); the
copies are generated, never edited. ``tests/deploy/test_helm.py`` fails when they differ.

    python3 scripts/sync_chart.py          # write the copies
    python3 scripts/sync_chart.py --check  # exit 1 and name each stale copy
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "fabricscope"

#: (source directory, glob, destination directory inside the chart)
COPIES = (
    (ROOT / "deploy" / "rules", "*.rules.yaml", CHART / "files" / "rules"),
    (ROOT / "dashboards", "*.json", CHART / "files" / "dashboards"),
)


def expected() -> dict[Path, bytes]:
    """Every file the chart's files/ should hold, with its content."""
    out: dict[Path, bytes] = {}
    for src, pattern, dst in COPIES:
        for path in sorted(src.glob(pattern)):
            out[dst / path.name] = path.read_bytes()
    return out


def stale() -> list[str]:
    """Copies that are missing, differ from their source, or have no source any more."""
    want = expected()
    problems = [
        f"{p.relative_to(ROOT)}: missing or differs from its source"
        for p, data in want.items()
        if not p.is_file() or p.read_bytes() != data
    ]
    for _, pattern, dst in COPIES:
        problems += [
            f"{p.relative_to(ROOT)}: no source any more"
            for p in sorted(dst.glob(pattern))
            if p not in want
        ]
    return problems


def sync() -> None:
    want = expected()
    for _, pattern, dst in COPIES:
        dst.mkdir(parents=True, exist_ok=True)
        for p in dst.glob(pattern):
            if p not in want:
                p.unlink()
    for path, data in want.items():
        if not path.is_file() or path.read_bytes() != data:
            path.write_bytes(data)


def main(argv: list[str]) -> int:
    if argv == ["--check"]:
        problems = stale()
        for line in problems:
            print(line, file=sys.stderr)
        if problems:
            print("regenerate: python3 scripts/sync_chart.py", file=sys.stderr)
        return 1 if problems else 0
    if argv:
        print("usage: sync_chart.py [--check]", file=sys.stderr)
        return 2
    sync()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
