"""The probe worker: ``python -m agent.probe.measure.worker --spec JSON`` (or ``--spec-file F``).

One worker process per rank; the worker never spawns other processes. Whoever starts a
probe starts one worker per rank (:mod:`agent.probe.measure.launch`): the agent's probe service for
node pairs (one worker per node), and :func:`agent.probe.measure.launch.run_local` for a
single-node probe (all ranks as subprocesses on this host, returning rank 0's records).
This module is importable by the resident agent: torch is imported only inside
:func:`run`, in the worker process, after the NCCL environment defaults are set.

What it does, per message size of the spec (:mod:`agent.probe.measure.records` holds the spec and
the record):

- ``all_reduce``: a float32 buffer holding ``rank + 1`` on each rank is summed once and
  checked element by element against ``n (n + 1) / 2`` (integer-valued float32 sums are
  exact); then the buffer is zeroed, ``warmup`` untimed and ``iterations`` timed in-place
  all_reduces run, and the buffer is checked to be still all zero. busbw = algbw x
  2(n-1)/n.
- ``sendrecv``: each rank sends its buffer to rank + 1 and receives from rank - 1 at the
  same time (isend/irecv batched, as nccl-tests' sendrecv_perf; with two ranks, 0 and 1
  exchange); the received buffer is checked against the sender's ``rank + 1``.
  busbw = algbw.
- ``latency``: as ``all_reduce`` at 8 bytes; ``time_seconds`` is the latency.

Timing (:mod:`agent.probe.measure.timing` says how much): as nccl-tests, warm-up iterations, then
back-to-back iterations timed as one loop, the mean of one iteration reported; adaptive on
GPUs (blocks of iterations until the timing is stable or a time cap). On GPUs the timed
calls are NCCL's own, made through ctypes on the communicator torch built
(:mod:`agent.probe.measure.nccl`: torch.distributed's calls cost 37-82 us of CPU each, NCCL's
~10 us), unless this torch gives no communicator, when they are torch's. ``timing: eager``
calls them from Python between two CUDA events, as nccl-tests does from C; ``graph`` makes
a block one CUDA graph holding ``k`` captured calls, replayed between the events; ``auto``
(the default) is eager over NCCL's own calls, and over torch's times both, each with half
the time cap, and reports the faster (eager when the capture fails). On CPU (gloo) it is
the eager loop timed with ``perf_counter``. Block times are averaged over ranks before any
decision, and mismatch counts summed, so every rank takes the same decisions and prints the
same numbers. The record's ``iterations`` are those behind the figure, ``warmup`` every
other iteration run for that size.
A wrong element anywhere is ``correct: false`` with reason ``wrong_result``.

Failures are records, never exit codes: exactly one record per size, in order, whatever
happens. A size whose two buffers exceed ``max_memory_bytes`` is refused before anything is
allocated (reason ``init_failure``); a rank that cannot allocate, or a GPU with too little
free memory, makes every rank record ``gpu_busy`` for that size; a rendezvous that does not
complete within ``timeout_seconds`` is ``peer_unreachable``; a collective that times out
is ``timeout`` (gloo raises; NCCL's own calls are waited for at most ``timeout_seconds``,
then the communicator is aborted; torch's NCCL watchdog ends the process instead, which
the caller records as ``timeout``/``crashed``). After a collective fails the remaining
sizes are not attempted and carry the same reason. Exit code 0 with records; 2 only for
usage errors.

stdout carries records only: the worker moves the original stdout aside for them and points
file descriptor 1 at stderr before torch loads, so NCCL_DEBUG or library prints cannot
interleave with records.

Test hook: ``FABRICSCOPE_PROBE_CORRUPT=1`` in the worker's environment makes the highest
rank put ``rank + 2`` instead of ``rank + 1`` into its buffer, a stand-in for silent data
corruption, so tests can see ``wrong_result`` end to end. Never set it in production.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import os
import socket
import sys
from collections.abc import Callable, MutableMapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from agent.core.logsetup import LEVELS, setup_logging
from agent.probe.measure import collectives, formulas
from agent.probe.measure.nccl import Nccl, attach
from agent.probe.measure.records import (
    ProbeError,
    ProbeRecord,
    Ranks,
    SpecError,
    WorkerSpec,
    detail_of,
    failure_record,
    memory_needed_bytes,
    parse_spec,
    resolve_sizes,
    spec_device,
    to_json,
)
from agent.probe.measure.timing import (
    CPU_MAX_SECONDS_PER_SIZE,
    GPU_MAX_SECONDS_PER_SIZE,
    MAX_BLOCK_OPS,
    TimingPolicy,
)

if TYPE_CHECKING:
    import torch
    from torch._C._distributed_c10d import TCPStore

log = logging.getLogger("agent.probe.measure.worker")  # not "__main__" under -m

#: Set (if unset) in the worker before torch loads, and in run_local's children.
NCCL_ENV_DEFAULTS = (
    ("NCCL_NVLS_ENABLE", "0"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
    # half NCCL's default 4 MiB staging buffers: on 2 H200s a probe at the default sizes
    # then peaked at 1993 MiB of GPU memory per GPU instead of 2105 MiB (the 2 GiB bound),
    # with busbw at 64 MiB unchanged within 1 % (set it in the environment to override)
    ("NCCL_BUFFSIZE", "2097152"),
)
CORRUPT_ENV = "FABRICSCOPE_PROBE_CORRUPT"
#: "1": time torch.distributed's NCCL calls instead of NCCL's own (a comparison knob)
TORCH_DATAPLANE_ENV = "FABRICSCOPE_PROBE_TORCH_DATAPLANE"
USAGE_EXIT = 2
RANK_ID_BYTES = 256


def apply_env_defaults(env: MutableMapping[str, str]) -> None:
    """Set the NCCL / symmetric-memory settings every probe runs with, unless already set."""
    for key, value in NCCL_ENV_DEFAULTS:
        env.setdefault(key, value)


def init_method(addr: str, port: int) -> str:
    """``tcp://addr:port``, with IPv6 addresses bracketed."""
    host = f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr
    return f"tcp://{host}:{port}"


