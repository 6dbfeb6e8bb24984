"""The ``ibpeer`` sampler: for each active local InfiniBand port, one query set per pass.

For local port ``P`` of device ``D`` (from ``class/infiniband`` under ``--path.sysfs``), with
``-C D -P P`` so the tools leave by that port:

1. ``smpquery -D portinfo 0 P``: the local PortInfo (width and speed supported/enabled/active).
2. ``smpquery -D nodeinfo 0,P``: who is at the other end (directed route one hop out of
   ``P``; IBA C14-9:1 wants the first hop to name the sending port): its node GUID, type and
   ``LocalPort``, the port the query entered it by, i.e. the neighbour's end of the cable.
3. ``smpquery -D nodedesc 0,P``: its description.
4. ``smpquery -D portinfo 0,P N``: the neighbour port's PortInfo.
5. ``smpquery -D portinfo 0,P 0`` when the neighbour is a switch: its LID (port 0's).
6. ``perfquery LID N`` and ``perfquery -x LID N``: its PortCounters and PortCountersExtended.

That is 6 or 7 short-lived processes per port, never a sweep of the fabric. In the agent the
sampler runs in a supervised child process (:func:`isolated_sampler`) that is the subreaper of
everything the tools start: after every tool call it kills whatever the call left (a prefix
that ran ``setsid`` or double-forked cannot slip out), and when the agent stops, the child
and any tool still running go with it. A step that fails
(the tool exits non-zero, its output does not parse) costs the rest of that port's steps and
one :class:`~agent.core.sysfs.ReadIssue`; other ports carry on. A tool that does not finish in
``tool_timeout`` (the MAD layer stopped answering) is killed with its process group and
fails the whole pass with reason ``timeout``: the runner counts it, the scrape never waits.

Bounded series: the tools' output is untrusted (a wrapper in ``--ibpeer.command-prefix``, a
MAD answer from another node's PMA). perfquery fields of no known counter are exported
under their own names, at most :data:`~agent.ibpeer.parse.MAX_UNKNOWN_FIELDS` per answer and
:data:`NODE_UNKNOWN_FIELDS` per node; the rest are left out and counted per port
(``fields_dropped_total``). Every other label value is a bounded identifier (a GUID, a port
number, a node type) or the node description, cleaned and cut to 64 characters.

The sampler remembers each port's neighbour between passes: a different (GUID, port) is a
moved cable, counted and held as ``changed_from`` for :data:`CHANGE_HOLD_SECONDS`.
"""

from __future__ import annotations

import errno
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from agent.config import IbPeerSettings
from agent.core.errors import NoData, SamplerFailure
from agent.core.findings import Finding
from agent.core.isolation import ChildSpec, IsolatedSampler
from agent.core.reaper import reap_strays
from agent.core.sysfs import Issues, ReadIssue, SysfsReader, classify_os_error
from agent.core.tools import ToolError, ToolTimeout, run_tool
from agent.ibpeer.parse import (
    NodeInfo,
    PortInfo,
    merge_counters,
    parse_nodedesc,
    parse_nodeinfo,
    parse_portinfo,
)
from agent.infiniband.perfquery import PERFQUERY_NAMES, PerfCounters, parse_perfquery
from agent.infiniband.records import PHYS_STATE_LINK_UP, PortCounter
from agent.infiniband.sampler import CLASS_DIR, parse_state, parse_text

log = logging.getLogger(__name__)

#: how long a neighbour change stays on the snapshot (and in ``fabricscope topo``)
CHANGE_HOLD_SECONDS = 3600.0
#: libibmad's per-MAD timeout given to each tool (``-t``, ms); it retries 3 times. A switch
#: answers an SMP or PMA query in well under a millisecond: this only bounds a dead peer.
MAD_TIMEOUT_MS = 250
TOOLS = ("smpquery", "perfquery")
#: perfquery fields of no known counter exported per node (over all ports, first ports first)
NODE_UNKNOWN_FIELDS = 256
_KNOWN_COUNTERS = frozenset(PERFQUERY_NAMES.values())


