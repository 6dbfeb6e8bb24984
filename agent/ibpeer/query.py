"""Reading the fabric around the node with infiniband-diags' own tools, one bounded process
per query (:mod:`agent.core.tools`), every query of a pass held to one deadline
(:class:`Pass`). Each function reads one thing and returns it, or ``None`` with an issue.
In the agent the pass runs in a supervised child that is the subreaper of the tools
(:func:`agent.ibpeer.child.isolated_sampler`): with ``reap`` on, :class:`Pass` kills and
reaps whatever each call left behind (a ``--ibpeer.command-prefix`` that ran ``setsid`` or
double-forked), whether the call answered, failed or timed out.

For local port ``P`` of device ``D``, every tool gets ``-C D -P P`` so it leaves by that
port, and SMPs travel by directed route (``-D``): ``0,P`` is the switch at the other end of
P's cable (its leaf), ``0,P,k`` whatever is cabled to the leaf's port ``k``. PMA queries
(``perfquery``) go by LID, several ports of one switch in one call (``-l LID k1,k2``).

- :func:`read_neighbour`: the local PortInfo and the far end of the cable (NodeInfo,
  NodeDescription, its port's PortInfo, its LID): 4 or 5 processes, 3 when the far end is
  the one already known.
- :func:`read_table`: a leaf's port table: ``portinfo 0,P k`` for each of its ports, then
  ``nodeinfo 0,P,k`` for each port whose link is up: at most 2 per port of that one switch.
- :func:`read_far_end`: the description and LID of the switch at the far end of an uplink
  (``nodedesc 0,P,k``, ``portinfo 0,P,k 0``): 2 processes.
- :func:`read_counters`: PortCounters (and PortCountersExtended) of a switch's ports: 1 (2).
  perfquery's output is parsed by :mod:`agent.infiniband.perfquery`, each port's block
  keeping at most :data:`~agent.infiniband.perfquery.MAX_UNKNOWN_FIELDS` fields of no known
  counter (the rest counted in :attr:`SwitchPortCounters.dropped`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from agent.core.errors import NoData, SamplerFailure
from agent.core.reaper import reap_strays
from agent.core.sysfs import Issues
from agent.core.tools import ToolError, ToolOutput, ToolTimeout, run_tool
from agent.ibpeer.fabric import SwitchLink, SwitchTable
from agent.ibpeer.parse import (
    NodeInfo,
    PortInfo,
    merge_counters,
    parse_nodedesc,
    parse_nodeinfo,
    parse_portinfo,
)
from agent.ibpeer.records import PeerPort
from agent.infiniband.perfquery import parse_fields, parse_perfquery_ports
from agent.infiniband.records import PortCounter

T = TypeVar("T")


class ToolRunner(Protocol):
    """How a tool is run: :func:`~agent.core.tools.run_tool`, or a replay of recorded
    answers (the series budget's)."""

    def __call__(
        self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None
    ) -> ToolOutput: ...


#: libibmad's per-MAD timeout given to each tool (``-t``, ms); it retries 3 times. A switch
#: answers an SMP or PMA query in well under a millisecond: this only bounds a dead peer.
MAD_TIMEOUT_MS = 250
#: the most ports a switch's table is read for (an IBA switch has at most 254)
MAX_SWITCH_PORTS = 254
#: what libibumad/libibmad print when the umad device cannot be opened (no ib_umad module, no
#: /dev/infiniband/umad* in the container, no permission): the tools cannot run on this node
_NO_UMAD = re.compile(r"UMAD port|ib_umad|Failed to open '|umad_open_port|umad_init")


@dataclass(slots=True)
class Pass:
    """One pass's tool calls against a deadline (monotonic seconds). ``reap``: after every
    call, kill and reap every descendant of this process (only in a supervised child, which
    owns no other child process and is the subreaper of what the tools start)."""

    prefix: tuple[str, ...]
    tool_timeout: float
    deadline: float
    env: Mapping[str, str] | None
    tool: ToolRunner = run_tool
    reap: bool = False
    calls: int = 0
    seconds: float = 0.0

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, argv: Sequence[str]) -> str:
        left = self.left()
        if left <= 0:
            raise SamplerFailure("timeout", "ibpeer pass ran out of time before its last query")
        limit = min(self.tool_timeout, left)
        self.calls += 1
        try:
            out = self.tool([*self.prefix, *argv], timeout=limit, env=self.env)
        except ToolTimeout as exc:
            raise SamplerFailure(
                "timeout", f"{' '.join(argv)} did not answer in {limit:.1f}s"
            ) from exc
        finally:
            if self.reap:  # whatever the call left running, whatever session it is in
                reap_strays()
        self.seconds += out.seconds
        return out.stdout


