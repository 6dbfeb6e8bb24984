"""Docs that cannot drift: each test reads the docs and the thing they describe, and fails
when the two part.

- every alert in deploy/rules has a row and a runbook in docs/alerts.md, and its
  ``runbook_url`` anchor exists there;
- every flag of every command's ``--help`` is in docs/cli.md's table for that command, and
  every flag the tables name is in that ``--help``; every dotted flag the docs mention
  anywhere is a flag of some command;
- every figure in docs/performance.md sits under a **Measured** line naming its command (a
  script that exists), machine and date; the README's cost table quotes only figures of the
  page it links; the number of explain checks the docs give is the code's;
- no reference to internal work items (issue N, #N) or to files outside the repository,
  and every repository path the docs name exists;
- every relative link resolves, files and ``#anchors`` alike (GitHub's slug rules).

The series counts the docs quote are compared with the file bench/series_budget.py writes
in tests/test_series_budget.py, which runs that script anyway.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from exporter.cli.main import build_parser
from exporter.explain.checks import CHECKS

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
ALERTS_DOC = DOCS / "alerts.md"
CLI_DOC = DOCS / "cli.md"
PERFORMANCE = DOCS / "performance.md"
RUNBOOKS = "https://github.com/fabricscope/fabricscope/blob/main/docs/alerts.md"

#: the pages users read; every check below runs over all of them
PAGES = (
    README,
    ROOT / "CHANGELOG.md",
    ROOT / "dashboards" / "README.md",
    *sorted(DOCS.glob("*.md")),
)
#: text users meet outside the pages: the rule files (annotations and comments), the chart
TEXTS = (
    *PAGES,
    *sorted((ROOT / "deploy" / "rules").glob("*.yaml")),
    *sorted((ROOT / "deploy" / "helm" / "fabricscope").glob("*.yaml")),
    *sorted((ROOT / "deploy" / "helm" / "fabricscope" / "templates").glob("*")),
)
#: the top-level directories a repository path in the docs starts with
TOP = ("agent", "exporter", "tests", "bench", "scripts", "deploy", "dashboards", "docs", ".ci")
#: paths that no longer exist and may be named only where the docs say they are gone:
#: the kustomize tree the Helm chart replaced (docs/install.md, From the kustomize manifests)
#: and the page docs/install.md was (CHANGELOG.md)
GONE = {
    "deploy/base": ("docs/install.md",),
    "docs/deploy.md": ("CHANGELOG.md",),
}


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def prose(text: str) -> str:
    """The text without fenced code blocks (command output, YAML, PromQL)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


# --- GitHub's anchors ----------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text (links and code marks dropped), lower
    case, every character but letters, digits, ``_``, ``-`` and spaces dropped, spaces to
    ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every anchor of a page: a heading's slug, then ``-1``, ``-2`` ... for repeats."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose(markdown).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def test_slugs_follow_githubs_rules() -> None:
    assert (
        slug("Why is my job slow? `fabricscope explain`")
        == "why-is-my-job-slow-fabricscope-explain"
    )
    assert slug("NCCL, from the job's own log") == "nccl-from-the-jobs-own-log"
    assert slug("Serving /metrics") == "serving-metrics"
    assert slug("FabricscopeAgentDown") == "fabricscopeagentdown"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n### B c\n") == {"a", "a-1", "b-c"}


# --- alerts --------------------------------------------------------------------------------


