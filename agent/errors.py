"""Error types shared by every sampler."""

from __future__ import annotations


class NoData(Exception):  # noqa: N818 - named after node_exporter's ErrNoData on purpose
    """The hardware a sampler reads is absent on this host. A quiet, expected outcome."""


class ConfigError(Exception):
    """A user-supplied setting or file is invalid. The message says which and why."""
