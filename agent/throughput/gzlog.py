"""Reading a gzip'd log (a rotated kubelet log, ``*.gz`` given to ``--throughput.file``):
whole or its last bytes, streamed in chunks, in bounded memory. Such a file never grows: it
is read once, never tailed."""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from collections import Counter
from typing import BinaryIO

from agent.throughput.lines import LineSink, LineSplitter
from agent.throughput.openlog import classify, open_log
from agent.throughput.tail import Limits


def gzip_size(f: BinaryIO) -> int | None:
    """The uncompressed size of a single-member gzip file (its trailer, mod 2**32); the
    file is left at its start."""
    try:
        f.seek(-4, os.SEEK_END)
        (size,) = struct.unpack("<I", f.read(4))
        f.seek(0)
        return int(size)
    except (OSError, struct.error):
        return None  # too short or unreadable: the gzip read that follows says which


def read_gzip_tail(
    path: str,
    sink: LineSink,
    counts: Counter[str],
    *,
    cri: bool,
    limits: Limits,
    root: str | None = None,
) -> tuple[str, str] | None:
    """Read a gzip'd log (a rotated kubelet log, a compressed plain log): its last
    ``limits.initial_bytes`` of uncompressed content, or all of it when that is None.
    Decompression streams in chunks: memory stays bounded whatever the file's size.
    ``root``: as :class:`FileTail`'s (no symlink, nothing outside it)."""
    opened = open_log(path, counts, root)
    if isinstance(opened, tuple):
        return opened
    raw = os.fdopen(opened, "rb")
    split = LineSplitter(sink, counts, cri=cri, max_line_bytes=limits.max_line_bytes)
    skip = 0
    size = gzip_size(raw)
    if limits.initial_bytes is not None and size is not None and size > limits.initial_bytes:
        skip = size - limits.initial_bytes
        split.skip_to_next_line()
    try:
        with raw, gzip.GzipFile(fileobj=raw, mode="rb") as f:
            while skip > 0:
                dropped = f.read(min(skip, limits.chunk_bytes))
                if not dropped:
                    break
                skip -= len(dropped)
            while True:
                data = f.read(limits.chunk_bytes)
                if not data:
                    break
                split.feed(data)
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        counts["gzip"] += 1
        return "gzip", f"not a readable gzip file: {exc}"
    except OSError as exc:
        reason = classify(exc)
        counts[reason] += 1
        return reason, exc.strerror or str(exc)
    return None
