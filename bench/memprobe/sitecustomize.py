"""A memory probe for the soak (``bench/soak.py --probe DIR`` or ``--leak N``), loaded into the
agent through ``PYTHONPATH`` (Python imports ``sitecustomize`` at start-up), never part of the
agent: with neither variable below set it does nothing. The supervised children run without
start-up hooks (``python -S``), so it reaches the main process only; a child's memory is
measured alone, pass by pass, by ``bench/bench_child_passes.py``.

``FABRICSCOPE_MEMPROBE=DIR``: a daemon thread that every ``FABRICSCOPE_MEMPROBE_EVERY``
seconds (60) appends one JSON line to ``DIR/<pid>.jsonl``: RSS and anonymous RSS by mapping
(``/proc/self/smaps``), the count of live container objects by type (``gc.get_objects``),
glibc's ``mallinfo2`` (arena bytes in use and free, mmapped bytes), pymalloc's arenas and
blocks (``sys._debugmallocstats``) and, with ``FABRICSCOPE_MEMPROBE_TRACE=1`` (the default;
``children``: in the supervised children only),
tracemalloc's traced bytes and the 25 source lines whose traced memory changed most since
the first dump (``FABRICSCOPE_MEMPROBE_FRAMES``: frames kept per trace, 1; with more, grouped
by traceback; ``FABRICSCOPE_MEMPROBE_BASE``: seconds before that first dump is taken, 0;
tracemalloc costs far more memory than it measures: read its RSS as
perturbed). ``FABRICSCOPE_MEMPROBE_GARBAGE=1``: the collector keeps what it finds unreachable
(``gc.DEBUG_SAVEALL``) and each dump counts it by type (a frame or function by its code's
name, an exception by its class) before letting it go: what the process leaves to the
collector, in reference cycles, between dumps. ``FABRICSCOPE_MEMPROBE_TRIM=1`` calls
``malloc_trim(0)`` at each dump and records what it gave back.

The census of objects (``gc.get_objects`` from the probe's thread) can hand out a tuple that
another thread is still building (``tuple(iterable)`` resizes it in place): that thread's
pass then fails with ``SystemError: Objects/tupleobject.c: bad argument to internal
function`` (CPython gh-107137, fixed in 3.13), a sampler failure the probe causes, logged
with its traceback.

``FABRICSCOPE_MEMPROBE_LEAK=N``: the main process keeps N more bytes every second (the
soak's positive control)."""

from __future__ import annotations

import os

_DIR = os.environ.get("FABRICSCOPE_MEMPROBE")


