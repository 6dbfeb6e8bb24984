"""Import direction: agent/ knows nothing about Prometheus or the exporter."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN_IN_AGENT = ("exporter", "prometheus_client")


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def test_agent_never_imports_exporter_or_prometheus_client() -> None:
    offenders = []
    files = sorted((ROOT / "agent").rglob("*.py"))
    assert len(files) > 5
    for f in files:
        for mod in imported_modules(f):
            if mod.split(".")[0] in FORBIDDEN_IN_AGENT:
                offenders.append(f"{f.relative_to(ROOT)} imports {mod}")
    assert offenders == []


def test_the_checker_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from exporter.spec import Families\nimport prometheus_client\n")
    assert {"exporter.spec", "prometheus_client"} <= imported_modules(bad)
