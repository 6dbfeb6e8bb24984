"""The measurement of one message size, torch's side of the probe worker
(:mod:`agent.probe.measure.worker` forms the group and turns these results into records).

Runs in the worker process only, after torch is imported there. A :class:`Group` is what a
measurement needs of the formed process group: its rank and size, the device, a small
tensor for agreements, the timing policy, and NCCL called directly when there is one
(:mod:`agent.probe.measure.nccl`). :func:`measure_all_reduce` and :func:`measure_sendrecv` allocate
(agreed across ranks), check the collective's result element by element, time it
(:func:`bench`: warm-up, an estimate block, then blocks until stable or capped, eager or as
a CUDA graph) and return the timing agreed over ranks with the mismatches summed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from agent.probe.measure.nccl import Nccl
from agent.probe.measure.records import detail_of
from agent.probe.measure.timing import Blocks, TimingPolicy, fastest

if TYPE_CHECKING:
    import torch
    from torch._C._distributed_c10d import Work

    #: one iteration of a measured collective: issues it, returns the works to wait for
    Issue = Callable[[], list[Work]]

log = logging.getLogger(__name__)

#: Free device memory a GPU must keep beyond the probe's buffers, for the workloads on it.
GPU_FREE_HEADROOM_BYTES = 256 << 20
#: Elements compared per step of the result check (bounds its temporary to 4 MiB of bools).
CHECK_CHUNK_ELEMENTS = 4 << 20


class Refused(Exception):  # noqa: N818 - a control-flow signal, not an error type
    """Every rank agreed not to measure this size; ``reason``/``detail`` say why."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Group:
    """What a measurement needs of the formed process group."""

    rank: int
    world_size: int
    device: torch.device
    flag: torch.Tensor  # two float64 on the device, for agreement all_reduces
    corrupt: bool
    policy: TimingPolicy
    timing: str  # "host", "graph", "eager", or "auto" (host over ``nccl``, else both, the faster)
    nccl: Nccl | None = None  # NCCL called directly on torch's communicator (GPUs)
    timeout_seconds: float = 120.0  # the spec's: bounds every wait for the GPU


@dataclass(frozen=True, slots=True)
class Timing:
    """One size's timing: mean seconds of one iteration, the iterations behind it, every
    other iteration run for the size, and how (``host``, ``graph`` or ``eager``)."""

    seconds: float
    iterations: int
    warmup: int
    method: str


def _mismatches(buf: torch.Tensor, expected: float) -> torch.Tensor:
    """The number of elements of ``buf`` not equal to ``expected`` (a 0-d int64 tensor on
    the buffer's device), compared in chunks so the temporary stays small."""
    import torch

    total = torch.zeros((), dtype=torch.int64, device=buf.device)
    for start in range(0, buf.numel(), CHECK_CHUNK_ELEMENTS):
        chunk = buf[start : start + CHECK_CHUNK_ELEMENTS]
        total += torch.count_nonzero(chunk != expected)
    return total


def _issue_block(issue: Issue, iterations: int, *, wait_at_end: bool = False) -> None:
    """``iterations`` calls of ``issue`` back to back, each call's works waited for before
    the next call (on a GPU the wait only joins the streams; on CPU, gloo's worker threads
    would otherwise run in-place collectives on one buffer at once). ``wait_at_end``: the
    works are waited for once, after the last call, what a CUDA graph's capture uses: the
    calls of one communicator run in order on its stream anyway, and a stream join per
    call cost ~6 us of GPU time per call inside a graph; torch's eager loop gained nothing
    from it (its per-call CPU cost, 37-82 us per sendrecv, varied more from run to run than
    between the two ways), both measured on one H200 (bench/probe_graph_variants.py)."""
    if not wait_at_end:
        for _ in range(iterations):
            for work in issue():
                work.wait()
        return
    works: list[Work] = []
    for _ in range(iterations):
        works += issue()
    for work in works:
        work.wait()


#: how often a bounded wait looks at its CUDA event
POLL_SECONDS = 0.0002


class Pollable(Protocol):
    """What :func:`wait_event` needs of a CUDA event."""

    def query(self) -> bool: ...


def wait_event(event: Pollable, timeout_seconds: float) -> None:
    """Wait until the GPU has passed ``event``, for at most ``timeout_seconds``.

    NCCL called directly has no watchdog: a collective whose peer vanished never completes,
    and ``event.synchronize()`` would block the worker until its launcher's deadline (many
    times the spec's timeout). This raises ``TimeoutError`` ("timed out", reason
    ``timeout``) instead, and the worker aborts the communicator."""
    deadline = time.monotonic() + timeout_seconds
    while not event.query():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"the GPU's collectives timed out after {timeout_seconds:g} s")
        time.sleep(POLL_SECONDS)