def _type_names(exc: BaseException) -> frozenset[str]:
    return frozenset(c.__name__ for c in type(exc).__mro__)


def init_reason(type_names: frozenset[str], message: str) -> str:
    """The reason for a failed rendezvous: peers that never came (rank 0 waiting for
    clients, another rank unable to reach rank 0) are ``peer_unreachable``; the rest
    (NCCL or CUDA failing to start, a bad device) ``init_failure``."""
    text = message.lower()
    if {"DistNetworkError", "DistStoreError"} & type_names or "timed out" in text:
        return "peer_unreachable"
    return "init_failure"


def run_reason(type_names: frozenset[str], message: str) -> str:
    """The reason for a failed measurement, from the exception a collective raised."""
    text = message.lower()
    if "OutOfMemoryError" in type_names:
        return "gpu_busy"
    if "timed out" in text or "timeout" in text:
        return "timeout"
    peer_gone = (
        "connection closed",
        "connection reset",
        "connection refused",
        "broken pipe",
        "ncclremoteerror",  # NCCL called directly: a peer failed
    )
    if "DistNetworkError" in type_names or any(p in text for p in peer_gone):
        return "peer_unreachable"
    return "crashed"


def measured_record(
    spec: WorkerSpec,
    backend: str,
    size: int,
    *,
    time_seconds: float,
    mismatches: int,
    ranks: Ranks,
    iterations: int | None = None,
    warmup: int | None = None,
) -> ProbeRecord:
    """The record of a measurement: bandwidths by nccl-tests' formulas (none for latency);
    any mismatching element makes it ``wrong_result``. ``iterations``/``warmup``: what the
    timing ran (default: the spec's)."""
    alg: float | None = None
    bus: float | None = None
    if spec.kind != "latency" and time_seconds > 0:
        alg = formulas.algbw(size, time_seconds)
        bus = formulas.busbw(spec.kind, size, time_seconds, spec.world_size)
    error = None
    if mismatches:
        error = ProbeError(
            "wrong_result",
            f"{mismatches} of {size // 4} float32 elements differ from the expected values "
            f"(summed over {spec.world_size} ranks)",
        )
    return ProbeRecord(
        kind=spec.kind,
        backend=backend,
        world_size=spec.world_size,
        size_bytes=size,
        iterations=spec.iterations if iterations is None else iterations,
        warmup=spec.warmup if warmup is None else warmup,
        time_seconds=time_seconds,
        algbw_bytes_per_second=alg,
        busbw_bytes_per_second=bus,
        correct=not mismatches,
        error=error,
        peer=spec.peer,
        src=spec.src,
        dst=spec.dst,
        ranks=ranks,
    )


