"""The documentation's shape: the README is a front door (short, the two commands first) and
the detail lives in docs/ by task."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
TWO_COMMANDS = ("bash scripts/run.sh", "bash scripts/test.sh")
PAGES = (
    "install.md",
    "alerts.md",
    "cli.md",
    "samplers.md",
    "explain.md",
    "throughput.md",
    "probe.md",
    "metrics.md",
    "performance.md",
    "development.md",
    "topology.md",
)


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: move detail into docs/"
    head = "\n".join(lines[:60])
    for command in TWO_COMMANDS:
        assert f"\n{command}\n" in f"\n{head}\n", f"{command!r} is not in the first 60 lines"


def test_the_readme_links_every_page_of_the_docs() -> None:
    text = README.read_text()
    for page in PAGES:
        assert (DOCS / page).is_file(), page
        assert f"(docs/{page})" in text, f"the README does not link docs/{page}"
    assert "(CHANGELOG.md)" in text
    assert "## Unreleased" in (ROOT / "CHANGELOG.md").read_text()
