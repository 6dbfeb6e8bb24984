"""Bisects the NVML heap corruption seen on a 2x H200 node (issue 13): which pattern of NVML
calls corrupts memory. Each variant runs in its own process under ``MALLOC_CHECK_=3`` and
faulthandler for ``--duration`` seconds; the parent reports how each ended (exit code or
signal), how many loops it ran, and the last lines of its stderr. Run on a GPU node:

    python3 bench/nvml_bisect.py --duration 240 --out DIR

Variants (one variable each):

* ``sampler_r1_xid``: the agent's NvmlSampler at rotations 1/1 with a second thread blocked
  in nvmlEventSetWait_v2 (the shape of the agent that crashed: its old XID thread).
* ``sampler_r1_noxid``: the same without the XID thread.
* ``sampler_r1_xidpoll``: the sampler as shipped now: no thread, XID events polled with a
  0 ms wait at the end of each pass (every NVML call on one thread).
* ``batch_single``: raw pynvml, one thread, one nvmlDeviceGetFieldValues per GPU holding
  every link's scoped error fields plus the GPU-level fields.
* ``batch_xidwait``: ``batch_single`` plus a second thread blocked in nvmlEventSetWait_v2.
* ``batch_two_threads``: two threads doing ``batch_single`` at once.
* ``errcounter_xidwait``: per-link nvmlDeviceGetNvLinkErrorCounter calls plus the waiting
  thread.
* ``sampler_default_xid``: the agent's defaults (18/72) with the waiting thread.
* ``forced_single``, ``forced_two_threads``, ``forced_xidwait``: the ``batch_*`` shapes with
  the link-scoped fields asked for EVERY link index the library knows (0 to
  NVML_NVLINK_MAX_LINKS - 1) whether or not the link is up, so the driver's NVLink field path
  runs even on a GPU without active NVLinks (a lone GPU of a VM).

Every ``batch``/``forced`` loop also checks the answers: each call's per-entry return codes
are compared with those of one call made before any second thread started; a call whose
codes differ is counted (``mismatches``). Concurrent nvmlDeviceGetFieldValues has been
reported to answer NOT_SUPPORTED for supported entries (DataDog/datadog-agent #54821), so a
mismatch is thread-unsafety seen without a crash.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

SCOPED = (161, 162, 163)
GPU_FIELDS = (3, 4, 94, 142, 143, 144, 145)
XID_EVENT = 0x0000000000000008  # nvmlEventTypeXidCriticalError


def _links(n: Any, h: Any) -> list[int]:
    out = []
    for link in range(int(getattr(n, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            n.nvmlDeviceGetNvLinkState(h, link)
        except n.NVMLError:
            continue
        out.append(link)
    return out


def _xid_waiter(n, handles, stop: threading.Event) -> None:  # type: ignore[no-untyped-def]
    es = n.nvmlEventSetCreate()
    for h in handles:
        with contextlib.suppress(n.NVMLError):
            n.nvmlDeviceRegisterEvents(h, XID_EVENT, es)
    while not stop.is_set():
        with contextlib.suppress(n.NVMLError):
            n.nvmlEventSetWait_v2(es, 1000)


def _codes(n: Any, h: Any, fields: list[tuple[int, int]]) -> tuple[int, ...]:
    return tuple(int(v.nvmlReturn) for v in n.nvmlDeviceGetFieldValues(h, fields))


def _raw(variant: str, deadline: float, counter: list[int]) -> None:
    import pynvml as n

    n.nvmlInit()
    handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
    if variant in EXTRA:  # before any batched call: a variant's own calls only
        EXTRA[variant](n, handles, deadline, counter)
        return
    every = range(int(getattr(n, "NVML_NVLINK_MAX_LINKS", 18)))

    def links(h: Any) -> list[int]:
        return list(every) if variant.startswith("forced_") else _links(n, h)

    fields = {
        id(h): [(f, link) for link in links(h) for f in SCOPED] + [(f, 0) for f in GPU_FIELDS]
        for h in handles
    }
    baseline = {id(h): _codes(n, h, fields[id(h)]) for h in handles}
    stop = threading.Event()
    if variant in ("batch_xidwait", "errcounter_xidwait", "forced_xidwait"):
        threading.Thread(target=_xid_waiter, args=(n, handles, stop), daemon=True).start()

    def batch_loop() -> None:
        while time.monotonic() < deadline:
            for h in handles:
                if _codes(n, h, fields[id(h)]) != baseline[id(h)]:
                    counter[1] += 1
            counter[0] += 1

    def errcounter_loop() -> None:
        links = {id(h): _links(n, h) for h in handles}
        while time.monotonic() < deadline:
            for h in handles:
                for link in links[id(h)]:
                    for c in (3, 4):  # crc_data, ecc_data
                        with contextlib.suppress(n.NVMLError):
                            n.nvmlDeviceGetNvLinkErrorCounter(h, link, c)
            counter[0] += 1

    if variant.endswith("_two_threads"):
        t = threading.Thread(target=batch_loop, daemon=True)
        t.start()
        batch_loop()
        t.join()
    elif variant == "errcounter_xidwait":
        errcounter_loop()
    else:
        batch_loop()
    stop.set()


def _loop(deadline: float, counter: list[int], body: Any) -> None:
    while time.monotonic() < deadline:
        body()
        counter[0] += 1


def _v_single_dl(n: Any, handles: list[Any], deadline: float, counter: list[int]) -> None:
    """One nvmlDeviceGetFieldValues per (DL field, link): no batching at all."""
    up = {id(h): _links(n, h) for h in handles}

    def body() -> None:
        for h in handles:
            for link in up[id(h)]:
                for f in SCOPED:
                    n.nvmlDeviceGetFieldValues(h, [(f, link)])

    _loop(deadline, counter, body)


def _v_chunks(size: int) -> Any:
    def run(n: Any, handles: list[Any], deadline: float, counter: list[int]) -> None:
        """The batch_single entries in calls of at most ``size`` entries."""
        fields = {
            id(h): [(f, link) for link in _links(n, h) for f in SCOPED]
            + [(f, 0) for f in GPU_FIELDS]
            for h in handles
        }

        def body() -> None:
            for h in handles:
                fs = fields[id(h)]
                for i in range(0, len(fs), size):
                    n.nvmlDeviceGetFieldValues(h, fs[i : i + size])

        _loop(deadline, counter, body)

    return run


def _v_gpu_fields(n: Any, handles: list[Any], deadline: float, counter: list[int]) -> None:
    """Only the GPU-level fields (ECC, PCIe replays, remapped rows), batched: no NVLink."""

    def body() -> None:
        for h in handles:
            n.nvmlDeviceGetFieldValues(h, [(f, 0) for f in GPU_FIELDS])

    _loop(deadline, counter, body)


def _v_errcounter_all(n: Any, handles: list[Any], deadline: float, counter: list[int]) -> None:
    """nvmlDeviceGetNvLinkErrorCounter for all five counters of every up link, one thread."""
    up = {id(h): _links(n, h) for h in handles}

    def body() -> None:
        for h in handles:
            for link in up[id(h)]:
                for c in range(5):
                    with contextlib.suppress(n.NVMLError):
                        n.nvmlDeviceGetNvLinkErrorCounter(h, link, c)

    _loop(deadline, counter, body)


def _v_state_all(n: Any, handles: list[Any], deadline: float, counter: list[int]) -> None:
    """nvmlDeviceGetNvLinkState for every index below the binding's NVML_NVLINK_MAX_LINKS
    (36 in nvidia-ml-py 13.6xx; Hopper has 18), the agent's link discovery, in a loop."""
    every = range(int(getattr(n, "NVML_NVLINK_MAX_LINKS", 18)))

    def body() -> None:
        for h in handles:
            for link in every:
                with contextlib.suppress(n.NVMLError):
                    n.nvmlDeviceGetNvLinkState(h, link)

    _loop(deadline, counter, body)


