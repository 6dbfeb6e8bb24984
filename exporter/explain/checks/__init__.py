"""The candidate causes and the checks that gather their evidence, as one table.

A ``Check`` is a PromQL template evaluated twice, over the baseline and over the slow
period, for every device of the job; its ``mode`` says how the two numbers compare and its
``significant`` level is the change that scores 1.0. Scores are ``log2(1 + change /
significant)``: 1.0 means "the change reached the significance level", and a change eight
times that level scores about 3.2, so one huge counter cannot dwarf the table's scale.

Templates take ``{sel}`` (the label matchers scoping the query to the job's instances or
pods, or to one device), ``{d}`` (a range: the period's length for scoring, a tile of it
for the noise, a few steps for display) and, where a device is compared with its node's
other devices, ``{peers}`` (the matchers of those: the job's instances when the whole job
is asked, the device's node when one device's figure is printed, so the printed query
never compares a device with itself alone).

Every check gets the same statistics from the framework, whatever its template: its figures
are taken over the part of each period its series covers, its change is held to the spread
of its own baseline (and, for event counters, to counting noise: :mod:`exporter.explain.
noise`), and a PMA counter it reads that saturated makes it "evidence unavailable"
(:mod:`exporter.explain.blind`). What the framework prints for a figure (:meth:`Check.shown`)
is the PromQL that returns it, in the check's unit.

The table is split by what it covers: :mod:`.causes` (the candidate causes and their
panels), :mod:`.check` (what a check is), :mod:`.promql` (the template pieces), and the
checks themselves in :mod:`.links` (ports, cables, congestion, drops), :mod:`.host` (PCIe,
NVLink, GPUs, probes) and :mod:`.job` (placement, NCCL). This module joins them in table
order.
"""

from __future__ import annotations

from exporter.explain.checks.causes import (
    CAUSES,
    PANEL_BY_SWITCH,
    PANEL_PORT_DATA,
    PANEL_PORT_RATE,
    THRESHOLD,
    Cause,
)
from exporter.explain.checks.check import Check, Key, Mode, Scope, escape
from exporter.explain.checks.host import HOST_CHECKS
from exporter.explain.checks.job import JOB_CHECKS
from exporter.explain.checks.links import LINK_CHECKS

#: every check, in table order (the links', the host's, the job's)
CHECKS: tuple[Check, ...] = LINK_CHECKS + HOST_CHECKS + JOB_CHECKS
CHECKS_BY_NAME = {c.name: c for c in CHECKS}
#: the name the explain modules import it by
_escape = escape

__all__ = [
    "CAUSES",
    "CHECKS",
    "CHECKS_BY_NAME",
    "PANEL_BY_SWITCH",
    "PANEL_PORT_DATA",
    "PANEL_PORT_RATE",
    "THRESHOLD",
    "Cause",
    "Check",
    "Key",
    "Mode",
    "Scope",
    "escape",
]
