"""The times ``fabricscope explain`` takes (``--since``, ``--until``, ``--change-at``): parsed
here, not in the flag types, because they are read against one "now" when the run starts."""

from __future__ import annotations

import argparse
import datetime
import time

from agent.config import parse_duration


def _is_duration(value: str) -> bool:
    try:
        parse_duration(value)
    except ValueError:
        return False
    return True


def parse_time(value: str, now: float | None = None) -> float:
    """``now``, a unix time, an RFC 3339 time (``2026-11-24T14:20:00Z``; no zone: UTC), or a
    duration ago (``2h``, ``-2h``)."""
    v = value.strip()
    now = time.time() if now is None else now
    if v == "now":
        return now
    try:
        return float(v)
    except ValueError:
        pass
    if _is_duration(v.lstrip("-")):
        return now - parse_duration(v.lstrip("-"))
    try:
        dt = datetime.datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time (now, unix seconds, RFC 3339, or a duration ago like 2h): {value!r}"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=datetime.UTC)
    return dt.timestamp()
