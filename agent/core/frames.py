"""The pipe between the agent and a supervised child (:mod:`agent.core.isolation`): frames
both ways are a 4-byte big-endian length and a pickle of a tuple of plain values
(:data:`Setting`) and the samplers' frozen snapshot dataclasses. The child reads with
:func:`read_frame` (blocking); the parent writes with :func:`write_all` and reads with
:class:`FrameReader`, both against a deadline (a child that stops reading or answering costs
the deadline, never the agent's thread).

Imports the standard library only.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import time
from collections.abc import Callable
from typing import BinaryIO, TypeAlias

_HEADER = struct.Struct(">I")
#: the largest frame accepted (a snapshot of a large node is well under 1 MiB)
MAX_FRAME_BYTES = 64 << 20

#: a plain value that travels to the child (a factory's keyword arguments)
Setting: TypeAlias = bool | int | float | str | None


class Died(Exception):  # noqa: N818 - control flow between this module and the supervisor
    """The child closed the pipe or sent what is not a frame."""


class Hung(Exception):  # noqa: N818
    """The deadline passed."""


def encode(message: tuple[object, ...]) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


def _read_exact(stream: BinaryIO, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(stream: BinaryIO) -> tuple[object, ...] | None:
    """One frame from a blocking stream; None at end of stream."""
    head = _read_exact(stream, _HEADER.size)
    if head is None:
        return None
    (size,) = _HEADER.unpack(head)
    if size > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {size} bytes exceeds {MAX_FRAME_BYTES}")
    body = _read_exact(stream, size)
    if body is None:
        return None
    message = pickle.loads(body)
    if not isinstance(message, tuple):
        raise ValueError(f"frame holds a {type(message).__name__}, not a tuple")
    return message


def write_all(fd: int, data: bytes, deadline: float) -> None:
    """Write ``data`` to the non-blocking pipe ``fd`` by ``deadline`` (monotonic); raises
    Hung past it, BrokenPipeError when the child closed its end."""
    view = memoryview(data)
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    while view:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Hung()
        if not poll.poll(max(1, int(left * 1000) + 1)):
            continue
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            continue
        view = view[n:]


class FrameReader:
    """Reads frames from a pipe's fd with a deadline (the parent side)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buf = bytearray()
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)

    def read(
        self, timeout: float, tick: Callable[[], None] | None = None, every: float = 0.05
    ) -> tuple[object, ...]:
        """Raises Died at end of stream, Hung after ``timeout`` seconds; calls ``tick`` at
        least every ``every`` seconds while it waits."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self._buf) >= _HEADER.size:
                (size,) = _HEADER.unpack_from(self._buf)
                if size > MAX_FRAME_BYTES:
                    raise Died(f"sent a frame of {size} bytes")
                end = _HEADER.size + size
                if len(self._buf) >= end:
                    body = bytes(self._buf[_HEADER.size : end])
                    del self._buf[:end]
                    message = pickle.loads(body)
                    if not isinstance(message, tuple):
                        raise Died(f"sent a {type(message).__name__}")
                    return message
            left = deadline - time.monotonic()
            if left <= 0:
                raise Hung()
            wait = left if tick is None else min(left, every)
            ready = self._poll.poll(max(1, int(wait * 1000) + 1))
            if tick is not None:
                tick()
            if not ready:
                continue
            chunk = os.read(self._fd, 1 << 20)
            if not chunk:
                raise Died("closed the pipe")
            self._buf += chunk