def _marker() -> torch.cuda.Event:
    """A timing CUDA event."""
    import torch

    # torch leaves Event's constructor unannotated
    event: torch.cuda.Event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    return event


def _settled(device: torch.device, timeout_seconds: float) -> None:
    """Everything issued on the current stream has run (bounded: see :func:`wait_event`)."""
    import torch

    mark = _marker()
    mark.record(torch.cuda.current_stream(device))
    wait_event(mark, timeout_seconds)


def _timed(issue: Issue, iterations: int, device: torch.device, timeout_seconds: float) -> float:
    """Mean seconds of one call over ``iterations`` back-to-back calls of ``issue``."""

    if device.type == "cuda":
        _settled(device, timeout_seconds)
        start, end = _marker(), _marker()
        start.record()
        _issue_block(issue, iterations)
        end.record()
        wait_event(end, timeout_seconds)
        return float(start.elapsed_time(end)) / 1000.0 / iterations
    began = time.perf_counter()
    _issue_block(issue, iterations)
    return (time.perf_counter() - began) / iterations


#: a completed block is waited for by spinning on its event this long before sleeping between
#: looks: the host clock stops when the wait ends, so a 0.2 ms sleep would add up to 0.2 ms to
#: a 20-call block of ~15 us calls (nccl-tests' cudaStreamSynchronize spins too)
SPIN_SECONDS = 0.05


def wait_event_spinning(event: Pollable, timeout_seconds: float) -> None:
    """:func:`wait_event`, spinning first (:data:`SPIN_SECONDS`) so the wait ends as soon as
    the GPU passes ``event``."""
    spin_until = time.monotonic() + min(SPIN_SECONDS, timeout_seconds)
    while time.monotonic() < spin_until:
        if event.query():
            return
    wait_event(event, max(0.0, timeout_seconds - SPIN_SECONDS))


def _timed_host(
    issue: Issue, iterations: int, device: torch.device, timeout_seconds: float
) -> float:
    """nccl-tests' own measurement: the host clock from just before the first of
    ``iterations`` back-to-back calls to the moment the GPU has finished the last, over
    ``iterations``. The ranks start together: every block follows the agreement all_reduce
    of the one before (:func:`_phase`), as nccl-tests' blocks follow its barrier. What it
    counts beyond the collectives' GPU time is what nccl-tests counts: the first call's
    launch and the final wait, spread over the block."""
    import torch

    # the stream is idle after the agreement before this block; check it without sleeping:
    # a 0.2 ms sleep-poll here let ranks start up to 0.2 ms apart, and a sendrecv's first
    # call waits for its peer (on a lent 4x H100 the 20-call block of a 1 MiB sendrecv read
    # 27 us a call against nccl-tests' 17)
    idle = _marker()
    idle.record(torch.cuda.current_stream(device))
    wait_event_spinning(idle, timeout_seconds)
    end = _marker()
    began = time.perf_counter()
    _issue_block(issue, iterations)
    end.record()
    wait_event_spinning(end, timeout_seconds)
    return (time.perf_counter() - began) / iterations


def _timed_graph(
    graph: torch.cuda.CUDAGraph, iterations: int, device: torch.device, timeout_seconds: float
) -> float:
    """Mean seconds of one captured iteration: one replay of ``graph`` (``iterations``
    collectives back to back) between two CUDA events."""

    _settled(device, timeout_seconds)
    start, end = _marker(), _marker()
    start.record()
    graph.replay()
    end.record()
    wait_event(end, timeout_seconds)
    return float(start.elapsed_time(end)) / 1000.0 / iterations


def _agree_means(group: Group, a: float, b: float) -> tuple[float, float]:
    """The means over ranks of ``a`` and ``b`` (identical on every rank)."""
    import torch.distributed as dist

    group.flag[0] = a
    group.flag[1] = b
    dist.all_reduce(group.flag)
    total_a, total_b = group.flag.tolist()
    return total_a / group.world_size, total_b / group.world_size


def _capture(group: Group, issue: Issue, ops: int) -> torch.cuda.CUDAGraph | None:
    """``ops`` back-to-back calls of ``issue`` captured in one CUDA graph on every rank, or
    None on every rank when the capture failed on any (agreed, so all ranks time the same
    way). Nothing runs during a capture, so a failed one leaves no collective half-done."""
    import torch

    graph: torch.cuda.CUDAGraph | None = None
    why = ""
    _settled(group.device, group.timeout_seconds)  # bounded, before torch's own synchronize
    try:
        captured = torch.cuda.CUDAGraph()
        # thread_local: NCCL's watchdog thread keeps querying events during the capture
        with torch.cuda.graph(captured, capture_error_mode="thread_local"):
            _issue_block(issue, ops, wait_at_end=True)
        graph = captured
    except Exception as exc:  # the capture is refused; the eager loop still works
        why = detail_of(exc)
    torch.cuda.synchronize(group.device)
    failed, _ = _agree_means(group, 1.0 if why else 0.0, 0.0)
    if failed > 0:
        if group.timing == "graph":
            raise Refused("init_failure", f"CUDA graph capture failed: {why or 'on a peer'}")
        log.warning("probe: CUDA graph capture failed (%s); timing the eager loop", why or "peer")
        return None
    return graph


