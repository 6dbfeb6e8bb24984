"""Shared fixtures: paths to the committed fixture trees (see tests/fixtures/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture
def dgx_sys_root() -> Path:
    """The DGX-class 8xH100 + 8xConnectX-7 tree with five known faults."""
    return FIXTURES / "dgx-h100" / "sys"


@pytest.fixture
def procfs_sys_root() -> Path:
    """prometheus/procfs's sysfs fixture: mlx4, mlx5 (ConnectX-4 Lx) and hfi1 devices."""
    return FIXTURES / "procfs" / "sys"
