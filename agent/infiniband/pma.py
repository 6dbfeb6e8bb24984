"""The node's own InfiniBand ports' PMA counters beyond sysfs: 64-bit where the PMA keeps
them, cleared near their maximum where asked. Run by the infiniband sampler after its sysfs
read, through infiniband-diags' ``perfquery`` at the port's own LID.

The kernel's ``counters/`` files are the port's Performance Management Agent (PMA) counters
at the widths of the attribute the kernel reads: error counters 4 to 16 bits and
PortXmitWait 32 bits (PortCounters), data and packet counters 64 bits where the PMA has
PortCountersExtended. A narrow counter stops at its maximum; a 32-bit PortXmitWait of a
congested NDR port gets there within seconds, and every rate computed from it then reads 0
(:mod:`agent.infiniband.perfquery` has the attributes and their capability bits).

**64-bit counters where the PMA keeps them.** ``perfquery -x LID PORT`` (through the bounded
runner the ibpeer sampler uses, :mod:`agent.core.tools`) returns PortCountersExtended and,
in its header, the PMA's ClassPortInfo. Where CapabilityMask2 advertises the additional
extended counters, their 64-bit error counters and PortXmitWait replace the sysfs ones
under the same names, so every metric, alert, panel and ``explain`` check reads them
unchanged; where the kernel's data counters are 32-bit, the 64-bit data counters replace
them. Where the PMA offers nothing sysfs lacks, the step stops asking and asks again once
an hour: there it costs nothing. (On upstream kernels the mlx5 driver answers a ConnectX
port's PMA queries itself, ``process_pma_cmd`` in drivers/infiniband/hw/mlx5/mad.c:
ClassPortInfo CapabilityMask 0x0200 and no CapabilityMask2, so a ConnectX port's error
counters stay narrow there and only the clearing below helps.)

**Clearing near the maximum, when asked** (``--infiniband.reset-saturated``, as OpenSM's
perfmgr does). The narrow counters are read from sysfs as always; one at or past OpenSM's
threshold (three quarters of its maximum; 10 for a 4-bit counter) is cleared with
``perfquery -r LID PORT MASK`` (only the counters due), which prints their values read in
the same call just before the clear. Its value then is added to what the agent has
cleared from that counter before, and the exported counter is that sum plus the hardware
value: monotonic, no increase counted twice. Lost are only the increases between that read
and the clear (two MADs apart), and, for a counter perfquery does not print (PortXmitWait
where ClassPortInfo's bit 12 is off, as on mlx5: perfquery prints 0 for it), those between
the sysfs read just before the call and the clear. A clear is believed only when a sysfs
read right after it shows the counter below its value before; a clear by someone else (an
operator's ``perfquery -R``, OpenSM's perfmgr) shows as the value going down and its last
value is added (what came between is lost). Every other reader of these counters
(``perfquery``, ``ibqueryerrors``, UFM, OpenSM's perfmgr, node_exporter, the kernel's sysfs
files) sees them drop to 0 whenever the agent clears them.

Each InfiniBand port's :class:`~agent.infiniband.records.CounterSource` says where its error
counters came from, and why not 64-bit (:data:`REASONS`). A counter a 64-bit read has
supplied is never handed back to its narrow sysfs twin within one run (that would show as a
counter reset and a spurious jump): while that read fails, the counter is absent. A failing
port skips 0, 1, 3, 7 ... (at most 16) passes between tries; a tool that hangs
ends the step for the pass. The sysfs counters are exported whatever perfquery does.
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
from agent.infiniband.memory import PortMemory, StateFile
from agent.infiniband.parse import (
    IB_DATA_UNIT_BYTES,
    PMA_DATA_COUNTERS,
    PMA_EXT_ONLY_COUNTERS,
    PMA_WIDTHS,
    parse_counter,
)
from agent.infiniband.perfquery import (
    DATA_WORDS,
    RESET_BITS,
    PerfCounters,
    PmaCapabilities,
    near_saturation,
    parse_header,
    parse_perfquery,
    reset_mask,
)
from agent.infiniband.records import (
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
from agent.infiniband.sampler import CLASS_DIR

log = logging.getLogger(__name__)

MODES = ("auto", "on", "off")
TOOL = "perfquery"
#: why a port's error counters are not 64-bit (``CounterSource.reason``)
REASONS = {
    "off": "--infiniband.perfquery=off",
    "no_lid": "the port is not ACTIVE, or has no LID yet",
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
    #: per counter, the hardware value at the last read (reset mode)
    last: dict[str, int] = field(default_factory=dict)
    #: counters found at their maximum when cleared, or that would not clear (warned once)
    warned: set[str] = field(default_factory=set)
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


def clears_due(counters: dict[str, PortCounter]) -> set[str]:
    """The narrow counters (name -> counter) to clear now: those PortCounters can clear,
    at or past OpenSM's threshold (:func:`~agent.infiniband.perfquery.near_saturation`)."""
    return {
        name
        for name, c in counters.items()
        if name in RESET_BITS
        and c.width is not None
        and c.width < 64
        and near_saturation(c.raw, c.width)
    }