class Steps:
    """One subject's queries: a step that fails is one issue (``subject: what``) and
    ``None``; the caller stops at the first ``None``."""

    def __init__(self, run: Pass, issues: Issues, subject: str) -> None:
        self.run = run
        self.issues = issues
        self.subject = subject
        #: the tool could not open the umad device (see :data:`_NO_UMAD`)
        self.no_umad = ""

    def get(self, what: str, argv: Sequence[str], parse: Callable[[str], T]) -> T | None:
        try:
            return parse(self.run.run(argv))
        except ToolError as exc:
            if _NO_UMAD.search(str(exc)):
                self.no_umad = str(exc)
            self.issues.add(f"{self.subject}: {what}", exc.reason, str(exc))
        except ValueError as exc:
            self.issues.add(f"{self.subject}: {what}", "parse", str(exc))
        return None


def ca_args(device: str, port: int) -> tuple[str, ...]:
    return ("-C", device, "-P", str(port), "-t", str(MAD_TIMEOUT_MS))


def _lid(info: PortInfo | None) -> int | None:
    return info.lid if info is not None and info.lid else None


def read_neighbour(
    run: Pass, issues: Issues, device: str, port: int, known: PeerPort | None = None
) -> PeerPort:
    """Local PortInfo and the far end of local port ``device``/``port``'s cable (no
    counters). When the far end is still ``known``'s (same node GUID and port), its
    description and LID are ``known``'s, not asked again. Raises ``NoData`` when the tool
    cannot open the umad device at all."""
    ca = ca_args(device, port)
    hop = f"0,{port}"
    s = Steps(run, issues, f"{device}/{port}")
    local = s.get(
        "local portinfo", ["smpquery", *ca, "-D", "portinfo", "0", str(port)], parse_portinfo
    )
    if local is None and s.no_umad:
        raise NoData(f"infiniband-diags cannot open the umad device of {device}: {s.no_umad}")
    node = desc = link = None
    lid: int | None = None
    if local is not None:
        node = s.get("peer nodeinfo", ["smpquery", *ca, "-D", "nodeinfo", hop], parse_nodeinfo)
    same = (
        known is not None
        and node is not None
        and known.peer == node
        and known.peer_description is not None
        and known.peer_lid is not None
    )
    if node is not None:
        desc = (
            known.peer_description
            if same and known is not None
            else s.get("peer nodedesc", ["smpquery", *ca, "-D", "nodedesc", hop], parse_nodedesc)
        )
    if node is not None and desc is not None:
        link = s.get(
            "peer portinfo",
            ["smpquery", *ca, "-D", "portinfo", hop, str(node.local_port)],
            parse_portinfo,
        )
        lid = _lid(link)
    answered = link is not None
    if same and known is not None and link is not None:
        lid = known.peer_lid
    elif node is not None and link is not None and node.node_type == "switch":
        port0 = s.get(
            "peer port 0 portinfo", ["smpquery", *ca, "-D", "portinfo", hop, "0"], parse_portinfo
        )
        answered = port0 is not None
        lid = _lid(port0)
    if answered and lid is None:
        issues.add(f"{device}/{port}: peer lid", "unsupported", "the neighbour has no LID yet")
    return PeerPort(
        device=device,
        port=port,
        local=local,
        peer=node,
        peer_description=desc,
        peer_link=link,
        peer_lid=lid,
        peer_counters=(),
    )


def parse_link_up(text: str) -> bool:
    """``smpquery portinfo`` -> whether the port's physical link is up (``PhysLinkState``
    ``LinkUp``); ``ValueError`` without that field."""
    state = parse_fields(text).get("PhysLinkState")
    if state is None:
        raise ValueError("no PhysLinkState field")
    return state == "LinkUp"