def shipped_alerts() -> dict[str, str]:
    """Alert name -> its runbook_url, from every rule file."""
    out = {}
    for path in sorted((ROOT / "deploy" / "rules").glob("*.yaml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    out[rule["alert"]] = rule["annotations"]["runbook_url"]
    return out


def test_every_alert_has_a_row_and_a_runbook_in_alerts_md() -> None:
    alerts = shipped_alerts()
    assert len(alerts) > 30
    text = ALERTS_DOC.read_text()
    rows = set(re.findall(r"^\| \[(Fabricscope\w+)\]\(#(\w+)\) \|", text, re.M))
    assert {name for name, _ in rows} == set(alerts), (
        "docs/alerts.md's table and deploy/rules differ: "
        f"undocumented {sorted(set(alerts) - {n for n, _ in rows})}, "
        f"not shipped {sorted({n for n, _ in rows} - set(alerts))}"
    )
    have = anchors(text)
    for name, url in sorted(alerts.items()):
        base, _, anchor = url.partition("#")
        assert base == RUNBOOKS, f"{name}: runbook_url {url} is not in docs/alerts.md"
        assert anchor in have, f"{name}: docs/alerts.md has no heading for #{anchor}"
    assert all(anchor in have for _, anchor in rows)


# --- flags ---------------------------------------------------------------------------------

#: flags the docs spell wrong on purpose, to show what fabricscope answers
MISSPELT_ON_PURPOSE = {"--path.sys"}


def commands() -> dict[str, argparse.ArgumentParser]:
    """Every command line of fabricscope and its parser, as ``--help`` prints them."""
    from agent.probe.schedule.plan import _parser as plan_parser

    top = build_parser()
    out: dict[str, argparse.ArgumentParser] = {"fabricscope": top}
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, parser in action.choices.items():
                out[f"fabricscope {name}"] = parser
    out["fabricscope probe plan"] = plan_parser()
    return out


def help_flags(parser: argparse.ArgumentParser, top: bool) -> tuple[set[str], set[str]]:
    """(every option string ``--help`` shows, the ones that must be documented): each
    option's first long form (``--x``, not ``--no-x``); ``--help`` itself only for the top."""
    shown: set[str] = set()
    required: set[str] = set()
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or not action.option_strings:
            continue
        shown.update(action.option_strings)
        if isinstance(action, argparse._HelpAction) and not top:
            continue
        required.add(next(s for s in action.option_strings if s.startswith("--")))
    return shown, required


def cli_sections() -> dict[str, str]:
    """docs/cli.md's section per command (``## fabricscope agent`` ...)."""
    parts = re.split(r"^## (fabricscope(?: [a-z][a-z-]*)*)\s*$", CLI_DOC.read_text(), flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def table_flags(section: str) -> set[str]:
    """The flags a section's tables document: those in the first cell of each row."""
    out: set[str] = set()
    for line in section.splitlines():
        m = re.match(r"^\| ([^|]*) \|", line)
        if m:
            for code in re.findall(r"`([^`]*)`", m.group(1)):
                out.update(re.findall(r"(?<![\w-])(--?[a-z][\w.-]*)", code))
    return out


@pytest.mark.parametrize("command", sorted(commands()))
def test_every_flag_of_help_is_documented_and_every_documented_flag_exists(
    command: str,
) -> None:
    shown, required = help_flags(commands()[command], command == "fabricscope")
    sections = cli_sections()
    assert command in sections, f"docs/cli.md has no section '## {command}'"
    documented = table_flags(sections[command])
    missing = sorted(required - documented)
    assert not missing, f"docs/cli.md (## {command}) does not document {missing}"
    unknown = sorted(documented - shown)
    assert not unknown, f"docs/cli.md (## {command}) documents {unknown}: not in its --help"


def test_cli_md_has_a_section_for_every_command_and_no_other() -> None:
    assert set(cli_sections()) == set(commands())


def test_every_dotted_flag_the_docs_mention_is_a_flag() -> None:
    """Dotted flags (``--probe.peers-file``) are fabricscope's own: one the docs mention
    that no command has is a flag that was renamed or removed."""
    flags = {s for p in commands().values() for a in p._actions for s in a.option_strings}
    flags |= MISSPELT_ON_PURPOSE
    stale = []
    for page in PAGES:
        for m in re.finditer(
            r"(?<![\w-])--(?:no-)?[a-z][a-z-]*\.[a-z][\w.-]*[a-z]", page.read_text()
        ):
            if m.group(0) not in flags:
                stale.append(f"{rel(page)}: {m.group(0)}")
    assert not stale, stale


# --- figures -------------------------------------------------------------------------------

DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
MACHINE = re.compile(r"development\s+machine|\blent\b|CI\s+machine|any\s+machine")
SCRIPT = re.compile(r"\b((?:bench|scripts)/[\w./-]+\.(?:py|sh))\b")


def sections(text: str, level: int = 2) -> Iterator[tuple[str, str]]:
    parts = re.split(rf"^{'#' * level} (.+)$", text, flags=re.M)
    for i in range(1, len(parts), 2):
        yield parts[i].strip(), parts[i + 1]


def measured_lines(section: str) -> list[str]:
    """The **Measured** paragraphs of a section."""
    return [p for p in re.split(r"\n\s*\n", section) if p.lstrip().startswith("**Measured**")]


def measured_problems(section: str) -> list[str]:
    """What a section's **Measured** lines lack, and tables that come before any."""
    problems = []
    seen = False
    for para in re.split(r"\n\s*\n", section):
        if para.lstrip().startswith("**Measured**"):
            seen = True
            if not DATE.search(para):
                problems.append(f"no date: {para[:60]!r}")
            if not MACHINE.search(para):
                problems.append(f"no machine: {para[:60]!r}")
            scripts = SCRIPT.findall(para)
            if not scripts and "by hand" not in para:
                problems.append(f"no command: {para[:60]!r}")
            problems += [f"{s} does not exist" for s in scripts if not (ROOT / s).is_file()]
        elif "| --- |" in para and not seen:
            problems.append(f"a table before any **Measured** line: {para[:60]!r}")
    return problems


def test_every_benchmark_section_says_command_machine_and_date() -> None:
    text = PERFORMANCE.read_text()
    problems = []
    for title, body in sections(text):
        if re.search(r"\d", prose(body)) and not measured_lines(body):
            problems.append(f"## {title}: figures and no **Measured** line")
        problems += [f"## {title}: {p}" for p in measured_problems(body)]
    assert not problems, problems


def section_text(page: Path, anchor: str) -> str:
    """The text of the section of ``page`` whose heading has ``anchor``, subsections in."""
    lines = page.read_text().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(#{1,6})\s+(.*?)\s*$", line)
        if m and slug(m.group(2)) == anchor:
            level = len(m.group(1))
            end = next(
                (
                    j
                    for j in range(i + 1, len(lines))
                    if (h := re.match(r"^(#{1,6})\s", lines[j])) and len(h.group(1)) <= level
                ),
                len(lines),
            )
            return "\n".join(lines[i:end])
    raise AssertionError(f"{rel(page)} has no section #{anchor}")


def numbers(text: str) -> list[str]:
    return [n.replace(",", "") for n in re.findall(r"\d[\d,]*(?:\.\d+)?", text)]


def test_the_readmes_cost_table_quotes_the_pages_it_links() -> None:
    text = README.read_text()
    section = text[text.index("## What it costs") :].split("\n## ", 1)[0]
    table = section[section.index("\n| ") :].split("\n\n", 1)[0]  # its first table
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert len(rows) >= 5
    for row in rows:
        what, cost, measured = (c.strip() for c in row.strip("|").split(" | "))
        link = re.search(r"\]\((docs/[\w.]+)#([\w-]+)\)", measured)
        assert link, f"README cost row {what!r} links no section"
        source = section_text(ROOT / link.group(1), link.group(2))
        have = set(numbers(source))
        for n in numbers(cost):
            assert n in have, f"README cost row {what!r}: {n} is not in {link.group(0)}"
        assert DATE.search(measured) or "every CI run" in measured, row


def test_the_number_of_explain_checks_is_the_codes() -> None:
    text = (DOCS / "explain.md").read_text()
    said = re.findall(r"runs (\d+) now|\*\*What changed\*\*: (\d+) checks", text)
    assert said, "docs/explain.md no longer says how many checks explain runs"
    for now, listed in said:
        assert int(now or listed) == len(CHECKS), (
            f"docs/explain.md says {now or listed} checks; exporter/explain/checks/ has "
            f"{len(CHECKS)}"
        )


# --- references ----------------------------------------------------------------------------

INTERNAL = (
    re.compile(r"\bissues? #?\d+", re.I),
    re.compile(r"\bPRs? #?\d+"),
    # a bare #N; an external one is owner/repo#N or project#N, or a link
    re.compile(r"(?<![\w/.\[-])#\d+\b"),
)
OUTSIDE = re.compile(r"ANCHORS\.md|ENVIRONMENT\.md|CONTRACT\.md|/work/|(?<![\w.-])shared/")


def internal_references(text: str) -> list[str]:
    text = re.sub(r"\[[^\]]*\]\(https?://[^)]*\)", "", text)  # links to other projects
    found = [m.group(0) for pat in INTERNAL for m in pat.finditer(text)]
    return found + [m.group(0) for m in OUTSIDE.finditer(text)]


def test_the_reference_check_tells_internal_from_external() -> None:
    assert internal_references("since issue 19, see #12 and ANCHORS.md") == [
        "issue 19",
        "#12",
        "ANCHORS.md",
    ]
    assert (
        internal_references(
            "nccl#1814, [NVIDIA/dcgm-exporter#228](https://github.com/x), `#fff`, (#anchor)"
        )
        == []
    )


def test_no_internal_work_items_or_files_outside_the_repository() -> None:
    found = [f"{rel(p)}: {ref}" for p in TEXTS for ref in internal_references(p.read_text())]
    for command, parser in commands().items():
        found += [f"{command} --help: {ref}" for ref in internal_references(parser.format_help())]
    assert not found, found


def repository_paths(text: str) -> Iterator[str]:
    top = "|".join(re.escape(t) for t in TOP)
    for m in re.finditer(rf"(?<![\w./-])((?:{top})/[\w./-]*[\w/])", text):
        if not any(c in m.group(1) for c in "*<>{}"):
            yield m.group(1).rstrip("/")


def test_every_repository_path_the_docs_name_exists() -> None:
    missing = []
    for page in TEXTS:
        for path in repository_paths(page.read_text()):
            if (ROOT / path).exists() or (page.parent / path).exists():
                continue
            if rel(page) in GONE.get(path, ()):
                continue
            missing.append(f"{rel(page)}: {path}")
    assert not missing, missing


def test_every_test_the_docs_name_is_a_test_of_that_file() -> None:
    """``tests/x.py::test_name`` in the docs (the security tables' "shown by" column) names
    a test function of that file, parametrised or not (``test_name_*``: at least one whose
    name starts so): a renamed test leaves no claim pointing at nothing."""
    missing = []
    for page in TEXTS:
        for path, name, star in re.findall(r"`(tests/[\w/]+\.py)::(\w+)(\*?)", page.read_text()):
            source = ROOT / path
            tail = r"\w*" if star else ""
            if not source.exists() or not re.search(
                rf"^def {name}{tail}\(", source.read_text(), re.MULTILINE
            ):
                missing.append(f"{rel(page)}: {path}::{name}{star}")
    assert not missing, missing


# --- links ---------------------------------------------------------------------------------


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in PAGES:
        for m in re.finditer(r"\]\(([^)\s]+)\)", prose(page.read_text())):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.is_relative_to(ROOT):
                broken.append(f"{rel(page)}: {target} leaves the repository")
            elif not dest.exists():
                broken.append(f"{rel(page)}: {target} does not exist")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
                broken.append(f"{rel(page)}: {target} has no such heading")
    assert not broken, broken


def test_the_readme_shows_the_fleet_alert_budget_as_measured() -> None:
    """The README's two alert-budget tables are bench/alert_noise.py's, row for row."""
    measured = (ROOT / "bench" / "results" / "alert_noise.md").read_text()
    rows = [ln for ln in measured.splitlines() if ln.startswith("| ") and "---" not in ln]
    assert len(rows) >= 6, "bench/results/alert_noise.md lost its tables"
    readme = README.read_text()
    missing = [r for r in rows if r not in readme.splitlines()]
    assert not missing, "README.md differs from bench/results/alert_noise.md: " + str(missing)
