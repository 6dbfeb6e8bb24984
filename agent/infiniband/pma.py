"""The node's own InfiniBand ports' PMA counters, read with ``perfquery`` at their own LID.

The kernel's ``counters/`` files are the port's Performance Management Agent (PMA) counters
at the widths of the attribute the kernel reads: the error counters 4 to 16 bits and
PortXmitWait 32 bits (PortCounters, always), the data and packet counters 64 bits where the
PMA has PortCountersExtended. Narrow counters stop at their maximum; a 32-bit PortXmitWait
of a congested NDR port gets there within seconds, and from then on every rate computed
from it reads 0 (see :mod:`agent.infiniband.perfquery` for the attributes and capability
bits). This step, run by the infiniband sampler after its sysfs read, does two things:

**64-bit counters where the HCA keeps them.** ``perfquery -x LID PORT`` (through the same
bounded runner as the ibpeer sampler, :mod:`agent.core.tools`) returns PortCountersExtended
and, in its header, the PMA's ClassPortInfo. Where CapabilityMask2 advertises the
additional extended counters, the 64-bit error counters and PortXmitWait replace the sysfs
ones under the same names (so every metric, alert, panel and ``explain`` check reads them
unchanged); where the kernel's data counters are 32-bit, the 64-bit data counters replace
them. Where the PMA advertises nothing sysfs lacks, the step stops querying the port and
looks again once an hour: it costs nothing there.

**Clearing near saturation, when asked** (``--infiniband.reset-saturated``, what OpenSM's
perfmgr does): the narrow counters are read from PortCounters with perfquery; one at or
above OpenSM's threshold (three quarters of its maximum; 10 for a 4-bit counter) is read
and cleared in one call (``perfquery -r LID PORT MASK``, only the counters due), and the
agent adds what it cleared to what it exports, so the exported counter stays monotonic and
no increase is lost or counted twice, except those that arrive between the read and the
clear inside that one perfquery call (two MADs apart). A clear by someone else (an operator's
``perfquery -R``, OpenSM's perfmgr) shows as the hardware value going down and is added
too. Every other reader of the same counters (``perfquery``, ``ibqueryerrors``, UFM, OpenSM,
node_exporter, the kernel's sysfs files) sees them drop to 0 whenever the agent clears them.

Each InfiniBand port's :class:`~agent.infiniband.sampler.CounterSource` says which source its
error counters came from, and why not 64-bit (:data:`REASONS`). A counter that a 64-bit
read has supplied is never handed back to its narrow sysfs twin within one run (that would
show as a counter reset and a spurious jump): while that read fails, the counter is absent.
A failing port is retried with a growing back-off (1, 2, 4 ... up to 16 passes); a tool
that hangs ends the step for the pass (the sysfs counters are exported regardless).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from agent.core.sysfs import ReadIssue, SysfsReader
from agent.core.tools import ToolError, ToolTimeout, run_tool
from agent.infiniband.perfquery import (
    EXT_DATA,
    RESET_BITS,
    PerfCounters,
    PmaCapabilities,
    near_saturation,
    parse_perfquery,
    reset_mask,
)
from agent.infiniband.sampler import (
    IB_DATA_UNIT_BYTES,
    PMA_DATA_COUNTERS,
    PMA_EXT_ONLY_COUNTERS,
    PMA_WIDTHS,
    PORT_STATE_ACTIVE,
    SOURCE_CLEARED,
    SOURCE_EXTENDED,
    SOURCE_SYSFS,
    CounterSource,
    IbDevice,
    IbPort,
    InfinibandSnapshot,
    PortCounter,
)

log = logging.getLogger(__name__)

MODES = ("auto", "on", "off")
TOOL = "perfquery"
#: why a port's error counters are not 64-bit (``CounterSource.reason``)
REASONS = {
    "off": "--infiniband.perfquery=off",
    "no_lid": "the port is not ACTIVE with a LID",
    "no_tool": "perfquery is not on PATH",
    "no_umad": "no /dev/infiniband/umad device for the port is open to the agent",
    "not_advertised": "the PMA's ClassPortInfo does not advertise 64-bit error counters",
    "failed": "perfquery failed (the read errors and the log say why)",
    "timeout": "perfquery did not answer in time",
}
#: libibmad's per-MAD timeout given to perfquery (``-t``, ms; it retries 3 times)
MAD_TIMEOUT_MS = 250
#: the most output one perfquery call may print (an answer is about 1.2 KiB)
MAX_OUTPUT_BYTES = 16 * 1024
#: how often a port whose PMA advertises nothing useful is asked again
CAPS_RECHECK_SECONDS = 3600.0
#: the most passes a failing port is skipped for between tries
MAX_BACKOFF_PASSES = 16
#: the counters of a port's ``counters/`` directory the PMA can stand in for
KERNEL_NAMES = (
    frozenset(PMA_WIDTHS) | frozenset(PMA_DATA_COUNTERS) | frozenset(PMA_EXT_ONLY_COUNTERS)
)
_COUNTERS = "counters"


class _OutOfTime(Exception):  # noqa: N818 - an outcome
    """The step's time for this pass ran out (or a tool hung) before this port's turn."""


@dataclass(slots=True)
class _PortState:
    """What the step remembers of one port between passes."""

    lid: int | None = None
    caps: PmaCapabilities | None = None
    caps_at: float = -math.inf
    failures: int = 0
    skip: int = 0
    reason: str = ""
    #: counters a 64-bit read has supplied: never handed back to their sysfs twins
    extended: set[str] = field(default_factory=set)
    #: per counter, what the agent has cleared from the hardware counter in all
    cleared: dict[str, int] = field(default_factory=dict)
    #: per counter, the hardware value at the last PortCounters read (reset mode)
    last: dict[str, int] = field(default_factory=dict)
    #: counters found at their maximum when they were cleared (warned once per run)
    overflowing: set[str] = field(default_factory=set)
    resets: int = 0
    logged: tuple[str, str] = ("", "")


@dataclass(slots=True)
class _Pass:
    """One pass's perfquery calls against the step's deadline."""

    prefix: tuple[str, ...]
    tool_timeout: float
    deadline: float
    calls: int = 0
    seconds: float = 0.0
    hung: bool = False

    def run(self, argv: Sequence[str]) -> str:
        left = self.deadline - time.monotonic()
        if self.hung or left <= 0:
            raise _OutOfTime("no time left for perfquery in this pass")
        self.calls += 1
        t0 = time.monotonic()
        try:
            return run_tool(
                [*self.prefix, *argv],
                timeout=min(self.tool_timeout, left),
                max_bytes=MAX_OUTPUT_BYTES,
            ).stdout
        except ToolTimeout:
            self.hung = True
            raise
        finally:
            self.seconds += time.monotonic() - t0


def umad_ports(sys: SysfsReader) -> dict[tuple[str, int], str]:
    """(device, port) -> umad device name, from ``class/infiniband_mad/umad*/{ibdev,port}``
    (empty where the tree has none)."""
    out: dict[tuple[str, int], str] = {}
    try:
        names = sys.listdir("class/infiniband_mad")
    except OSError:
        return out
    for name in names:
        if not name.startswith("umad"):
            continue
        try:
            dev = sys.read_text(f"class/infiniband_mad/{name}/ibdev").strip()
            port = int(sys.read_text(f"class/infiniband_mad/{name}/port").strip())
        except (OSError, ValueError):
            continue
        out[(dev, port)] = name
    return out


def clears_due(values: dict[str, tuple[int, int | None]], eligible: frozenset[str]) -> set[str]:
    """The counters of a PortCounters answer (name -> raw, width) to clear now: those
    ``eligible`` at or past OpenSM's threshold (:func:`near_saturation`)."""
    return {
        name
        for name, (raw, width) in values.items()
        if name in eligible and width is not None and near_saturation(raw, width)
    }


