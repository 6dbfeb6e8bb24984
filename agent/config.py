"""The agent's configuration: frozen dataclasses grouped by meaning, units in field docs.

Built once by the CLI from flags; passed to the parts that need it; never mutated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: Every sampler, in the order they are listed in ``--help``.
SAMPLER_NAMES = ("infiniband", "netdev", "nvml", "pci")


@dataclass(frozen=True, slots=True)
class Paths:
    """Roots every read hangs off (``--path.sysfs``, ``--path.procfs``)."""

    sysfs: str = "/sys"
    procfs: str = "/proc"


@dataclass(frozen=True, slots=True)
class Sampling:
    """How often and how long samplers run.

    ``interval_seconds``: time between the starts of two passes of one sampler.
    ``timeout_seconds``: a pass running longer is abandoned and counted as a timeout.
    """

    enabled: frozenset[str] = frozenset(SAMPLER_NAMES)
    interval_seconds: float = 15.0
    timeout_seconds: float = 10.0

    def __post_init__(self) -> None:
        if self.interval_seconds <= 0:
            raise ValueError("sampling interval must be positive")
        if not 0 < self.timeout_seconds <= self.interval_seconds:
            raise ValueError("sampling timeout must be positive and at most the interval")
        unknown = self.enabled - set(SAMPLER_NAMES)
        if unknown:
            raise ValueError(f"unknown samplers: {', '.join(sorted(unknown))}")


@dataclass(frozen=True, slots=True)
class NetdevSettings:
    """Which interfaces and ethtool statistics the netdev sampler exports.

    ``include``: regex of extra interface names (RDMA-associated ones are always included).
    ``ethtool_include``: regex of ethtool statistic names; None means the sampler's default.
    ``ethtool``: read ethtool statistics at all (one ioctl per interface per pass).
    """

    include: re.Pattern[str] | None = None
    ethtool_include: re.Pattern[str] | None = None
    ethtool: bool = True


@dataclass(frozen=True, slots=True)
class AgentConfig:
    paths: Paths = field(default_factory=Paths)
    sampling: Sampling = field(default_factory=Sampling)
    netdev: NetdevSettings = field(default_factory=NetdevSettings)
