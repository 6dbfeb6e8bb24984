"""The dashboards as panel tables, one module per dashboard, in the order Grafana lists
them; :mod:`boards.model` holds the table vocabulary."""

from __future__ import annotations

from boards.fleet import FLEET
from boards.job import JOB
from boards.model import Board
from boards.node import NODE_BOARD
from boards.probe import PROBE

BOARDS: tuple[Board, ...] = (FLEET, NODE_BOARD, JOB, PROBE)

__all__ = ["BOARDS", "FLEET", "JOB", "NODE_BOARD", "PROBE"]