@dataclass(slots=True)
class PmaReader:
    """The step (see the module docstring). ``mode``: ``auto`` (ports whose umad device the
    agent can open), ``on`` (every ACTIVE InfiniBand port: a wrapper, ``sudo -n``, the
    simulator), ``off`` (none: sysfs only). ``reset``: clear narrow counters near their
    maximum. ``prefix``: argv put before perfquery. ``pass_budget``: seconds the step may
    take in one pass; ``tool_timeout``: one call."""

    sys: SysfsReader
    mode: str = "auto"
    reset: bool = False
    prefix: tuple[str, ...] = ()
    tool_timeout: float = 2.0
    pass_budget: float = 5.0
    dev_root: str = "/dev"
    clock: Callable[[], float] = time.monotonic
    _states: dict[tuple[str, int], _PortState] = field(default_factory=dict)
    _tool: bool = True

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"perfquery mode must be one of {', '.join(MODES)}")
        if self.mode != "off":
            self._tool = shutil.which(self.prefix[0] if self.prefix else TOOL) is not None

    def update(self, snap: InfinibandSnapshot) -> InfinibandSnapshot:
        """``snap`` with its InfiniBand ports' counters merged from their PMA and each such
        port's :class:`CounterSource` set."""
        run = _Pass(self.prefix, self.tool_timeout, time.monotonic() + self.pass_budget)
        issues = list(snap.issues)
        umad = umad_ports(self.sys) if self.mode == "auto" else {}
        devices: list[IbDevice] = []
        present: set[tuple[str, int]] = set()
        for dev in snap.devices:
            ports = []
            for port in dev.ports:
                if port.link_layer != "InfiniBand":
                    ports.append(port)
                    continue
                present.add((dev.name, port.port))
                ports.append(self._port(run, issues, umad, dev.name, port))
            devices.append(replace(dev, ports=tuple(ports)))
        for gone in set(self._states) - present:
            del self._states[gone]
        return InfinibandSnapshot(
            tuple(devices), tuple(issues), snap.tool_calls + run.calls, run.seconds
        )

    # -- one port ----------------------------------------------------------------------

    def _why_not(self, umad: dict[tuple[str, int], str], device: str, port: IbPort) -> str:
        if self.mode == "off":
            return "off"
        if port.state is None or port.state.number != PORT_STATE_ACTIVE or not port.lid:
            return "no_lid"
        if not self._tool:
            return "no_tool"
        if self.mode == "auto":
            name = umad.get((device, port.port))
            node = os.path.join(self.dev_root, "infiniband", name) if name else ""
            if not name or not os.access(node, os.R_OK | os.W_OK):
                return "no_umad"
        return ""

    def _port(
        self,
        run: _Pass,
        issues: list[ReadIssue],
        umad: dict[tuple[str, int], str],
        device: str,
        port: IbPort,
    ) -> IbPort:
        st = self._states.setdefault((device, port.port), _PortState())
        why = self._why_not(umad, device, port)
        if why:
            return self._settle(
                device, port, st, self._fallback(port, st), source=SOURCE_SYSFS, reason=why
            )
        if st.lid != port.lid:
            st.lid, st.caps = port.lid, None
        if st.skip > 0:
            st.skip -= 1
            return self._settle(
                device, port, st, self._fallback(port, st), source=SOURCE_SYSFS, reason=st.reason
            )
        target = (str(port.lid), str(port.port))
        ca = ("-C", device, "-P", str(port.port), "-t", str(MAD_TIMEOUT_MS))
        sysfs = {c.name: c for c in port.counters if c.source == _COUNTERS}
        ext: PerfCounters | None = None
        basic: dict[str, PortCounter] | None = None
        failed = ""
        where = f"{device}/{port.port}: perfquery"
        try:
            if self._want_extended(st, sysfs):
                ext = self._query(run, [TOOL, *ca, "-x", *target], port.port, extended=True)
                st.caps, st.caps_at = ext.caps, self.clock()
            if self.reset and not (st.caps is not None and st.caps.additional_extended):
                basic = self._read_and_clear(run, st, ca, target, port=port.port, device=device)
        except _OutOfTime:
            failed = "timeout"  # another port's call hung, or the step's time ran out
        except (ToolTimeout, ToolError, ValueError) as exc:
            failed = "timeout" if isinstance(exc, ToolTimeout) else "failed"
            if isinstance(exc, ToolError):
                reason = exc.reason
            else:
                reason = "parse" if isinstance(exc, ValueError) else "io"
            issues.append(ReadIssue(where, reason, str(exc)))
            st.failures += 1
            st.skip = min(2 ** (st.failures - 1) - 1, MAX_BACKOFF_PASSES)
        if failed:
            st.reason = failed
        else:
            st.failures = 0
        counters = self._merge(port, st, sysfs, ext, basic)
        if ext is None and basic is None and not failed:
            return self._settle(
                device, port, st, counters, source=SOURCE_SYSFS, reason="not_advertised"
            )
        if st.caps is not None and st.caps.additional_extended and st.extended and not failed:
            return self._settle(device, port, st, counters, source=SOURCE_EXTENDED, reason="")
        if basic is not None:
            return self._settle(
                device, port, st, counters, source=SOURCE_CLEARED, reason=failed or "not_advertised"
            )
        return self._settle(
            device, port, st, counters, source=SOURCE_SYSFS, reason=failed or "not_advertised"
        )

    def _want_extended(self, st: _PortState, sysfs: dict[str, PortCounter]) -> bool:
        if st.caps is None or self.clock() - st.caps_at >= CAPS_RECHECK_SECONDS:
            return True
        if st.caps.additional_extended:
            return True
        narrow_data = any(
            sysfs.get(n) is None or (sysfs[n].width or 0) < 64 for n in PMA_DATA_COUNTERS
        )
        return st.caps.extended and narrow_data

    def _query(self, run: _Pass, argv: Sequence[str], port: int, *, extended: bool) -> PerfCounters:
        answer = parse_perfquery(run.run(argv), extended=extended)
        if answer.port_select != port:
            raise ValueError(f"perfquery answered for port {answer.port_select}, not {port}")
        return answer

    def _read_and_clear(
        self,
        run: _Pass,
        st: _PortState,
        ca: tuple[str, ...],
        target: tuple[str, str],
        *,
        port: int,
        device: str,
    ) -> dict[str, PortCounter]:
        """PortCounters' narrow counters, the due ones cleared; ``st`` learns what was."""
        eligible = self._clearable(st)
        answer = self._query(run, [TOOL, *ca, *target], port, extended=False)
        values = {n: v for n, v in answer.by_name().items() if n in eligible}
        for name, (raw, _) in values.items():
            before = st.last.get(name)
            if before is not None and raw < before:
                log.warning(
                    "infiniband: %s port %d %s went down from %d to %d: cleared by another "
                    "reader; counting on from there",
                    device,
                    port,
                    name,
                    before,
                    raw,
                )
                st.cleared[name] = st.cleared.get(name, 0) + before
        due = clears_due(values, eligible)
        if due:
            argv = [TOOL, *ca, "-r", *target, hex(reset_mask(due))]
            answer = self._query(run, argv, port, extended=False)
            values.update((n, v) for n, v in answer.by_name().items() if n in eligible)
            st.resets += 1
        out: dict[str, PortCounter] = {}
        for name, (raw, width) in values.items():
            out[name] = PortCounter(
                _COUNTERS, name, raw, _scale(name), width, st.cleared.get(name, 0)
            )
            st.last[name] = raw
            if name not in due:
                continue
            # cleared after this read: the next read counts from 0
            st.cleared[name] = st.cleared.get(name, 0) + raw
            st.last[name] = 0
            if width is not None and raw == (1 << width) - 1:
                if name not in st.overflowing:
                    log.warning(
                        "infiniband: %s port %d %s was at its maximum when cleared: what it "
                        "missed since the previous pass is lost (a 64-bit source or a "
                        "shorter interval keeps it)",
                        device,
                        port,
                        name,
                    )
                st.overflowing.add(name)
            else:
                st.overflowing.discard(name)
        return out

    def _clearable(self, st: _PortState) -> frozenset[str]:
        """Counters reset mode reads from PortCounters and may clear: the error counters and
        PortXmitWait, and the 32-bit data counters of a PMA without PortCountersExtended
        (clearing them where it has one can clear the 64-bit ones too, OpenSM notes)."""
        names = {n for n, bit in RESET_BITS.items() if bit < 12 or bit == 16}
        if st.caps is not None and not st.caps.extended:
            names |= EXT_DATA
        return frozenset(names)

    def _merge(
        self,
        port: IbPort,
        st: _PortState,
        sysfs: dict[str, PortCounter],
        ext: PerfCounters | None,
        basic: dict[str, PortCounter] | None,
    ) -> tuple[PortCounter, ...]:
        chosen: dict[str, PortCounter] = {}
        for name, c in sysfs.items():
            if name in st.extended:
                continue  # a 64-bit counter whose read failed this pass: absent, not narrow
            chosen[name] = replace(c, cleared=st.cleared.get(name, 0))
        if ext is not None:
            for name, raw, width in ext.values:
                if name not in KERNEL_NAMES or width != 64:
                    continue
                scale = sysfs[name].scale if name in sysfs else _scale(name)
                chosen[name] = PortCounter(_COUNTERS, name, raw, scale, 64)
                st.extended.add(name)
        for name, c in (basic or {}).items():
            if name not in st.extended:
                chosen[name] = replace(c, scale=sysfs[name].scale) if name in sysfs else c
        others = [c for c in port.counters if c.source != _COUNTERS]
        return tuple(sorted([*others, *chosen.values()], key=lambda c: (c.source, c.name)))

    def _fallback(self, port: IbPort, st: _PortState) -> tuple[PortCounter, ...]:
        sysfs = {c.name: c for c in port.counters if c.source == _COUNTERS}
        return self._merge(port, st, sysfs, None, None)

    def _settle(
        self,
        device: str,
        port: IbPort,
        st: _PortState,
        counters: tuple[PortCounter, ...],
        *,
        source: str,
        reason: str,
    ) -> IbPort:
        if (source, reason) != st.logged:
            level = logging.WARNING if reason in ("failed", "timeout") else logging.INFO
            log.log(
                level,
                "infiniband: %s port %d error counters from %s%s",
                device,
                port.port,
                source,
                f" ({REASONS.get(reason, reason)})" if reason else " (64-bit)",
            )
            st.logged = (source, reason)
        resets = st.resets if self.reset else None
        return replace(
            port, counters=counters, counter_source=CounterSource(source, reason, resets)
        )


def _scale(name: str) -> int:
    return IB_DATA_UNIT_BYTES if name in ("port_xmit_data", "port_rcv_data") else 1
