"""Import direction: agent/ knows nothing about Prometheus or the exporter; each source
imports only the shared machinery and its declared joins; the probe's parts import downwards."""

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
    bad.write_text("from exporter.metrics.spec import Families\nimport prometheus_client\n")
    assert {"exporter.metrics.spec", "prometheus_client"} <= imported_modules(bad)


#: the agent's source packages, one per source of data; each may import the shared
#: machinery (agent.core), the settings (agent.config: frozen dataclasses, a leaf that imports
#: nothing of the agent) and the joins declared here, and no other source
SOURCES = (
    "infiniband",
    "ibpeer",
    "pci",
    "netdev",
    "nvml",
    "throughput",
    "workload",
    "kubernetes",
    "probe",
    "ras",
    "cdi",
)
DECLARED_JOINS = {
    # the far end's counters carry the local counters' names, widths and units (PortCounter)
    "ibpeer": {"infiniband"},
    # RDMA devices and GPU UUIDs are what pods are attributed by; CDI specs and the NVIDIA
    # driver's minors are what a ResourceClaim's devices are resolved through
    "kubernetes": {"infiniband", "nvml", "cdi"},
    # processes' NUMA placement against their GPUs' and NICs', attributed to pods
    "workload": {"pci", "nvml", "kubernetes"},
    # the pods whose logs are read come from the pod watch
    "throughput": {"kubernetes"},
    # the probe's peers (agent pods) and its busy-GPU checks (NVML)
    "probe": {"kubernetes", "nvml"},
    # a job's RAS endpoint from its GPU processes' environment, namespace and pod (workload),
    # its job name, host network and pod IP (the pod watch)
    "ras": {"workload", "kubernetes"},
}
#: agent.core is the bottom floor: no agent module above it
CORE_MAY_IMPORT = {"agent.core"}
#: exporter packages and what of the exporter each may import (besides itself)
EXPORTER_MAY_IMPORT = {
    "metrics": set(),
    "http": {"metrics"},
    # the metric catalog: which PMA counter feeds which metric (blind evidence)
    "explain": {"metrics"},
    # the Prometheus client (exporter.explain.client); the controller's metric specs
    "topology": {"explain", "metrics"},
}


