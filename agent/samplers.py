"""Builds the enabled samplers from the configuration: the one place that knows them all."""

from __future__ import annotations

from collections.abc import Callable

from agent.config import AgentConfig
from agent.infiniband import InfinibandSampler
from agent.netdev import DEFAULT_ETHTOOL_INCLUDE, NetdevSampler
from agent.nvml import NvmlApi, NvmlSampler
from agent.pci import PciSampler
from agent.probe.service import build_probe_sampler
from agent.runner import SamplerSpec
from agent.sampler import Sampler
from agent.sysfs import SysfsReader


def build_samplers(
    config: AgentConfig,
    sysfs: SysfsReader,
    *,
    nvml_api: Callable[[], NvmlApi] | None = None,
    watch_xid: bool = True,
    run_probes: bool = True,
) -> list[Sampler]:
    """The enabled samplers, sorted by name, all reading sysfs through ``sysfs``.

    ``nvml_api`` builds the NVML adapter (default: the live library; a replayed recording
    for ``--snapshot``); ``watch_xid`` starts NVML's XID event thread (off for ``--once``).
    ``run_probes``: build the probe sampler when ``--probe`` is on; it starts the probe
    service, which binds the rendezvous port (off for ``--once``: probes run on their own
    schedule, never in one pass).
    """
    out: list[Sampler] = []
    enabled = config.sampling.enabled
    if "infiniband" in enabled:
        out.append(InfinibandSampler(sysfs))
    if "netdev" in enabled:
        nd = config.netdev
        ethtool = nd.ethtool_include or DEFAULT_ETHTOOL_INCLUDE
        out.append(
            NetdevSampler(
                sysfs, include=nd.include, ethtool_include=ethtool if nd.ethtool else None
            )
        )
    if "nvml" in enabled:
        out.append(NvmlSampler(nvml_api, watch_xid=watch_xid))
    if "pci" in enabled:
        out.append(PciSampler(sysfs))
    if config.probe.enabled and run_probes:
        out.append(build_probe_sampler(config.probe))
    return sorted(out, key=lambda s: s.name)


def build_specs(
    config: AgentConfig,
    sysfs: SysfsReader,
    *,
    nvml_api: Callable[[], NvmlApi] | None = None,
    watch_xid: bool = True,
    run_probes: bool = True,
) -> list[SamplerSpec]:
    s = config.sampling
    samplers = build_samplers(
        config, sysfs, nvml_api=nvml_api, watch_xid=watch_xid, run_probes=run_probes
    )
    return [SamplerSpec(sampler, s.interval_seconds, s.timeout_seconds) for sampler in samplers]