def _v_speed_batch(n: Any, handles: list[Any], deadline: float, counter: list[int]) -> None:
    """NVML_FI_DEV_NVLINK_GET_SPEED (164) for every up link in one call per GPU."""
    fields = {id(h): [(164, link) for link in _links(n, h)] for h in handles}

    def body() -> None:
        for h in handles:
            n.nvmlDeviceGetFieldValues(h, fields[id(h)])

    _loop(deadline, counter, body)


def _v_dl_one_link(n: Any, handles: list[Any], deadline: float, counter: list[int]) -> None:
    """The three DL fields of ONE link (the default rotation's batch shape) plus GPU fields."""
    first = {id(h): (_links(n, h) or [0])[0] for h in handles}

    def body() -> None:
        for h in handles:
            n.nvmlDeviceGetFieldValues(
                h, [(f, first[id(h)]) for f in SCOPED] + [(f, 0) for f in GPU_FIELDS]
            )

    _loop(deadline, counter, body)


def _dl_fields(n: Any, h: Any) -> list[tuple[int, int]]:
    return [(f, link) for link in _links(n, h) for f in SCOPED] + [(f, 0) for f in GPU_FIELDS]


def _v_reinit_loop(n: Any, handles: list[Any], deadline: float, counter: list[int]) -> None:
    """nvmlInit, every GPU's batched fields with fresh handles, nvmlShutdown, again: NVML's
    session started and ended over and over (a sampler closed and reopened after errors)."""
    n.nvmlShutdown()  # _raw's own init

    def body() -> None:
        n.nvmlInit()
        for i in range(n.nvmlDeviceGetCount()):
            h = n.nvmlDeviceGetHandleByIndex(i)
            n.nvmlDeviceGetFieldValues(h, _dl_fields(n, h))
        n.nvmlShutdown()

    _loop(deadline, counter, body)
    n.nvmlInit()