def _start(directory: str) -> None:
    import collections
    import ctypes
    import gc
    import json
    import sys
    import threading
    import time
    import tracemalloc
    import types

    # "children": the supervised children only (``python -m agent.core.isolation``: no
    # arguments), which leaves the main process at its own speed
    want = os.environ.get("FABRICSCOPE_MEMPROBE_TRACE", "1")
    trace = want == "1" or (want == "children" and len(sys.argv) <= 1)
    trim = os.environ.get("FABRICSCOPE_MEMPROBE_TRIM") == "1"
    frames = int(os.environ.get("FABRICSCOPE_MEMPROBE_FRAMES", "1"))
    base_after = float(os.environ.get("FABRICSCOPE_MEMPROBE_BASE", "0"))
    if trace:
        tracemalloc.start(frames)
    garbage = os.environ.get("FABRICSCOPE_MEMPROBE_GARBAGE") == "1"
    if garbage:
        gc.set_debug(gc.DEBUG_SAVEALL)

    def kind(o: object) -> str:
        t = type(o)
        code = o.f_code if t is types.FrameType else o.__code__ if t is types.FunctionType else None
        if code is not None:
            return f"{t.__name__} {code.co_filename.rsplit('/', 2)[-1]}:{code.co_qualname}"
        if issubclass(t, BaseException):
            return f"exception {t.__module__}.{t.__qualname__}"
        if t.__module__ != "builtins":
            return f"{t.__module__}.{t.__qualname__}"
        return t.__name__

    every = float(os.environ.get("FABRICSCOPE_MEMPROBE_EVERY", "60"))

    class Mallinfo2(ctypes.Structure):
        _fields_ = [
            (n, ctypes.c_size_t)
            for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                      "uordblks", "fordblks", "keepcost")
        ]  # fmt: skip

    try:
        libc = ctypes.CDLL(None)
        libc.mallinfo2.restype = Mallinfo2
    except (OSError, AttributeError):
        libc = None

    def smaps() -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        name = ""
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):
                    parts = line.split()
                    name = parts[5] if len(parts) > 5 else "[anon]"
                    if name.startswith("/"):
                        name = "file:" + name.rsplit("/", 1)[-1]
                elif head == "Rss:":
                    out.setdefault(name, [0, 0])[0] += int(line.split()[1])
                elif head == "Anonymous:":
                    out.setdefault(name, [0, 0])[1] += int(line.split()[1])
        return {k: v for k, v in out.items() if v[0] >= 64}

    def pymalloc() -> dict[str, int]:
        """pymalloc's arenas and blocks (``sys._debugmallocstats`` writes them to stderr:
        fd 2 is pointed at a file for the call)."""
        import tempfile

        out: dict[str, int] = {}
        with tempfile.TemporaryFile("w+") as tmp:
            sys.stderr.flush()
            saved = os.dup(2)
            try:
                os.dup2(tmp.fileno(), 2)
                sys._debugmallocstats()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            tmp.seek(0)
            for line in tmp:
                key, sep, value = line.partition("=")
                if sep and key.startswith("#"):
                    out[key.strip("# ").strip()] = int(value.strip().replace(",", ""))
                elif sep and "unused pools" in key:
                    out["unused pools bytes"] = int(value.strip().replace(",", ""))
        return out

    def run() -> None:
        path = os.path.join(directory, f"{os.getpid()}.jsonl")
        first = None
        t0 = time.monotonic()
        while True:
            time.sleep(every)
            top: list[list[object]] = []
            if trace:
                snap = tracemalloc.take_snapshot()
                if first is None:
                    if time.monotonic() - t0 >= base_after:
                        first = snap
                else:
                    group = "lineno" if frames == 1 else "traceback"
                    top = [
                        [" <- ".join(map(str, reversed(s.traceback))), s.size_diff, s.count_diff]
                        for s in snap.compare_to(first, group)[:25]
                    ]
                del snap
            trimmed = None
            if trim and libc is not None:
                before = sum(v[0] for v in smaps().values())
                libc.malloc_trim(0)
                trimmed = before - sum(v[0] for v in smaps().values())
            cycles: dict[str, int] = {}
            if garbage:
                gc.collect()
                cycles = dict(collections.Counter(kind(o) for o in gc.garbage).most_common(40))
                cycles["(all)"] = len(gc.garbage)
                del gc.garbage[:]
            counts = collections.Counter(type(o).__name__ for o in gc.get_objects())
            mi = libc.mallinfo2() if libc is not None else None
            record = {
                "t": round(time.monotonic() - t0, 1),
                "argv": sys.argv[:3],
                "threads": threading.active_count(),
                "traced": tracemalloc.get_traced_memory()[0] if trace else None,
                "trimmed_kib": trimmed,
                "pymalloc": pymalloc(),
                "smaps_kib": smaps(),
                "objects": dict(counts.most_common(40)),
                "gc_objects": sum(counts.values()),
                "mallinfo": {n: getattr(mi, n) for n, _ in Mallinfo2._fields_} if mi else None,
                "top": top,
                "garbage": cycles,
            }
            with open(path, "a") as f:
                f.write(json.dumps(record) + "\n")

    threading.Thread(target=run, name="memprobe", daemon=True).start()


def _leak(rate: int) -> None:
    """A planted leak (``FABRICSCOPE_MEMPROBE_LEAK``: bytes a second, kept and touched),
    the soak's positive control: a run with it must fail the soak's check."""
    import threading
    import time

    kept: list[bytearray] = []

    def run() -> None:
        # what is kept follows the clock, not the ticks: a starved thread catches up
        start = time.monotonic()
        held = 0
        while True:
            time.sleep(1)
            owed = int((time.monotonic() - start) * rate) - held
            if owed > 0:
                kept.append(bytearray(b"x" * owed))
                held += owed

    threading.Thread(target=run, name="memprobe-leak", daemon=True).start()


if _DIR:
    _start(_DIR)
# the leak is planted in the first process only (the agent's main process): the children it
# starts copy its environment, without it
_LEAK = os.environ.pop("FABRICSCOPE_MEMPROBE_LEAK", "")
if _LEAK:
    _leak(int(_LEAK))