def _phase(group: Group, policy: TimingPolicy, k: int, block: Callable[[], float]) -> Blocks:
    """Timed blocks of ``k`` iterations (``block()`` times one) until ``policy`` is done."""
    blocks = Blocks(policy, k)
    began = time.monotonic()
    while True:
        mean, elapsed = _agree_means(group, block(), time.monotonic() - began)
        blocks.add(mean)
        if blocks.done(elapsed):
            return blocks


#: host-clock blocks are short (20 calls of a small size last ~0.2 ms) and jitter more than
#: the GPU's own clock: their result is the median of the last 5, stopping early when those
#: agree within 5 %
HOST_STABLE_BLOCKS = 5
HOST_TOLERANCE = 0.05


def _host_timed(group: Group) -> bool:
    """``host`` asked for, or ``auto`` over NCCL called directly (nccl-tests' calls)."""
    return group.timing == "host" or (group.timing == "auto" and group.nccl is not None)


def bench(group: Group, issue: Issue) -> Timing:
    """Warm up and time ``issue`` (one iteration of the collective) by the group's policy.

    On a GPU under adaptive timing, ``host`` times blocks of the spec's iterations by the
    host clock (:func:`_timed_host`, nccl-tests' method), ``graph`` times captured blocks
    and ``eager`` blocks called from Python, both between CUDA events. ``auto`` is ``host``
    when NCCL is called directly, so the probe reads what nccl-tests reads for the same GPUs
    (measured side by side by ``bench/probe_accuracy.py``); over torch's calls it times
    graph and eager (each with half the time cap) and reports the faster
    (:func:`agent.probe.measure.timing.fastest` says why), eager alone when the capture fails."""
    policy = group.policy
    device = group.device
    for _ in range(policy.warmup):
        _issue_block(issue, 1)
    estimate_ops = 0
    estimate = 0.0
    if policy.adaptive:
        estimate_ops = policy.iterations
        estimate, _ = _agree_means(
            group, _timed(issue, estimate_ops, device, group.timeout_seconds), 0.0
        )
    k = policy.block_ops(estimate)
    if device.type == "cuda" and policy.adaptive and _host_timed(group):
        # nccl-tests' method and amounts: blocks of the spec's iterations (its -n), each
        # timed by the host clock, repeated until they agree or the cap
        host = replace(policy, stable_blocks=HOST_STABLE_BLOCKS, tolerance=HOST_TOLERANCE)
        blocks = _phase(
            group,
            host,
            policy.iterations,
            lambda: _timed_host(issue, policy.iterations, device, group.timeout_seconds),
        )
        timed = blocks.timed_iterations()
        run = policy.warmup + estimate_ops + blocks.run_iterations()
        return Timing(blocks.result(), timed, run - timed, "host")
    graph = None
    # NCCL called directly times best as nccl-tests does, eagerly: in a run on one H200,
    # eager sendrecvs below 16 MiB took 10-11.5 us alone but 12-20 us after a capture of
    # the same calls, so under ``auto`` only torch's calls are also timed as a graph
    wants_graph = group.timing == "graph" or (group.timing == "auto" and group.nccl is None)
    if device.type == "cuda" and policy.adaptive and wants_graph:
        graph = _capture(group, issue, k)
    phases: dict[str, Blocks] = {}
    try:
        both = graph is not None and group.timing == "auto"
        share = replace(policy, max_seconds=policy.max_seconds / 2) if both else policy
        if graph is None or both:
            phases["eager"] = _phase(
                group, share, k, lambda: _timed(issue, k, device, group.timeout_seconds)
            )
        if graph is not None:
            captured = graph
            phases["graph"] = _phase(
                group, share, k, lambda: _timed_graph(captured, k, device, group.timeout_seconds)
            )
    finally:
        if graph is not None:
            graph.reset()
    method = fastest(phases)
    timed = phases[method].timed_iterations()
    run = policy.warmup + estimate_ops + sum(b.run_iterations() for b in phases.values())
    return Timing(
        seconds=phases[method].result(),
        iterations=timed,
        warmup=run - timed,
        method=method,
    )