def _v_reinit_once(n: Any, handles: list[Any], deadline: float, counter: list[int]) -> None:
    """nvmlInit, nvmlShutdown, nvmlInit, then the batched fields with fresh handles in a loop:
    the shape of a test process that checked NVML was there (init, shutdown) before its pass."""
    n.nvmlShutdown()
    n.nvmlInit()
    fresh = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
    fields = {id(h): _dl_fields(n, h) for h in fresh}

    def body() -> None:
        for h in fresh:
            n.nvmlDeviceGetFieldValues(h, fields[id(h)])

    _loop(deadline, counter, body)


def _v_stale_handles(n: Any, handles: list[Any], deadline: float, counter: list[int]) -> None:
    """Handles fetched in one NVML session used after nvmlShutdown and a new nvmlInit: what a
    caller keeping handles across sessions would do (fabricscope's adapter drops them at
    shutdown). Shows whether NVML's handles survive a session."""
    fields = {id(h): _dl_fields(n, h) for h in handles}
    n.nvmlShutdown()
    n.nvmlInit()

    def body() -> None:
        for h in handles:
            n.nvmlDeviceGetFieldValues(h, fields[id(h)])

    _loop(deadline, counter, body)


#: raw variants beyond the batch_* / forced_* shapes (issue 30's bisection)
EXTRA: dict[str, Any] = {
    "single_dl": _v_single_dl,
    "chunk8": _v_chunks(8),
    "chunk16": _v_chunks(16),
    "chunk32": _v_chunks(32),
    "gpu_fields": _v_gpu_fields,
    "errcounter_all": _v_errcounter_all,
    "state_all": _v_state_all,
    "speed_batch": _v_speed_batch,
    "dl_one_link": _v_dl_one_link,
    "reinit_loop": _v_reinit_loop,
    "reinit_once": _v_reinit_once,
    "stale_handles": _v_stale_handles,
}


