"""The real agent's ``--once``, in process, for a lab node.

:func:`render_once` parses the same command line ``fabricscope agent --once`` takes (the
CLI's own parser and configuration), builds the samplers with the CLI's ``build_specs``
and runs one pass through :class:`exporter.app.AgentApp`, exactly as ``cmd_agent`` does,
with five sources pointed at the lab (see :mod:`tests.lab.node`): NVML replays the node's
recording, netlink/ethtool answer from :class:`~tests.lab.node.LabKernel`, the probe
sampler returns the node's probe results, the throughput sampler's pod index is the node's
pod as the API server lists it (:func:`tests.lab.kubelet.pod_index`; a watch thread per
pass would cost more than the pass), and sampler timestamps read the simulated clock.
In process rather than a subprocess per step, so hundreds of steps take seconds.
"""

from __future__ import annotations

from functools import cache, partial

from agent.config import AgentConfig
from agent.core.runner import SamplerSpec
from agent.core.sysfs import SysfsReader
from agent.netdev.sampler import NetdevSampler
from agent.netdev.stats import DEFAULT_ETHTOOL_INCLUDE
from agent.nvml.record import ReplayNvml
from agent.probe.run.results import ProbeSnapshot
from agent.samplers import Latest, build_specs
from exporter.app import AgentApp
from exporter.cli.agent_flags import config_from_args
from exporter.cli.main import build_parser
from tests.lab.kubelet import pod_index
from tests.lab.node import LabKernel, LabNode


class LabProbeSampler:
    """The probe sampler's interface, answering the node's latest probe results."""

    name = "probe"

    def __init__(self, node: LabNode, now: float) -> None:
        self._node = node
        self._now = now

    def sample(self) -> ProbeSnapshot:
        return self._node.probe_snapshot(self._now)


def agent_args(node: LabNode, extra: list[str]) -> list[str]:
    """The agent command line for ``node`` (netdev is added by :func:`render_once` with the
    lab's kernel; NVML error counters are read every pass)."""
    return [
        "agent",
        "--once",
        f"--path.sysfs={node.sys}",
        f"--path.procfs={node.proc}",
        f"--kubelet.pod-resources-socket={node.socket}",
        f"--path.cdi={node.root / 'cdi'}",
        "--nvml.link-error-rotation=1",
        "--nvml.slow-error-rotation=1",
        "--no-sampler.netdev",
        *extra,
    ]


@cache
def _parsed(args: tuple[str, ...]) -> AgentConfig:
    return config_from_args(build_parser().parse_args(args))


def render_once(node: LabNode, now: float, extra: list[str]) -> bytes:
    """One ``--once`` exposition of ``node`` at simulated time ``now`` (unix seconds)."""
    config = _parsed(tuple(agent_args(node, extra)))
    latest = Latest()
    recording = node.nvml_recording()
    index = pod_index(node.pod, node.pod_uid, node.name)
    specs = build_specs(
        config,
        SysfsReader(config.paths.sysfs),
        nvml_api=partial(ReplayNvml, recording),
        watch_xid=False,
        run_probes=False,
        latest=latest,
        once=True,
        pod_index=lambda: index,
    )
    kernel = LabKernel(node)
    s = config.sampling
    specs += [
        SamplerSpec(
            NetdevSampler(
                SysfsReader(config.paths.sysfs),
                ethtool_include=DEFAULT_ETHTOOL_INCLUDE,
                open_rtnl=kernel.open_rtnl,
                open_ethtool=kernel.open_ethtool,
            ),
            s.interval_seconds,
            s.timeout_seconds,
        ),
        SamplerSpec(LabProbeSampler(node, now), s.interval_seconds, s.timeout_seconds),
    ]
    app = AgentApp(sorted(specs, key=lambda sp: sp.sampler.name), latest, wall_clock=lambda: now)
    return app.run_once()
