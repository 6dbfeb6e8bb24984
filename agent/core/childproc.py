"""The supervised child's side of :mod:`agent.core.isolation`: run as
``python -m agent.core.childproc`` (a fresh interpreter: no inherited threads, fds, signal
handlers or library state), it reads an ``init`` frame naming a sampler factory, sets its
memory ceiling (:mod:`agent.core.ceiling`), builds the sampler once and answers ``sample``
requests until the pipe closes (see :mod:`agent.core.isolation` for the protocol and its
failures). After each pass it hands the memory its C allocator holds free back to the
kernel (:func:`agent.core.allocator.trim`), so what a pass allocated does not stay resident
until the next.

It imports only what a child needs (the frames, the ceiling, logging, ``/proc`` reading), not
the supervisor's ``subprocess``: each child pays for its own imports.

Every :data:`COLLECT_EVERY` passes it runs a full garbage collection, which also empties the
interpreter's free lists. CPython keeps up to 2,000 freed tuples of each length from 1 to 19
for reuse, and a pass can free more tuples of one length than it takes (a tuple built from an
iterator is allocated at one length and resized to another; pickling makes tuples its
unpickling does not): that length's list then grows by a few tuples a pass until it holds
2,000. In the NVML child that was 0.6 MiB of resident memory over its first 2,000 passes (an
hour at the default interval, eight at two minutes). Emptied every few dozen passes, a list
never holds more than those passes' tuples. The objects the child holds once its sampler is
built (its modules, the library's state) are moved out of the collector's sight
(``gc.freeze``), so a collection walks only what the passes made (under a millisecond).
"""

from __future__ import annotations

import faulthandler
import gc
import importlib
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from typing import cast

from agent.core.allocator import trim
from agent.core.ceiling import apply_ceiling, near_ceiling
from agent.core.errors import NoData, SamplerFailure
from agent.core.frames import Setting, encode, read_frame
from agent.core.logsetup import setup_logging
from agent.core.procstat import boot_time, read_process
from agent.core.reaper import become_subreaper, kill_descendants, reap_strays
from agent.core.sampler import Sampler

log = logging.getLogger(__name__)

#: passes between two full garbage collections, which empty the free lists (see above)
COLLECT_EVERY = 64


def _die_with_parent(parent: int, every: float = 1.0) -> None:
    """Exit when the agent is gone, even while the sampler hangs in the library: a thread
    that only compares ``getppid()`` (it never calls the library). Not PR_SET_PDEATHSIG: that
    fires when the parent *thread* that started the child exits, and the runner starts it
    from a short-lived one."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every)
        kill_descendants(os.getpid())  # a tool it was running goes with it
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _stats(booted: float | None) -> tuple[int, float, int, int | None, float | None]:
    """(pid, CPU seconds, RSS bytes, open fds, start time): plain values, since the child
    runs this module as ``__main__`` and a class of its own would not unpickle in the agent."""
    st = read_process(booted=booted)
    if st is None:  # /proc unreadable: what the process knows of itself
        t = os.times()
        return os.getpid(), t.user + t.system, 0, None, None
    return st.pid, st.cpu_seconds, st.rss_bytes, st.open_fds, st.start_time_seconds


def _build(factory: str, kwargs: Mapping[str, Setting]) -> Sampler:
    module, _, attr = factory.partition(":")
    fn = getattr(importlib.import_module(module), attr)
    return cast(Sampler, fn(**kwargs))


def _set_ceiling(ceiling: int | None) -> int | None:
    """Apply the memory ceiling the agent gave (None: none); the ceiling in force."""
    if not ceiling:
        return None
    try:
        apply_ceiling(int(ceiling))
    except (OSError, ValueError) as exc:  # a hard limit or a kernel that refuses: say so
        log.warning("cannot set this child's memory ceiling of %d bytes: %s", ceiling, exc)
        return None
    return int(ceiling)


def child_main() -> int:
    """The child: build the sampler, answer ``sample`` requests until the pipe closes."""
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # a library printing to stdout lands on stderr, not in the frames
    faulthandler.enable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C: the agent decides
    become_subreaper()  # what a tool it runs leaves behind stays in this tree
    inp = sys.stdin.buffer
    init = read_frame(inp)
    if init is None or init[0] != "init" or len(init) != 9:
        print(f"fabricscope isolation child: expected init, got {init!r}", file=sys.stderr)
        return 2
    _, factory, kwargs, level, fmt, parent, first_limit, limit, ceiling = init
    setup_logging(str(level), str(fmt))
    memory = _set_ceiling(cast(int | None, ceiling))
    _die_with_parent(int(cast(int, parent)))
    sampler = _build(str(factory), cast(Mapping[str, Setting], kwargs))
    gc.collect()  # what building left behind, then what is left is the child's for good
    gc.freeze()
    passes = 0
    booted = boot_time()
    try:
        while True:
            request = read_frame(inp)
            if request is None or request[0] == "close":
                break
            if request[0] == "resume":  # the state the child it replaces last reported
                accept_resume = getattr(sampler, "accept_resume", None)
                if callable(accept_resume) and len(request) > 1:
                    try:
                        accept_resume(request[1])
                    except Exception as exc:
                        log.warning("cannot resume from the previous child's state: %r", exc)
                continue
            reply: tuple[object, ...]
            # a pass stuck in C code that holds the GIL (a backtracking regex) starves the
            # parent-watch thread; faulthandler's watchdog is a C thread: it ends this process
            # even then, should the agent be gone and unable to kill it
            faulthandler.dump_traceback_later(
                float(cast(float, first_limit if passes == 0 else limit)), exit=True
            )
            passes += 1
            try:
                if len(request) > 1:
                    accept = getattr(sampler, "accept_inputs", None)
                    if not callable(accept):
                        raise TypeError(f"{factory} takes no inputs")
                    accept(request[1])
                reply = ("ok", sampler.sample())
            except MemoryError as exc:
                reply = ("ceiling", f"MemoryError in a pass: {str(exc)[:200] or 'no detail'}")
            except NoData as exc:
                reply = ("nodata", str(exc))
            except SamplerFailure as exc:
                reply = ("failure", exc.reason, str(exc))
            except Exception as exc:
                log.debug("sampler failed in the child", exc_info=exc)
                text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                reply = ("error", text)
            faulthandler.cancel_dump_traceback_later()
            if passes % COLLECT_EVERY == 0:
                gc.collect()  # empties the free lists too, before trim hands memory back
            trim()  # what the pass freed goes back to the kernel, not kept for the next
            used = near_ceiling(memory)
            if used is not None and reply[0] != "ceiling":
                reply = ("ceiling", f"{used >> 20} MiB in use after a pass")
            try:
                frame = encode((*reply, _stats(booted)))
            except Exception as exc:  # a snapshot that does not pickle: a bug, reported
                frame = encode(("error", f"cannot send the answer: {exc!r}", _stats(booted)))
            out.write(frame)
            if reply[0] == "ceiling":
                break
    finally:
        close = getattr(sampler, "close", None)
        if callable(close):
            close()
        reap_strays()
    return 0


if __name__ == "__main__":
    sys.exit(child_main())