def _owner(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def _module_of(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def offending_imports(module: str, imports: set[str]) -> list[str]:
    """The imports of ``module`` that run against the layering above."""
    here = _owner(module)
    top, _, pkg = here.partition(".")
    bad = []
    for mod in sorted(imports):
        there = _owner(mod)
        if there == here or mod.split(".")[0] not in ("agent", "exporter"):
            continue
        other = there.partition(".")[2]
        if top == "agent" and pkg == "core":
            ok = there in CORE_MAY_IMPORT
        elif top == "agent" and pkg in SOURCES:
            ok = there in ("agent.core", "agent.config") or (
                mod.startswith("agent.") and other in DECLARED_JOINS.get(pkg, set())
            )
        elif top == "exporter" and pkg in EXPORTER_MAY_IMPORT:
            ok = mod.startswith("agent") or other in EXPORTER_MAY_IMPORT[pkg]
        else:
            continue  # the composition (agent/*.py, exporter/app.py, exporter/cli/)
        if not ok:
            bad.append(mod)
    return bad


def layering_offenders() -> list[str]:
    files = sorted((ROOT / "agent").rglob("*.py")) + sorted((ROOT / "exporter").rglob("*.py"))
    return [
        f"{f.relative_to(ROOT)} imports {mod}"
        for f in files
        for mod in offending_imports(_module_of(f), imported_modules(f))
    ]


def test_sources_import_only_the_shared_machinery_and_declared_joins() -> None:
    assert layering_offenders() == []


def test_every_source_is_a_package_that_says_what_it_may_import() -> None:
    for name in (*SOURCES, "core"):
        init = ROOT / "agent" / name / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and "May import" in doc, init
    for name in (*EXPORTER_MAY_IMPORT, "cli"):
        init = ROOT / "exporter" / name / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), init


#: the probe's sub-packages, one per job, and the other parts of the probe each may import
#: (agent/probe/sampler.py, the composition, may import them all); imports run downwards
PROBE_PARTS: dict[str, set[str]] = {
    "measure": set(),
    "rendezvous": set(),
    "schedule": set(),
    "render": set(),
    "run": {"measure", "rendezvous", "schedule"},
}
#: what of the agent outside the probe each part may import (``agent.core`` for all but
#: render, which imports nothing of the agent)
PROBE_PART_OUTSIDE: dict[str, set[str]] = {
    "measure": {"agent.core"},
    "rendezvous": {"agent.core"},
    "schedule": {"agent.core", "agent.config", "agent.kubernetes"},
    "render": set(),
    # the GPUs pods hold (agent.kubernetes.allocation: a record and its reasons, no client)
    "run": {"agent.core", "agent.config", "agent.nvml", "agent.kubernetes"},
}


def probe_offending_imports(module: str, imports: set[str]) -> list[str]:
    """The imports of a module of a probe part that run against :data:`PROBE_PARTS`."""
    parts = module.split(".")
    if parts[:2] != ["agent", "probe"] or len(parts) < 4:
        return []  # not inside a part: agent/probe/__init__.py, agent/probe/sampler.py
    part = parts[2]
    bad = []
    for mod in sorted(imports):
        there = mod.split(".")
        if there[0] != "agent":
            continue
        if there[:2] == ["agent", "probe"]:
            other = there[2] if len(there) > 2 else ""
            ok = other == part or other in PROBE_PARTS[part]
        else:
            ok = _owner(mod) in PROBE_PART_OUTSIDE[part]
        if not ok:
            bad.append(mod)
    return bad


def test_the_probe_parts_import_only_downwards() -> None:
    files = sorted((ROOT / "agent" / "probe").rglob("*.py"))
    found = {f.parent.name for f in files if f.parent.name != "probe"}
    assert found == set(PROBE_PARTS), "a probe part is missing from PROBE_PARTS, or gone"
    offenders = [
        f"{f.relative_to(ROOT)} imports {mod}"
        for f in files
        for mod in probe_offending_imports(_module_of(f), imported_modules(f))
    ]
    assert offenders == []


def test_every_probe_part_says_what_it_owns_and_may_import() -> None:
    for part in PROBE_PARTS:
        init = ROOT / "agent" / "probe" / part / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and "May import" in doc, init


def test_the_probe_layering_check_catches_upward_and_sideways_imports() -> None:
    check = probe_offending_imports
    assert check("agent.probe.measure.launch", {"agent.probe.run.devices"}) == [
        "agent.probe.run.devices"
    ]
    assert check("agent.probe.schedule.plan", {"agent.probe.rendezvous.wire"}) == [
        "agent.probe.rendezvous.wire"
    ]
    assert check("agent.probe.rendezvous.server", {"agent.nvml.api", "agent.core.errors"}) == [
        "agent.nvml.api"
    ]
    assert check("agent.probe.render.matrix", {"agent.core.errors"}) == ["agent.core.errors"]
    assert check("agent.probe.run.guest", {"agent.probe.measure.launch", "agent.nvml.api"}) == []
    assert check("agent.probe.sampler", {"agent.probe.run.service"}) == []


def test_the_layering_check_catches_imports_across_sources_and_floors() -> None:
    assert offending_imports("agent.pci.sampler", {"agent.nvml.api", "agent.core.errors"}) == [
        "agent.nvml.api"
    ]
    assert offending_imports("agent.core.runner", {"agent.nvml.api", "agent.config"}) == [
        "agent.config",
        "agent.nvml.api",
    ]
    assert offending_imports("exporter.metrics.pci", {"exporter.http.server"}) == [
        "exporter.http.server"
    ]
    assert offending_imports("agent.workload.sampler", {"agent.pci.topology"}) == []


def module_graph(files: list[Path], root: Path = ROOT) -> dict[str, set[str]]:
    """Which of ``files``' modules each imports (anywhere in it, function-level included)."""
    names = {
        ".".join(f.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): f
        for f in files
    }
    graph: dict[str, set[str]] = {}
    for name, f in names.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(f.read_text(), filename=str(f))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps.add(node.module)
                deps.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[name] = (deps & names.keys()) - {name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_two_modules_import_each_other() -> None:
    """Not even through a function-level import: the records two modules both need go in a
    module both import (as agent/infiniband/records.py does for the sampler and the
    link-capacity checks)."""
    files = sorted((ROOT / "agent").rglob("*.py")) + sorted((ROOT / "exporter").rglob("*.py"))
    assert import_cycles(module_graph(files)) == []


def test_the_cycle_check_finds_a_circle_through_a_function_level_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "records.py").write_text("X = 1\n")
    (pkg / "capacity.py").write_text("from pkg.sampler import Snapshot\n")
    (pkg / "sampler.py").write_text(
        "from pkg import records\nclass Snapshot: ...\n"
        "def f() -> None:\n    from pkg.capacity import annotate\n"
    )
    graph = module_graph(sorted(pkg.glob("*.py")), tmp_path)
    assert graph["pkg.sampler"] == {"pkg", "pkg.records", "pkg.capacity"}
    assert import_cycles(graph) == [["pkg.capacity", "pkg.sampler"]]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