def read_table(
    run: Pass,
    issues: Issues,
    via: tuple[str, int],
    leaf: NodeInfo,
    now: float,
    *,
    beyond: int | None = None,
) -> SwitchTable | None:
    """The port table of the switch at the far end of local port ``via`` (``leaf``, as
    :func:`read_neighbour` found it), or with ``beyond`` of the switch cabled to that leaf's
    port ``beyond`` (``leaf`` then that switch's NodeInfo, :func:`read_switch_node`). A port
    whose query fails is left out of the table (one issue); None when no port could be
    read."""
    device, port = via
    ca = ca_args(device, port)
    hop = f"0,{port}" if beyond is None else f"0,{port},{beyond}"
    s = Steps(run, issues, f"{device}/{port}: switch {leaf.guid}")
    links: list[SwitchLink] = []
    read = 0
    for k in range(1, min(leaf.num_ports, MAX_SWITCH_PORTS) + 1):
        up = s.get(
            f"port {k} portinfo", ["smpquery", *ca, "-D", "portinfo", hop, str(k)], parse_link_up
        )
        if up is None:
            continue
        read += 1
        if not up:
            continue
        node = s.get(
            f"port {k} neighbour", ["smpquery", *ca, "-D", "nodeinfo", f"{hop},{k}"], parse_nodeinfo
        )
        if node is not None:
            links.append(SwitchLink(k, node.guid, node.node_type, node.local_port))
    if not read:
        return None
    return SwitchTable(leaf.guid, leaf.num_ports, tuple(links), now)


def read_switch_node(
    run: Pass, issues: Issues, via: tuple[str, int], beyond: int
) -> NodeInfo | None:
    """NodeInfo of the switch cabled to port ``beyond`` of the leaf at the far end of local
    port ``via`` (its GUID and port count, before its table is read): 1 process."""
    device, port = via
    s = Steps(run, issues, f"{device}/{port}: uplink {beyond}")
    return s.get(
        "far end nodeinfo",
        ["smpquery", *ca_args(device, port), "-D", "nodeinfo", f"0,{port},{beyond}"],
        parse_nodeinfo,
    )


def read_far_end(
    run: Pass, issues: Issues, via: tuple[str, int], link: SwitchLink
) -> tuple[str | None, int | None]:
    """Description and LID of the switch cabled to the leaf's port ``link.port``."""
    device, port = via
    ca = ca_args(device, port)
    hop = f"0,{port},{link.port}"
    s = Steps(run, issues, f"{device}/{port}: uplink {link.port}")
    desc = s.get("far end nodedesc", ["smpquery", *ca, "-D", "nodedesc", hop], parse_nodedesc)
    if desc is None:
        return None, None
    info = s.get(
        "far end port 0 portinfo", ["smpquery", *ca, "-D", "portinfo", hop, "0"], parse_portinfo
    )
    return desc, _lid(info)


@dataclass(frozen=True, slots=True)
class SwitchPortCounters:
    """One switch port's counters from one pass (:func:`read_counters`) and the perfquery
    fields of no known counter its answers carried beyond the per-answer cap (left out)."""

    counters: tuple[PortCounter, ...]
    dropped: int = 0


def read_counters(
    run: Pass,
    issues: Issues,
    via: tuple[str, int],
    lid: int,
    ports: Sequence[int],
    *,
    extended: bool = True,
) -> dict[int, SwitchPortCounters]:
    """PortCounters (and PortCountersExtended when ``extended``: 64-bit data and packet
    counters) of ``ports`` of the node at ``lid``, one call each for all of them; a port
    missing from the answer is left out (one issue)."""
    device, port = via
    ca = ca_args(device, port)
    wanted = sorted(set(ports))
    target = [str(lid), ",".join(map(str, wanted))]
    s = Steps(run, issues, f"{device}/{port}: lid {lid}")
    basic = s.get(
        "perfquery",
        ["perfquery", *ca, "-l", *target],
        lambda t: parse_perfquery_ports(t, extended=False),
    )
    if basic is None:
        return {}
    ext = (
        s.get(
            "perfquery -x",
            ["perfquery", *ca, "-x", "-l", *target],
            lambda t: parse_perfquery_ports(t, extended=True),
        )
        if extended
        else None
    )
    out = {}
    for k in wanted:
        if k not in basic:
            issues.add(f"{s.subject}: perfquery", "parse", f"no answer for port {k}")
            continue
        x = ext.get(k) if ext is not None else None
        out[k] = SwitchPortCounters(
            merge_counters(basic[k], x), basic[k].dropped + (x.dropped if x is not None else 0)
        )
    extra = sorted(set(basic) - set(wanted))
    if extra:
        issues.add(f"{s.subject}: perfquery", "parse", f"answered for ports {extra} not asked")
    return out