def oversize_detail(size: int, max_memory_bytes: int) -> str | None:
    """Why ``size`` is refused under the memory bound, or None when it fits."""
    needed = memory_needed_bytes(size)
    if needed <= max_memory_bytes:
        return None
    return (
        f"size {size} B needs {needed} B (two buffers), above max_memory_bytes "
        f"{max_memory_bytes} B; not allocated"
    )


def timing_policy(spec: WorkerSpec, backend: str) -> TimingPolicy:
    """The spec's timing amounts; a cap of None is the backend's default."""
    cap = spec.max_seconds_per_size
    if cap is None:
        cap = GPU_MAX_SECONDS_PER_SIZE if backend == "nccl" else CPU_MAX_SECONDS_PER_SIZE
    return TimingPolicy(
        warmup=spec.warmup,
        iterations=spec.iterations,
        max_seconds=cap,
        max_block_ops=max(MAX_BLOCK_OPS, spec.iterations),
    )


def _rendezvous_store(spec: WorkerSpec, timeout: datetime.timedelta) -> TCPStore:
    """torch.distributed's TCP store (what ``init_method="tcp://addr:port"`` builds), with
    rank 0 listening on ``master_addr`` only: torch's own store listens on every interface,
    and a probe has no business accepting connections on them. Rank 0 waits up to
    ``timeout`` for all ranks to connect (``DistStoreError``); the others retry connecting
    for as long (``DistNetworkError``)."""
    # torch.distributed.TCPStore, imported from where it is defined: torch's re-export of
    # it is not marked as one for type checkers
    from torch._C._distributed_c10d import TCPStore

    if spec.rank != 0:
        return TCPStore(spec.master_addr, spec.master_port, spec.world_size, False, timeout=timeout)
    family = socket.AF_INET6 if ":" in spec.master_addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((spec.master_addr.strip("[]"), spec.master_port))
        sock.listen(128)
        listen_fd = sock.detach()
    # The store owns the socket from here, also when it gives up waiting for the other
    # ranks (it has closed the descriptor by then: closing it again could close another).
    return TCPStore(
        spec.master_addr,
        spec.master_port,
        spec.world_size,
        True,
        timeout=timeout,
        master_listen_fd=listen_fd,
    )


