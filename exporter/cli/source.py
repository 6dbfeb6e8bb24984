"""Where samplers read from: the host, or a snapshot taken by ``fabricscope snapshot`` (its
sysfs files and NVML recording, replayed). Shared by ``fabricscope agent`` and ``topo``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from agent.core.errors import ConfigError
from agent.nvml.api import NvmlApi
from agent.nvml.record import RecordingError, ReplayNvml, load
from agent.snapshot import NVML_RECORDING, SnapshotError, extract

#: samplers whose source is not a file tree, so a snapshot cannot replay them (ibpeer asks
#: the fabric: replaying a snapshot must not query the host's switches)
NOT_REPLAYABLE = frozenset({"netdev", "attribution", "workload", "ibpeer"})


@dataclass(frozen=True, slots=True)
class Source:
    """Where samplers read from: the host, or an unpacked snapshot.

    ``nvml_api`` is None for the live library; for a snapshot it replays the recording the
    snapshot holds. ``unavailable`` lists samplers a snapshot cannot replay.
    """

    sysfs: str
    nvml_api: Callable[[], NvmlApi] | None = None
    unavailable: frozenset[str] = frozenset()
    label: str = "host"


def open_source(stack: ExitStack, ns: argparse.Namespace) -> Source:
    """The host (``--path.sysfs``), or the snapshot ``--snapshot`` names, unpacked into a
    temporary directory that ``stack`` removes. ConfigError for a bad snapshot."""
    if not getattr(ns, "snapshot", None):
        return Source(str(ns.path_sysfs))
    try:
        tmp = extract(ns.snapshot)
    except SnapshotError as exc:
        raise ConfigError(str(exc)) from exc
    stack.callback(tmp.cleanup)
    unavailable = set(NOT_REPLAYABLE)
    recording_path = Path(tmp.name) / NVML_RECORDING
    nvml_api: Callable[[], NvmlApi] | None = None
    if recording_path.exists():
        try:
            recording = load(recording_path)
        except (OSError, RecordingError) as exc:
            raise ConfigError(f"{ns.snapshot}: bad {NVML_RECORDING}: {exc}") from exc
        nvml_api = partial(ReplayNvml, recording)
    else:
        unavailable.add("nvml")
    return Source(f"{tmp.name}/sys", nvml_api, frozenset(unavailable), ns.snapshot)
