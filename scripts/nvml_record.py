#!/usr/bin/env python3
"""Record every NVML answer this machine gives to one full fabricscope sampling pass (XID
event-set creation and registration included) into a JSON file that
``agent.nvml.record.ReplayNvml`` replays exactly::

    python scripts/nvml_record.py -o tests/fixtures/nvml/h200x2.recording.json

Reads only: no CUDA context, no GPU memory, no counter resets. Exit status 0 when written,
1 when this machine has no NVIDIA driver or GPU, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.core.errors import NoData
from agent.nvml.api import LiveNvml, NvmlApi
from agent.nvml.record import JsonValue, dumps, record


def _pynvml_version() -> str | None:
    try:
        return metadata.version("nvidia-ml-py")
    except metadata.PackageNotFoundError:
        return None


def main(argv: Sequence[str] | None = None, api_factory: Callable[[], NvmlApi] = LiveNvml) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("-o", "--output", required=True, help="recording file to write (JSON)")
    p.add_argument(
        "--xid-seconds",
        type=float,
        default=2.0,
        help="seconds to listen for XID events after the pass (default 2)",
    )
    ns = p.parse_args(argv)
    host: dict[str, JsonValue] = {
        "pynvml": _pynvml_version(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "recorded_with": "scripts/nvml_record.py",
    }
    try:
        recording, snap = record(api_factory(), xid_seconds=ns.xid_seconds, host=host)
    except NoData as exc:
        print(f"nothing to record: {exc}", file=sys.stderr)
        return 1
    Path(ns.output).write_text(dumps(recording))
    calls = recording["calls"]
    assert isinstance(calls, dict)
    errors = sum(1 for v in calls.values() if isinstance(v, dict) and "error" in v)
    links = sum(1 for g in snap.gpus for link in g.nvlinks if link.up)
    print(
        f"{ns.output}: {len(snap.gpus)} GPU(s), {links} NVLink(s) up, {len(calls)} answers "
        f"({errors} errors), {len(snap.issues)} issue(s), driver {snap.driver_version}"
    )
    for issue in snap.issues:
        print(f"  issue: {issue.path}: {issue.reason}: {issue.detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