def _form_group(
    spec: WorkerSpec, backend: str, device: torch.device, *, corrupt: bool
) -> tuple[collectives.Group, Ranks]:
    """Join the process group (bounded by ``timeout_seconds``) and learn every rank's
    (host, device)."""
    import torch
    import torch.distributed as dist

    use_cuda = device.type == "cuda"
    if use_cuda:
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=spec.timeout_seconds)
    dist.init_process_group(
        backend,
        store=_rendezvous_store(spec, timeout),
        rank=spec.rank,
        world_size=spec.world_size,
        timeout=timeout,
        device_id=device if use_cuda else None,
    )
    host = spec.host or socket.gethostname()
    ranks = _gather_ranks(spec.world_size, host, device.index if use_cuda else None, device)
    flag = torch.zeros(2, dtype=torch.float64, device=device)
    nccl: Nccl | None = None
    if use_cuda and os.environ.get(TORCH_DATAPLANE_ENV) != "1":
        nccl, why = attach(dist.distributed_c10d._get_default_group(), device)
        if nccl is None:
            log.warning("probe: timing torch.distributed's calls (%s)", why)
        else:
            log.info("probe: calling NCCL %s directly on torch's communicator", nccl.version)
    group = collectives.Group(
        rank=spec.rank,
        world_size=spec.world_size,
        device=device,
        flag=flag,
        corrupt=corrupt,
        policy=timing_policy(spec, backend),
        timing=spec.timing,
        nccl=nccl,
        timeout_seconds=spec.timeout_seconds,
    )
    return group, ranks


def run(spec: WorkerSpec, emit: Callable[[ProbeRecord], None], *, corrupt: bool = False) -> None:
    """Measure every size of ``spec`` and ``emit`` one record per size, in order. Never
    raises for a failed measurement; the process group is always torn down."""
    apply_env_defaults(os.environ)
    import torch
    import torch.distributed as dist

    backend = spec.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    sizes = resolve_sizes(spec, backend)
    refused = {s: d for s in sizes if (d := oversize_detail(s, spec.max_memory_bytes))}
    for size, detail in refused.items():
        log.warning("probe size %s refused: %s", size, detail)
    if all(s in refused for s in sizes):
        for size in sizes:
            emit(failure_record(spec, backend, size, "init_failure", refused[size]))
        return

    use_cuda = backend == "nccl"
    device = torch.device("cuda", spec_device(spec)) if use_cuda else torch.device("cpu")
    ranks: Ranks = ()
    group: collectives.Group | None = None
    broken: ProbeError | None = None
    log.info(
        "probe %s: rank %s of %s, backend %s, device %s, rendezvous %s",
        spec.kind,
        spec.rank,
        spec.world_size,
        backend,
        device,
        init_method(spec.master_addr, spec.master_port),
    )
    try:
        try:
            group, ranks = _form_group(spec, backend, device, corrupt=corrupt)
        except Exception as exc:  # every rendezvous failure becomes records, not a crash
            reason = init_reason(_type_names(exc), str(exc))
            log.warning("probe rendezvous failed (%s): %s", reason, detail_of(exc))
            broken = ProbeError(reason, detail_of(exc))
        for size in sizes:
            if size in refused:
                emit(
                    failure_record(spec, backend, size, "init_failure", refused[size], ranks=ranks)
                )
                continue
            if broken is not None or group is None:
                why = broken or ProbeError("init_failure", "no process group")
                emit(failure_record(spec, backend, size, why.reason, why.detail, ranks=ranks))
                continue
            measure_size = (
                collectives.measure_sendrecv
                if spec.kind == "sendrecv"
                else collectives.measure_all_reduce
            )
            try:
                timing, bad = measure_size(group, size)
            except collectives.Refused as refusal:
                emit(
                    failure_record(spec, backend, size, refusal.reason, refusal.detail, ranks=ranks)
                )
                continue
            except Exception as exc:  # a failed collective is a record; the group is unusable
                reason = run_reason(_type_names(exc), str(exc))
                log.warning("probe size %s failed (%s): %s", size, reason, detail_of(exc))
                emit(failure_record(spec, backend, size, reason, detail_of(exc), ranks=ranks))
                broken = ProbeError(
                    reason, f"not measured after an earlier failure: {detail_of(exc)}"
                )
                continue
            log.info(
                "probe %s size %s: %.3f us per iteration (%s, %s timed after %s)",
                spec.kind,
                size,
                timing.seconds * 1e6,
                timing.method,
                timing.iterations,
                timing.warmup,
            )
            emit(
                measured_record(
                    spec,
                    backend,
                    size,
                    time_seconds=timing.seconds,
                    mismatches=bad,
                    ranks=ranks,
                    iterations=timing.iterations,
                    warmup=timing.warmup,
                )
            )
    finally:
        stuck = broken is not None and group is not None and group.nccl is not None
        if stuck and dist.is_initialized():
            # a collective of NCCL's own calls failed or timed out and may still be in
            # flight: abort the communicator (its kernels stop) before anything waits on it
            log.warning("probe: aborting the NCCL communicator after %s", broken)
            with contextlib.suppress(Exception):
                dist.distributed_c10d._get_default_group()._get_backend(device).abort()
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        if use_cuda and not stuck:
            with contextlib.suppress(Exception):
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()