@dataclass(frozen=True, slots=True)
class PeerId:
    """A cable's far end: the neighbour's node GUID and port number."""

    guid: str
    port: int


@dataclass(frozen=True, slots=True)
class PeerPort:
    """One local port and what was learnt about the other end of its cable this pass.

    ``None`` means not learnt (a step failed; the pass's issues say which), never 0.
    ``changed_from`` is the previous neighbour when it changed within the hold time;
    ``changes_total`` counts changes since the agent started.
    """

    device: str
    port: int
    local: PortInfo | None
    peer: NodeInfo | None
    peer_description: str | None
    peer_link: PortInfo | None
    peer_lid: int | None
    peer_counters: tuple[PortCounter, ...]
    changed_from: PeerId | None = None
    changes_total: int = 0
    #: perfquery fields of no known counter left out this pass (over the caps)
    fields_dropped: int = 0
    #: the same, since the agent started
    fields_dropped_total: int = 0

    @property
    def peer_id(self) -> PeerId | None:
        return PeerId(self.peer.guid, self.peer.local_port) if self.peer is not None else None

    @property
    def width_degraded(self) -> bool | None:
        """Active width below the widest both ends support; None when unknown."""
        best = _best_common(self.local, self.peer_link, "width_supported")
        if best is None or self.local is None or self.local.width_active is None:
            return None
        return self.local.width_active < best

    @property
    def speed_degraded(self) -> bool | None:
        """Active lane speed below the fastest both ends support; None when unknown."""
        best = _best_common(self.local, self.peer_link, "speed_supported")
        if best is None or self.local is None or self.local.speed_active is None:
            return None
        return self.local.speed_active < best


def _best_common(a: PortInfo | None, b: PortInfo | None, attr: str) -> int | None:
    if a is None or b is None:
        return None
    common: frozenset[int] = getattr(a, attr) & getattr(b, attr)
    return max(common) if common else None


@dataclass(frozen=True, slots=True)
class IbPeerSnapshot:
    ports: tuple[PeerPort, ...] = ()
    issues: tuple[ReadIssue, ...] = ()
    #: tool processes run in this pass and the wall time they took
    tool_calls: int = 0
    tool_seconds: float = 0.0


@dataclass(slots=True)
class _Pass:
    """One pass's tool calls against a deadline."""

    prefix: tuple[str, ...]
    tool_timeout: float
    deadline: float
    env: Mapping[str, str] | None
    reap: bool = False
    calls: int = 0
    seconds: float = 0.0

    def run(self, argv: Sequence[str]) -> str:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise SamplerFailure("timeout", "ibpeer pass ran out of time before its last query")
        limit = min(self.tool_timeout, left)
        self.calls += 1
        try:
            out = run_tool([*self.prefix, *argv], timeout=limit, env=self.env)
        except ToolTimeout as exc:
            raise SamplerFailure(
                "timeout", f"{' '.join(argv)} did not answer in {limit:.1f}s"
            ) from exc
        finally:
            if self.reap:  # whatever the call left running, whatever session it is in
                reap_strays()
        self.seconds += out.seconds
        return out.stdout