def _sampler(variant: str, deadline: float, counter: list[int]) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import pynvml as n

    from agent.nvml.api import LiveNvml
    from agent.nvml.sampler import NvmlSampler

    rot = (18, 72) if variant == "sampler_default_xid" else (1, 1)
    api = LiveNvml()
    # the fix: XID events polled by the sampling thread itself at the end of each pass
    s = NvmlSampler(
        lambda: api,
        watch_xid=variant == "sampler_r1_xidpoll",
        link_error_rotation=rot[0],
        slow_error_rotation=rot[1],
    )
    stop = threading.Event()
    s.sample()
    if variant.endswith("_xid"):  # the shape that crashed: a second thread waiting in NVML
        handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
        threading.Thread(target=_xid_waiter, args=(n, handles, stop), daemon=True).start()
    while time.monotonic() < deadline:
        s.sample()
        counter[0] += 1
        if variant == "sampler_r1_reopen" and counter[0] % 5 == 0:
            s.close()  # nvmlShutdown; the next pass opens a new NVML session
    stop.set()


def child(variant: str, duration: float, progress: Path) -> None:
    faulthandler.enable()
    deadline = time.monotonic() + duration
    counter = [0, 0]  # loops, answers differing from the single-threaded baseline

    def report() -> None:
        while True:
            progress.write_text(f"{counter[0]} {counter[1]}")
            time.sleep(1.0)

    threading.Thread(target=report, daemon=True).start()
    if variant.startswith("sampler_"):
        _sampler(variant, deadline, counter)
    else:
        _raw(variant, deadline, counter)
    progress.write_text(f"{counter[0]} {counter[1]}")


PLAN = (
    ("sampler_r1_xid", 2),
    ("sampler_r1_noxid", 2),
    ("sampler_r1_xidpoll", 1),
    ("batch_single", 2),
    ("batch_xidwait", 2),
    ("batch_two_threads", 1),
    ("errcounter_xidwait", 1),
    ("sampler_default_xid", 1),
    ("forced_single", 1),
    ("forced_two_threads", 2),
    ("forced_xidwait", 2),
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=240.0)
    ap.add_argument("--out", type=Path, default=Path("bench/out/nvml_bisect"))
    ap.add_argument(
        "--variants",
        help="comma-separated VARIANT[:REPS] to run instead of the default plan (e.g. "
        "batch_single:2,single_dl,chunk8)",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--progress", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.duration, args.progress)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, MALLOC_CHECK_="3", MALLOC_PERTURB_="165", PYTHONFAULTHANDLER="1")
    procs = []
    plan: tuple[tuple[str, int], ...] = PLAN
    if args.variants:
        plan = tuple(
            (v.partition(":")[0], int(v.partition(":")[2] or 1)) for v in args.variants.split(",")
        )
    for variant, reps in plan:
        for r in range(reps):
            tag = f"{variant}.{r}"
            err = (args.out / f"{tag}.stderr").open("w")
            prog = args.out / f"{tag}.progress"
            p = subprocess.Popen(
                [sys.executable, "-X", "faulthandler", __file__, "--child", variant,
                 "--duration", str(args.duration), "--progress", str(prog)],
                env=env, stdout=subprocess.DEVNULL, stderr=err,
            )  # fmt: skip
            procs.append((tag, p, prog, err, time.monotonic()))
    results: list[dict[str, Any]] = []
    for tag, p, prog, err, _t0 in procs:
        try:
            rc = p.wait(timeout=args.duration + 120)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
        err.close()
        loops, _, mism = (prog.read_text() if prog.exists() else "0 0").partition(" ")
        how = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}"
        tail = (args.out / f"{tag}.stderr").read_text(errors="replace").splitlines()[-12:]
        results.append(
            {"run": tag, "ended": how, "loops": int(loops or 0),
             "mismatches": int(mism or 0), "tail": tail}
        )  # fmt: skip
        print(f"{tag:24} {how:16} loops={loops} mismatches={mism or 0}", flush=True)
    (args.out / "summary.json").write_text(json.dumps(results, indent=1))
    for res in results:
        if res["ended"] != "exit 0":
            print(f"--- {res['run']}: {res['ended']}")
            print("\n".join(res["tail"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