def _allocate(group: Group, count: int, buffers: int) -> list[torch.Tensor]:
    """``buffers`` float32 tensors of ``count`` elements on every rank, or :class:`Refused`
    on every rank when any rank lacks the memory (agreed by one small all_reduce, so no
    rank is left waiting in a collective the others skipped)."""
    import torch
    import torch.distributed as dist

    needed = buffers * count * 4
    out: list[torch.Tensor] = []
    why = ""
    if group.device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(group.device)
        if free < needed + GPU_FREE_HEADROOM_BYTES:
            why = f"{free} B free on cuda:{group.device.index}, {needed} B needed"
    if not why:
        try:
            while len(out) < buffers:
                out.append(torch.empty(count, dtype=torch.float32, device=group.device))
        except RuntimeError as exc:  # torch.OutOfMemoryError, or the CPU allocator's
            out.clear()
            why = detail_of(exc)
    group.flag.fill_(1.0 if why else 0.0)
    dist.all_reduce(group.flag)
    refusing = int(group.flag[0].item())
    if refusing:
        out.clear()
        if group.device.type == "cuda":
            torch.cuda.empty_cache()
        local = f"; here: {why}" if why else ""
        raise Refused("gpu_busy", f"{refusing} rank(s) could not allocate {needed} B{local}")
    return out


def _agree(group: Group, timing: Timing, mismatches: torch.Tensor) -> tuple[Timing, int]:
    """(the timing with its time the mean over ranks, sum over ranks of mismatching
    elements)."""
    import torch.distributed as dist

    group.flag[0] = timing.seconds
    group.flag[1] = mismatches.to(group.flag.dtype)
    dist.all_reduce(group.flag)
    total_seconds, total_bad = group.flag.tolist()
    return replace(timing, seconds=total_seconds / group.world_size), round(total_bad)


def _fill_value(group: Group) -> float:
    """What this rank puts into its buffer: ``rank + 1`` (``+ 1`` more on the highest rank
    under the corruption test hook)."""
    extra = 1.0 if group.corrupt and group.rank == group.world_size - 1 else 0.0
    return group.rank + 1.0 + extra


def _stream_of(device: torch.device) -> Callable[[], int]:
    """A function giving the current CUDA stream of ``device`` as a cudaStream_t (inside a
    capture: the capture's), asked at every call. torch's raw accessor (what Triton
    launches its kernels on) answers in well under a microsecond; the public
    ``current_stream()`` builds a Stream object each time, a cost that shows in a loop
    whose NCCL calls take ~7 us of CPU."""
    import torch

    if device.type != "cuda":
        return lambda: 0  # no stream: the CPU data plane never asks
    index = device.index if device.index is not None else torch.cuda.current_device()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return lambda: int(raw(index))
    return lambda: int(torch.cuda.current_stream(device).cuda_stream)


def measure_all_reduce(group: Group, size: int) -> tuple[Timing, int]:
    import torch.distributed as dist

    bufs = _allocate(group, size // 4, 1)
    try:
        buf = bufs[0]
        n = group.world_size
        nccl = group.nccl
        stream = _stream_of(group.device)
        address, count = buf.data_ptr(), buf.numel()

        def op() -> list[Work]:
            if nccl is not None:
                nccl.all_reduce(address, count, stream())
            else:
                # synchronous: since torch 2.8 NCCL runs it on the current stream with no
                # stream join at all (pytorch/pytorch#150398); nothing left to wait for
                dist.all_reduce(bufs[0])
            return []

        buf.fill_(_fill_value(group))
        _issue_block(op, 1)  # the checked call goes the way the timed ones go
        bad = _mismatches(buf, n * (n + 1) / 2)
        buf.zero_()
        timing = bench(group, op)
        bad += _mismatches(buf, 0.0)
        del buf
        return _agree(group, timing, bad)
    finally:
        bufs.clear()  # a traceback keeps this frame alive; it must not keep the memory


def measure_sendrecv(group: Group, size: int) -> tuple[Timing, int]:
    import torch.distributed as dist

    bufs = _allocate(group, size // 4, 2)
    ops: list[dist.P2POp] = []
    try:
        send, recv = bufs
        n = group.world_size
        send.fill_(_fill_value(group))
        recv.zero_()
        to, frm = (group.rank + 1) % n, (group.rank - 1) % n
        ops += [dist.P2POp(dist.isend, send, to), dist.P2POp(dist.irecv, recv, frm)]
        send_at, recv_at, count = send.data_ptr(), recv.data_ptr(), send.numel()
        del send
        nccl = group.nccl
        stream = _stream_of(group.device)

        def op() -> list[Work]:
            if nccl is not None:
                nccl.sendrecv(send_at, recv_at, count, to=to, frm=frm, stream=stream())
                return []
            return list(dist.batch_isend_irecv(ops))

        timing = bench(group, op)
        sender = (group.rank - 1) % n
        bad = _mismatches(recv, sender + 1.0)
        del recv
        return _agree(group, timing, bad)
    finally:
        ops.clear()  # see measure_all_reduce
        bufs.clear()