def local_ib_ports(sys: SysfsReader, issues: Issues) -> list[tuple[str, int]]:
    """(device, port) of every InfiniBand port whose physical link is up. Raises ``NoData``
    without RDMA devices or InfiniBand ports (RoCE ports have no subnet to ask)."""
    try:
        devices = sys.listdir(CLASS_DIR)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise NoData(f"{CLASS_DIR} is absent: no RDMA devices") from exc
        issues.add(CLASS_DIR, classify_os_error(exc), exc.strerror or str(exc))
        return []
    out: list[tuple[str, int]] = []
    seen_ib = False
    for device in devices:
        ports_dir = f"{CLASS_DIR}/{device}/ports"
        try:
            entries = sys.listdir(ports_dir)
        except OSError as exc:
            issues.add(ports_dir, classify_os_error(exc), exc.strerror or str(exc))
            continue
        for entry in sorted((e for e in entries if e.isdigit()), key=int):
            p = f"{ports_dir}/{entry}"
            layer = issues.read(f"{p}/link_layer", parse_text)
            if layer != "InfiniBand":
                continue
            seen_ib = True
            phys = issues.read(f"{p}/phys_state", parse_state)
            if phys is not None and phys.number == PHYS_STATE_LINK_UP:
                out.append((device, int(entry)))
    if not seen_ib and not issues.items:
        raise NoData("no InfiniBand ports (RoCE and iWARP ports have no subnet to query)")
    return out


@dataclass(slots=True)
class IbPeerSampler:
    """Samples the far end of every local InfiniBand cable. See the module docstring."""

    sys: SysfsReader
    prefix: tuple[str, ...] = ()
    tool_timeout: float = 2.0
    pass_budget: float = 8.0
    env: Mapping[str, str] | None = None
    clock: Callable[[], float] = time.monotonic
    #: kill and reap every descendant after each tool call (in a supervised child only: it
    #: owns no other child process)
    reap: bool = False
    _last: dict[tuple[str, int], PeerId] = field(default_factory=dict)
    _changed: dict[tuple[str, int], tuple[PeerId, float]] = field(default_factory=dict)
    _changes: dict[tuple[str, int], int] = field(default_factory=dict)
    _dropped: dict[tuple[str, int], int] = field(default_factory=dict)

    name = "ibpeer"

    def sample(self) -> IbPeerSnapshot:
        issues = Issues(self.sys)
        ports = local_ib_ports(self.sys, issues)
        run = _Pass(
            self.prefix,
            self.tool_timeout,
            time.monotonic() + self.pass_budget,
            self.env,
            reap=self.reap,
        )
        read = _cap_unknown([self._read_port(run, issues, d, p) for d, p in ports])
        out = [self._remember(p) for p in read]
        return IbPeerSnapshot(tuple(out), issues.freeze(), run.calls, run.seconds)

    def _remember(self, port: PeerPort) -> PeerPort:
        key = (port.device, port.port)
        now = self.clock()
        current = port.peer_id
        previous = self._last.get(key)
        if current is not None:
            if previous is not None and previous != current:
                self._changed[key] = (previous, now)
                self._changes[key] = self._changes.get(key, 0) + 1
                log.warning(
                    "ibpeer: %s port %d now cabled to %s port %d (was %s port %d)",
                    port.device,
                    port.port,
                    current.guid,
                    current.port,
                    previous.guid,
                    previous.port,
                )
            self._last[key] = current
        held = self._changed.get(key)
        if held is not None and now - held[1] > CHANGE_HOLD_SECONDS:
            del self._changed[key]
            held = None
        self._dropped[key] = self._dropped.get(key, 0) + port.fields_dropped
        return PeerPort(
            device=port.device,
            port=port.port,
            local=port.local,
            peer=port.peer,
            peer_description=port.peer_description,
            peer_link=port.peer_link,
            peer_lid=port.peer_lid,
            peer_counters=port.peer_counters,
            changed_from=held[0] if held is not None else None,
            changes_total=self._changes.get(key, 0),
            fields_dropped=port.fields_dropped,
            fields_dropped_total=self._dropped[key],
        )

    def _read_port(self, run: _Pass, issues: Issues, device: str, port: int) -> PeerPort:
        ca = ("-C", device, "-P", str(port), "-t", str(MAD_TIMEOUT_MS))
        hop = f"0,{port}"
        subject = f"{device}/{port}"
        got: dict[str, object] = {}

        def step(what: str, argv: Sequence[str], parse: Callable[[str], object]) -> bool:
            try:
                got[what] = parse(run.run(argv))
            except ToolError as exc:
                issues.add(f"{subject}: {what}", exc.reason, str(exc))
                return False
            except ValueError as exc:
                issues.add(f"{subject}: {what}", "parse", str(exc))
                return False
            return True

        def perf(extended: bool) -> Callable[[str], PerfCounters]:
            return lambda text: parse_perfquery(text, extended=extended)

        ok = step(
            "local portinfo", ["smpquery", *ca, "-D", "portinfo", "0", str(port)], parse_portinfo
        )
        ok = ok and step("peer nodeinfo", ["smpquery", *ca, "-D", "nodeinfo", hop], parse_nodeinfo)
        node = got.get("peer nodeinfo")
        if ok and isinstance(node, NodeInfo):
            ok = step("peer nodedesc", ["smpquery", *ca, "-D", "nodedesc", hop], parse_nodedesc)
            ok = ok and step(
                "peer portinfo",
                ["smpquery", *ca, "-D", "portinfo", hop, str(node.local_port)],
                parse_portinfo,
            )
            if ok and node.node_type == "switch":
                ok = step(
                    "peer port 0 portinfo",
                    ["smpquery", *ca, "-D", "portinfo", hop, "0"],
                    parse_portinfo,
                )
        lid = _peer_lid(got)
        basic = ext = None
        if ok and isinstance(node, NodeInfo) and lid is not None:
            target = (str(lid), str(node.local_port))
            if step("peer perfquery", ["perfquery", *ca, *target], perf(False)):
                basic = got["peer perfquery"]
                if step("peer perfquery -x", ["perfquery", *ca, "-x", *target], perf(True)):
                    ext = got["peer perfquery -x"]
            for answer, what in ((basic, "peer perfquery"), (ext, "peer perfquery -x")):
                if isinstance(answer, PerfCounters) and answer.port_select != node.local_port:
                    issues.add(
                        f"{subject}: {what}",
                        "parse",
                        f"answered for port {answer.port_select}, not {node.local_port}",
                    )
                    basic = ext = None
        elif ok and lid is None:
            issues.add(f"{subject}: peer lid", "unsupported", "the neighbour has no LID yet")
        local = got.get("local portinfo")
        peer_link = got.get("peer portinfo")
        desc = got.get("peer nodedesc")
        return PeerPort(
            device=device,
            port=port,
            local=local if isinstance(local, PortInfo) else None,
            peer=node if isinstance(node, NodeInfo) else None,
            peer_description=desc if isinstance(desc, str) else None,
            peer_link=peer_link if isinstance(peer_link, PortInfo) else None,
            peer_lid=lid,
            peer_counters=merge_counters(
                basic if isinstance(basic, PerfCounters) else None,
                ext if isinstance(ext, PerfCounters) else None,
            ),
            fields_dropped=sum(a.dropped for a in (basic, ext) if isinstance(a, PerfCounters)),
        )


