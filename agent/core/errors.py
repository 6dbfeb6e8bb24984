"""Error types shared by every sampler."""

from __future__ import annotations


class NoData(Exception):  # noqa: N818 - named after node_exporter's ErrNoData on purpose
    """The hardware a sampler reads is absent on this host. A quiet, expected outcome."""


class ConfigError(Exception):
    """A user-supplied setting or file is invalid. The message says which and why."""


class SamplerFailure(Exception):  # noqa: N818 - a pass's outcome, like NoData
    """A pass failed for a reason the runner counts apart from ``exception``: ``reason`` is
    one of :data:`agent.core.runner.ERROR_REASONS` (``crashed``, ``hung``, ``backoff``: a sampler
    run in a child process, :mod:`agent.core.isolation`)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