def encode_rank(host: str, device: int | None) -> bytes:
    """A rank's identity as the fixed-size bytes the ranks exchange after the rendezvous
    (``[host, device]`` as JSON, the host cut short to fit, zero-padded)."""
    for cut in range(len(host), -1, -1):
        data = json.dumps([host[:cut], device], ensure_ascii=True).encode()
        if len(data) <= RANK_ID_BYTES:
            return data.ljust(RANK_ID_BYTES, b"\0")
    raise ValueError(f"device {device} does not fit in {RANK_ID_BYTES} bytes")


def decode_rank(data: bytes) -> tuple[str, int | None]:
    """The inverse of :func:`encode_rank`; raises ValueError on anything else."""
    value = json.loads(data.rstrip(b"\0").decode())
    if (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and (value[1] is None or (isinstance(value[1], int) and not isinstance(value[1], bool)))
    ):
        return (value[0], value[1])
    raise ValueError(f"not a rank identity: {value!r}")


def _gather_ranks(
    world_size: int, host: str, index: int | None, device: torch.device
) -> tuple[tuple[str, int | None], ...]:
    """Every rank's (host, device), by one all_gather of fixed-size byte tensors (no
    pickling: ``all_gather_object`` needs numpy, which the worker does not)."""
    import torch
    import torch.distributed as dist

    mine = torch.tensor(list(encode_rank(host, index)), dtype=torch.uint8, device=device)
    everyone = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(everyone, mine)
    return tuple(decode_rank(bytes(t.tolist())) for t in everyone)


def _records_stream() -> TextIO:
    """The original stdout for records; fd 1 (and with it sys.stdout) now goes to stderr."""
    sys.stdout.flush()
    records_fd = os.dup(1)
    os.dup2(2, 1)
    return os.fdopen(records_fd, "w", buffering=1, encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agent.probe.measure.worker",
        description="fabricscope probe worker: one rank of an NCCL/gloo bandwidth probe; "
        "prints one JSON record per message size on stdout.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--spec", help="the worker spec as JSON")
    source.add_argument("--spec-file", type=Path, help="a file holding the worker spec JSON")
    parser.add_argument("--log.level", dest="log_level", choices=LEVELS, default="warning")
    parser.add_argument("--log.format", dest="log_format", choices=("text", "json"), default="text")
    args = parser.parse_args(argv)
    setup_logging(args.log_level, args.log_format)
    try:
        text = args.spec if args.spec is not None else args.spec_file.read_text()
        spec = parse_spec(text)
        if spec.master_port == 0:
            raise SpecError("master_port 0: a worker needs the rendezvous port of rank 0")
    except (OSError, SpecError) as exc:
        print(f"{parser.prog}: invalid spec: {exc}", file=sys.stderr)
        return USAGE_EXIT
    out = _records_stream()

    def emit(rec: ProbeRecord) -> None:
        out.write(to_json(rec) + "\n")
        out.flush()

    try:
        run(spec, emit, corrupt=os.environ.get(CORRUPT_ENV) == "1")
    finally:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