def _cap_unknown(ports: list[PeerPort]) -> list[PeerPort]:
    """Leave out the perfquery fields of no known counter past :data:`NODE_UNKNOWN_FIELDS`
    over all ports (in port order), counted in each port's ``fields_dropped``."""
    room = NODE_UNKNOWN_FIELDS
    out = []
    for p in ports:
        kept: list[PortCounter] = []
        dropped = 0
        for c in p.peer_counters:
            if c.name not in _KNOWN_COUNTERS:
                if room <= 0:
                    dropped += 1
                    continue
                room -= 1
            kept.append(c)
        out.append(
            replace(p, peer_counters=tuple(kept), fields_dropped=p.fields_dropped + dropped)
            if dropped
            else p
        )
    return out


def child_sampler(
    *, sysfs: str, prefix: str, tool_timeout: float, pass_budget: float
) -> IbPeerSampler:
    """The sampler as its supervised child builds it (``prefix``: a JSON list)."""
    return IbPeerSampler(
        SysfsReader(sysfs),
        prefix=tuple(str(w) for w in json.loads(prefix)),
        tool_timeout=tool_timeout,
        pass_budget=pass_budget,
        reap=True,
    )


def isolated_sampler(
    settings: IbPeerSettings, sysfs: str, timeout_seconds: float, *, one_shot: bool = False
) -> IsolatedSampler:
    """The ibpeer sampler in a supervised child process that is the subreaper of the tools
    (see the module docstring); its pass ends a second before ``timeout_seconds``."""
    return IsolatedSampler(
        "ibpeer",
        ChildSpec(
            "agent.ibpeer.sampler:child_sampler",
            {
                "sysfs": sysfs,
                "prefix": json.dumps(list(settings.command_prefix)),
                "tool_timeout": settings.tool_timeout_seconds,
                "pass_budget": max(timeout_seconds - 1.0, 0.5),
            },
        ),
        timeout_seconds=timeout_seconds,
        one_shot=one_shot,
    )


