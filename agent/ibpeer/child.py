"""The ibpeer sampler as the agent runs it: in a supervised child process
(:mod:`agent.core.isolation`) that is the subreaper of every tool it starts, and after each
tool call kills and reaps whatever the call left (``IbPeerSampler(reap=True)``, see
:class:`agent.ibpeer.query.Pass`). The sampler's state (the topology, the leaves' tables,
the moved cables) lives in that child. Before a child is started, or while one is kept, the
agent checks that there is an InfiniBand port and that the tools are on ``PATH``: a node
with neither keeps no second process."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from agent.config import IbPeerSettings
from agent.core.errors import NoData
from agent.core.isolation import ChildSpec, IsolatedSampler
from agent.core.sysfs import Issues, SysfsReader
from agent.ibpeer.sampler import IbPeerSampler, local_ib_ports, missing_tools, warn_missing


def child_sampler(
    *,
    sysfs: str,
    prefix: str,
    tool_timeout: float,
    pass_budget: float,
    topology_interval: float,
    uplinks_max: int,
    extended: bool,
    once: bool,
    spine_links: bool = False,
) -> IbPeerSampler:
    """The sampler as its supervised child builds it (``prefix``: a JSON list)."""
    return IbPeerSampler(
        SysfsReader(sysfs),
        prefix=tuple(str(w) for w in json.loads(prefix)),
        tool_timeout=tool_timeout,
        pass_budget=pass_budget,
        topology_interval=topology_interval,
        uplinks_max=uplinks_max,
        extended=extended,
        spine_links=spine_links,
        # one pass is all --once has: every leaf's table in it
        tables_per_pass=64 if once else 1,
        spread=not once,
        reap=True,
    )


def _precheck(sysfs: str, prefix: Sequence[str]) -> Callable[[], None]:
    """What the agent checks before it starts (or keeps) a child: InfiniBand ports and the
    tools, so a node with neither keeps no second process."""
    reader = SysfsReader(sysfs)
    missing: list[list[str]] = []  # looked up once, as the sampler does

    def check() -> None:
        local_ib_ports(reader, Issues(reader))
        if not missing:
            missing.append(missing_tools(prefix))
            warn_missing(missing[0])
        if missing[0]:
            raise NoData(f"{', '.join(missing[0])} not on PATH")

    return check


def isolated_sampler(
    settings: IbPeerSettings,
    sysfs: str,
    timeout_seconds: float,
    *,
    one_shot: bool = False,
    memory_limit: int | None = None,
) -> IsolatedSampler:
    """The ibpeer sampler in a supervised child process that is the subreaper of the tools
    (see :mod:`agent.ibpeer.sampler`); its pass ends a second before ``timeout_seconds``.
    ``one_shot``: ``--once``, one pass that reads every leaf's table; ``memory_limit``: the
    pod's, of which the child's memory ceiling is a share."""
    return IsolatedSampler(
        "ibpeer",
        ChildSpec(
            "agent.ibpeer.child:child_sampler",
            {
                "sysfs": sysfs,
                "prefix": json.dumps(list(settings.command_prefix)),
                "tool_timeout": settings.tool_timeout_seconds,
                "pass_budget": max(timeout_seconds - 1.0, 0.5),
                "topology_interval": settings.topology_interval_seconds,
                "uplinks_max": settings.uplinks_max,
                "extended": settings.extended_counters,
                "spine_links": settings.spine_links,
                "once": one_shot,
            },
        ),
        timeout_seconds=timeout_seconds,
        one_shot=one_shot,
        precheck=_precheck(sysfs, settings.command_prefix),
        memory_limit=memory_limit,
    )