def _scale(name: str) -> int:
    return IB_DATA_UNIT_BYTES if name in DATA_WORDS else 1


@dataclass(slots=True)
class PmaReader:
    """The step (see the module docstring). ``mode``: ``auto`` (the ports whose umad device
    the agent can open), ``on`` (every ACTIVE InfiniBand port: a wrapper, ``sudo -n``, the
    simulator), ``off`` (none: sysfs only). ``reset``: clear narrow counters near their
    maximum. ``prefix``: argv put before perfquery. ``pass_budget``: seconds the step may
    take in one pass; ``tool_timeout``: one call. ``dev_root``: where ``infiniband/umad*``
    device nodes are looked for."""

    sys: SysfsReader
    mode: str = "auto"
    reset: bool = False
    prefix: tuple[str, ...] = ()
    tool_timeout: float = 2.0
    pass_budget: float = 5.0
    dev_root: str = "/dev"
    state_file: str | None = None
    clock: Callable[[], float] = time.monotonic
    _states: dict[tuple[str, int], _PortState] = field(default_factory=dict)
    _tool: bool = True
    _memory: StateFile | None = None
    _loaded: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"perfquery mode must be one of {', '.join(MODES)}")
        if self.mode != "off":
            self._tool = shutil.which(self.prefix[0] if self.prefix else TOOL) is not None
            if self.state_file:
                self._memory = StateFile(self.state_file)

    def update(self, snap: InfinibandSnapshot) -> InfinibandSnapshot:
        """``snap`` with its InfiniBand ports' counters merged from their PMA and each such
        port's :class:`CounterSource` set."""
        run = _Pass(self.prefix, self.tool_timeout, time.monotonic() + self.pass_budget)
        issues = list(snap.issues)
        if self._memory is not None and self._loaded is None:
            self._loaded = self._restore()
            if self._loaded:
                issues.append(ReadIssue(self._memory.path, "parse", self._loaded))
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
        if self._memory is not None:
            failed = self._memory.save(
                {
                    key: PortMemory(dict(st.cleared), dict(st.last), set(st.extended), st.resets)
                    for key, st in self._states.items()
                }
            )
            if failed:
                issues.append(ReadIssue(self._memory.path, "io", failed))
        return InfinibandSnapshot(
            tuple(devices), tuple(issues), snap.tool_calls + run.calls, run.seconds
        )

    def _restore(self) -> str:
        """Take back what the previous run kept (:mod:`agent.infiniband.memory`); "" or why
        nothing was taken."""
        assert self._memory is not None
        kept, why = self._memory.load()
        for key, m in kept.items():
            self._states[key] = _PortState(
                extended=set(m.extended),
                cleared=dict(m.cleared),
                last=dict(m.last),
                resets=m.resets,
            )
        return why

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
        sysfs = {c.name: c for c in port.counters if c.source == _COUNTERS}
        why = self._why_not(umad, device, port)
        if not why and st.lid != port.lid:
            st.lid, st.caps = port.lid, None
        if not why and st.skip > 0:
            st.skip -= 1
            why = st.reason
        ext: PerfCounters | None = None
        failed = ""
        if not why:
            ca = ("-C", device, "-P", str(port.port), "-t", str(MAD_TIMEOUT_MS))
            target = (str(port.lid), str(port.port))
            try:
                if self._want_extended(st, sysfs):
                    ext = self._query(run, [TOOL, *ca, "-x", *target], port.port, extended=True)
                    st.caps, st.caps_at = ext.caps, self.clock()
            except (_OutOfTime, ToolTimeout, ToolError, ValueError) as exc:
                failed = self._failure(st, issues, f"{device}/{port.port}: perfquery -x", exc)
        counters = self._merge(st, sysfs, ext)
        if self.reset:
            self._account(st, device, port.port, counters)
            if not why and not failed:
                try:
                    self._clear(run, st, issues, device, port, counters=counters)
                except (_OutOfTime, ToolTimeout, ToolError, ValueError) as exc:
                    failed = self._failure(st, issues, f"{device}/{port.port}: perfquery -r", exc)
        if not failed and not why:
            st.failures = 0
        others = [c for c in port.counters if c.source != _COUNTERS]
        merged = tuple(sorted([*others, *counters.values()], key=lambda c: (c.source, c.name)))
        reason = why or failed
        if not reason and st.caps is not None and st.caps.additional_extended and st.extended:
            source = SOURCE_EXTENDED
        else:
            source = SOURCE_CLEARED if self.reset and not why else SOURCE_SYSFS
            reason = reason or "not_advertised"
        return self._settle(device, port, st, merged, source=source, reason=reason)

    def _failure(self, st: _PortState, issues: list[ReadIssue], where: str, exc: Exception) -> str:
        """Record a failed call (a read issue, unless it never ran) and back off; the
        port's reason."""
        if isinstance(exc, _OutOfTime):
            return "timeout"  # another port's call hung, or the step's time ran out
        if isinstance(exc, ToolError):
            issues.append(ReadIssue(where, exc.reason, str(exc)))
        else:
            issues.append(
                ReadIssue(where, "parse" if isinstance(exc, ValueError) else "io", str(exc))
            )
        st.failures += 1
        st.skip = min(2 ** (st.failures - 1) - 1, MAX_BACKOFF_PASSES)
        st.reason = "timeout" if isinstance(exc, ToolTimeout) else "failed"
        return st.reason

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
        """One perfquery answer about ``port`` in the attribute asked for, else ValueError."""
        text = run.run(argv)
        header = parse_header(text)
        if header is not None and header[0] != extended:
            want = "PortCountersExtended" if extended else "PortCounters"
            raise ValueError(f"perfquery answered with another attribute than {want}")
        answer = parse_perfquery(text, extended=extended)
        if answer.port_select != port:
            raise ValueError(f"perfquery answered for port {answer.port_select}, not {port}")
        return answer

    def _merge(
        self, st: _PortState, sysfs: dict[str, PortCounter], ext: PerfCounters | None
    ) -> dict[str, PortCounter]:
        """The port's ``counters/`` counters: sysfs's, the 64-bit ones of ``ext`` in place
        of their twins, and none that a 64-bit read supplied before but not now."""
        chosen = {n: c for n, c in sysfs.items() if n not in st.extended}
        if ext is not None:
            for name, raw, width in ext.values:
                twin = sysfs.get(name)
                if name not in KERNEL_NAMES or width != 64 or (twin and twin.width == 64):
                    continue  # sysfs's own 64-bit counter (the kernel reads the same) stays
                scale = twin.scale if twin is not None else _scale(name)
                chosen[name] = PortCounter(_COUNTERS, name, raw, scale, 64)
                st.extended.add(name)
        return chosen

    # -- reset mode ----------------------------------------------------------------------

    def _account(
        self, st: _PortState, device: str, port: int, counters: dict[str, PortCounter]
    ) -> None:
        """Every pass in reset mode: a narrow counter below its last value was cleared by
        someone else (its last value is added to what was cleared); each carries what the
        agent has cleared from it."""
        for name, c in list(counters.items()):
            if name not in RESET_BITS or c.width is None or c.width >= 64:
                continue
            last = st.last.get(name)
            if last is not None and c.raw < last:
                log.warning(
                    "infiniband: %s port %d %s went down from %d to %d: cleared by another "
                    "reader; counting on from there",
                    device,
                    port,
                    name,
                    last,
                    c.raw,
                )
                st.cleared[name] = st.cleared.get(name, 0) + last
            st.last[name] = c.raw
            counters[name] = replace(c, cleared=st.cleared.get(name, 0))

    def _reread(self, device: str, port: int, name: str) -> int | None:
        try:
            text = self.sys.read_text(f"{CLASS_DIR}/{device}/ports/{port}/counters/{name}")
            return parse_counter(text)
        except (OSError, ValueError):
            return None

    def _clear(
        self,
        run: _Pass,
        st: _PortState,
        issues: list[ReadIssue],
        device: str,
        port: IbPort,
        *,
        counters: dict[str, PortCounter],
    ) -> None:
        """Clear the counters due with ``perfquery -r`` and account for what they held."""
        due = clears_due(counters)
        if not due:
            return
        p = port.port
        before = {n: self._reread(device, p, n) for n in due}
        ca = ("-C", device, "-P", str(p), "-t", str(MAD_TIMEOUT_MS))
        argv = [TOOL, *ca, "-r", str(port.lid), str(p), hex(reset_mask(due))]
        printed = self._query(run, argv, p, extended=False).by_name()
        st.resets += 1
        for name in sorted(due):
            c = counters[name]
            read = [c.raw, before[name] or 0]
            if name in printed:
                read.append(printed[name][0])
            held = max(read)
            after = self._reread(device, p, name)
            width = c.width or 64
            if after is None or after >= held:
                issues.append(
                    ReadIssue(
                        f"{device}/{p}: perfquery -r",
                        "unsupported",
                        f"{name} did not clear ({after} after, {held} before)",
                    )
                )
                if name not in st.warned:
                    log.warning(
                        "infiniband: %s port %d %s did not clear (%s after the clear, %d "
                        "before): not counted as cleared",
                        device,
                        p,
                        name,
                        "unreadable" if after is None else after,
                        held,
                    )
                st.warned.add(name)
                continue
            counters[name] = replace(c, raw=held)
            st.cleared[name] = st.cleared.get(name, 0) + held
            st.last[name] = after
            if held == (1 << width) - 1 and name not in st.warned:
                log.warning(
                    "infiniband: %s port %d %s reached its maximum before the agent cleared "
                    "it: what it missed since the previous pass is lost (a 64-bit source or a "
                    "shorter --sampling.interval keeps it)",
                    device,
                    p,
                    name,
                )
                st.warned.add(name)
            elif held < (1 << width) - 1:
                st.warned.discard(name)

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