def _peer_lid(got: Mapping[str, object]) -> int | None:
    """The neighbour's LID: switch port 0's, else the neighbour port's own; 0 is no LID."""
    for key in ("peer port 0 portinfo", "peer portinfo"):
        info = got.get(key)
        if isinstance(info, PortInfo):
            return info.lid if info.lid else None
    return None


# -- analysis --------------------------------------------------------------------------


def _lanes(widths: frozenset[int]) -> str:
    return "/".join(f"{w}X" for w in sorted(widths)) or "?"


def _gbps(speed: int) -> str:
    return f"{speed / 125_000_000:g} Gb/s"


def findings(snap: IbPeerSnapshot) -> list[Finding]:
    """Neighbour errors, links trained below what both ends support, moved cables."""
    out: list[Finding] = []
    for p in snap.ports:
        subject = f"{p.device}/{p.port}"
        peer = f"{p.peer.guid} port {p.peer.local_port}" if p.peer else "its neighbour"
        if p.peer_description:
            peer += f" ({p.peer_description})"
        errors = {
            c.name: c.raw
            for c in p.peer_counters
            if c.name in ("symbol_error", "port_rcv_errors", "link_error_recovery", "link_downed")
            and c.raw > 0
        }
        if errors:
            listed = ", ".join(f"{k} {v}" for k, v in sorted(errors.items()))
            out.append(
                Finding(
                    "ib_peer_errors",
                    subject,
                    f"the far end of {subject}, {peer}, counts {listed}: what it receives from "
                    "this node's transmitter or the cable is damaged.",
                )
            )
        if p.width_degraded and p.local is not None and p.peer_link is not None:
            best = _best_common(p.local, p.peer_link, "width_supported")
            enabled = p.local.width_enabled & p.peer_link.width_enabled
            why = (
                f"; enabled {_lanes(enabled)} on both ends"
                if enabled and best is not None and max(enabled) < best
                else ""
            )
            out.append(
                Finding(
                    "ib_link_width_degraded",
                    subject,
                    f"{subject} trained at {p.local.width_active}X; both ends support "
                    f"{best}X ({peer}){why}.",
                )
            )
        if p.speed_degraded and p.local is not None and p.local.speed_active is not None:
            best = _best_common(p.local, p.peer_link, "speed_supported")
            assert best is not None
            out.append(
                Finding(
                    "ib_link_speed_degraded",
                    subject,
                    f"{subject} trained at {_gbps(p.local.speed_active)} a lane; both ends support "
                    f"{_gbps(best)} ({peer}).",
                )
            )
        if p.changed_from is not None and p.peer is not None:
            out.append(
                Finding(
                    "ib_peer_changed",
                    subject,
                    f"{subject} is now cabled to {peer}; it was {p.changed_from.guid} port "
                    f"{p.changed_from.port}.",
                )
            )
    return sorted(out)
