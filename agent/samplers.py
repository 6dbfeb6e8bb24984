"""Builds the enabled samplers from the configuration: the one place that knows them all."""

from __future__ import annotations

from agent.config import AgentConfig
from agent.infiniband import InfinibandSampler
from agent.netdev import NetdevSampler
from agent.pci import PciSampler
from agent.runner import SamplerSpec
from agent.sampler import Sampler
from agent.sysfs import SysfsReader


def build_samplers(config: AgentConfig, sysfs: SysfsReader) -> list[Sampler]:
    """The enabled samplers, sorted by name, all reading sysfs through ``sysfs``."""
    out: list[Sampler] = []
    enabled = config.sampling.enabled
    if "infiniband" in enabled:
        out.append(InfinibandSampler(sysfs))
    if "netdev" in enabled:
        if config.netdev.ethtool_include is not None:
            out.append(
                NetdevSampler(
                    sysfs,
                    include=config.netdev.include,
                    ethtool_include=config.netdev.ethtool_include,
                )
            )
        else:
            out.append(NetdevSampler(sysfs, include=config.netdev.include))
    if "pci" in enabled:
        out.append(PciSampler(sysfs))
    return sorted(out, key=lambda s: s.name)


def build_specs(config: AgentConfig, sysfs: SysfsReader) -> list[SamplerSpec]:
    s = config.sampling
    return [
        SamplerSpec(sampler, s.interval_seconds, s.timeout_seconds)
        for sampler in build_samplers(config, sysfs)
    ]
