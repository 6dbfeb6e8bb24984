"""Shared fixtures: paths to the committed fixture trees (see tests/fixtures/README.md), and
the scenario lab's backfilled scenarios, built once per test session."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # the lab (grpc, the agent) is imported only by the tests that use it
    from tests.lab.backfill import ScenarioCache

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture
def dgx_sys_root() -> Path:
    """The DGX-class 8xH100 + 8xConnectX-7 tree with five known faults."""
    return FIXTURES / "dgx-h100" / "sys"


@pytest.fixture
def dgx_sys_copy(dgx_sys_root: Path, tmp_path: Path) -> Path:
    """A writable copy of the DGX tree (links kept as links), for tests that change it."""
    root = tmp_path / "sys"
    shutil.copytree(dgx_sys_root, root, symlinks=True)
    return root


@pytest.fixture
def procfs_sys_root() -> Path:
    """prometheus/procfs's sysfs fixture: mlx4, mlx5 (ConnectX-4 Lx) and hfi1 devices."""
    return FIXTURES / "procfs" / "sys"


@pytest.fixture(scope="session")
def lab_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScenarioCache]:
    """The lab's scenarios (tests/lab), each backfilled and served by a real Prometheus
    once per session, whichever test files ask for it: ``lab_cache.get(name, hours, step)``."""
    from tests.lab.backfill import ScenarioCache

    with ScenarioCache(tmp_path_factory.mktemp("lab")) as cache:
        yield cache
