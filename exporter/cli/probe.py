"""``fabricscope probe``: one probe now, printed as nccl-tests prints it (the agent's
``--probe.*`` flags, some of which this command shares, are in
:mod:`exporter.cli.probe_flags`).

    fabricscope probe                              intra-node all_reduce + sendrecv over the
                                                   local idle GPUs (2 gloo ranks on CPU)
    fabricscope probe --peer HOST[:PORT] --secret-file F
                                                   one node-pair probe against the agent on
                                                   HOST (this command is the guest, rank 1)
    fabricscope probe --matrix --peer HOST ...     sendrecv of every (local GPU, remote GPU)
                                                   pair: CSV + PNG heatmap
    fabricscope probe plan --nodes N [...]         simulate the cross-node schedule

Exit status: 0 when every measurement is correct, 1 when one failed (the table or CSV says
which and why), 2 for an error the user must fix (a bad flag or secret file, an unreachable
peer, refused authentication), printed as one line.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
import threading
import time
from collections.abc import Sequence

from agent.config import DEFAULT_PROBE_PORT
from agent.core.errors import ConfigError
from agent.probe.measure.launch import (
    PROBE_EXTRA_HINT,
    failure_records,
    launch_workers,
    missing_worker_modules,
)
from agent.probe.measure.records import ELEMENT_BYTES, ProbeRecord, WorkerSpec
from agent.probe.render.matrix import (
    MatrixCell,
    format_grid,
    heatmap,
    matrix_rounds,
    run_matrix,
    to_csv,
)
from agent.probe.rendezvous.messages import Offer
from agent.probe.rendezvous.secret import load_secret
from agent.probe.rendezvous.wire import (
    AuthError,
    PeerUnreachableError,
    ProtocolError,
    RendezvousError,
    RendezvousTimeoutError,
)
from agent.probe.run.addresses import MANUAL_PREFIX, hostport, parse_hostport, probe_id
from agent.probe.run.devices import GpuSlot, NvmlBusyGpus, discover_slots, isolated_gpu_view
from agent.probe.run.guest import GuestOutcome, guest_probe
from agent.probe.run.specs import at_master, default_sizes, guest_spec, intra_specs
from agent.probe.schedule.membership import normalize_host
from agent.probe.schedule.plan import main_plan
from exporter.cli.argtypes import error_line

log = logging.getLogger("fabricscope.probe")

MiB = 1 << 20
#: one size per matrix pair: enough to reach a link's bandwidth, short enough for N x N pairs
MATRIX_GPU_SIZE = 256 * MiB
MATRIX_CPU_SIZE = 1 * MiB
#: a peer that declines with gpu_busy is asked again this many times, a second apart
BUSY_RETRIES = 5


class ProbeCliError(Exception):
    """An error the user must fix: printed as one line, exit status 2."""


# --- the probe command -----------------------------------------------------------------------


def _gbps(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e9:.3f}"


def format_table(title: str, records: Sequence[ProbeRecord]) -> str:
    """nccl-tests' columns: size, count (float32 elements), type, time per operation,
    algbw and busbw in GB/s (10^9 B/s), and whether the result was checked correct."""
    head = (
        f"{'size':>12} {'count':>12} {'type':>6} {'time(us)':>11} "
        f"{'algbw(GB/s)':>12} {'busbw(GB/s)':>12}  correct"
    )
    lines = [f"# {title}", "#", "#" + head[1:]]
    for r in records:
        time_us = "-" if r.time_seconds is None else f"{r.time_seconds * 1e6:.2f}"
        correct = {True: "yes", False: "NO", None: "-"}[r.correct]
        if r.error is not None:
            correct += f"  {r.error.reason}: {r.error.detail}"
        lines.append(
            f"{r.size_bytes:>12} {r.size_bytes // ELEMENT_BYTES:>12} {'float':>6} {time_us:>11} "
            f"{_gbps(r.algbw_bytes_per_second):>12} {_gbps(r.busbw_bytes_per_second):>12}"
            f"  {correct}"
        )
    return "\n".join(lines)


def _node_id(ns: argparse.Namespace) -> str:
    name = ns.node_id or socket.gethostname()
    try:
        return normalize_host(name)
    except ValueError as exc:
        raise ProbeCliError(f"--node-id: {exc}") from None


def _rendezvous_failure(where: str, exc: RendezvousError) -> ProbeCliError:
    if isinstance(exc, PeerUnreachableError):
        return ProbeCliError(f"peer {where} unreachable: {exc}")
    if isinstance(exc, AuthError | ProtocolError):
        return ProbeCliError(f"authentication with peer {where} failed: {exc}")
    if isinstance(exc, RendezvousTimeoutError):
        return ProbeCliError(f"peer {where} did not answer in time: {exc}")
    return ProbeCliError(f"peer {where}: {exc}")


class _Local:
    """This host's devices as the probe command sees them."""

    def __init__(self, ns: argparse.Namespace) -> None:
        view = isolated_gpu_view(one_shot=True)  # NVML in a child process, as in the agent
        try:
            self.backend, self.slots = discover_slots(
                ns.probe_backend, ns.probe_cpu_slots, view=view
            )
            busy: frozenset[int] = frozenset()
            if self.backend == "nccl" and not ns.probe_force:
                answer = NvmlBusyGpus(view)()
                busy = answer if answer is not None else frozenset(s.label for s in self.slots)
        finally:
            view.close()
        self.busy = busy
        self.idle = [s for s in self.slots if s.label not in busy]
        if busy:
            print(
                f"# skipping busy GPUs {sorted(busy)} (compute processes; --probe.force "
                "probes them too)",
                file=sys.stderr,
            )

    def describe(self, slots: Sequence[GpuSlot]) -> str:
        kind = "GPUs" if self.backend == "nccl" else "CPU slots"
        return f"{self.backend}, {kind} {' '.join(str(s.label) for s in slots)}"


def _intra(ns: argparse.Namespace, local: _Local, abort: threading.Event) -> int:
    idle = local.idle
    if len(idle) < 2:
        raise ProbeCliError(
            f"an intra-node probe needs 2 idle devices; {len(idle)} of {len(local.slots)} "
            "here (--probe.backend gloo probes CPU slots)"
        )
    host = socket.gethostname()
    status = 0
    for kind in ns.collectives:
        specs = intra_specs(
            kind,
            local.backend,
            idle,
            sizes=default_sizes(kind, local.backend, ns.probe_sizes),
            warmup=ns.warmup,
            iterations=ns.iterations,
            deadline_seconds=ns.probe_timeout,
            host=host,
        )
        run = launch_workers(specs, deadline_seconds=ns.probe_timeout, abort=abort)
        title = f"{kind} on {len(idle)} ranks of {host} ({local.describe(idle)})"
        print(format_table(title, run.records), flush=True)
        print(flush=True)
        if any(r.error is not None for r in run.records):
            status = 1
    return status


def _secret(ns: argparse.Namespace) -> bytes:
    if not ns.secret_file:
        raise ProbeCliError("--peer needs --secret-file (the secret the peer's agent uses)")
    try:
        return load_secret(ns.secret_file)
    except ConfigError as exc:
        raise ProbeCliError(str(exc)) from None


def _offer(
    ns: argparse.Namespace, kind: str, backend: str, sizes: Sequence[int], slot: int | None
) -> Offer:
    return Offer(
        probe_id=probe_id(MANUAL_PREFIX.rstrip("-"), slot),
        kind=kind,
        backend=backend,
        sizes_bytes=tuple(sizes),
        iterations=ns.iterations,
        warmup=ns.warmup,
    )


def _template(
    ns: argparse.Namespace,
    *,
    kind: str,
    backend: str,
    sizes: Sequence[int],
    slot: GpuSlot,
    me: str,
    peer: str,
    remote: str = "",
) -> WorkerSpec:
    return guest_spec(
        kind,
        backend,
        slot,
        sizes=sizes,
        warmup=ns.warmup,
        iterations=ns.iterations,
        deadline_seconds=ns.probe_timeout,
        me=me,
        peer=peer,
        dst=f"{peer}:{remote}" if remote else peer,
    )


def _probe(
    peer: tuple[str, int],
    *,
    secret: bytes,
    me: str,
    offer: Offer,
    template: WorkerSpec,
    ns: argparse.Namespace,
    abort: threading.Event,
) -> GuestOutcome:
    """One offer and, if accepted, the local rank (a ``gpu_busy`` decline is asked again)."""
    return guest_probe(
        peer,
        secret=secret,
        node_id=me,
        offer=offer,
        make_spec=at_master(template),
        launcher=launch_workers,
        deadline_seconds=ns.probe_timeout,
        abort=abort,
        busy_retries=BUSY_RETRIES,
    )


def _pair(ns: argparse.Namespace, local: _Local, abort: threading.Event) -> int:
    host, port = _peer(ns)
    where = hostport(host, port)
    secret = _secret(ns)
    me = _node_id(ns)
    if not local.idle:
        raise ProbeCliError("no idle local device to probe with (--probe.force to use a busy one)")
    slot = local.idle[0]
    status = 0
    for kind in ns.collectives:
        sizes = default_sizes(kind, local.backend, ns.probe_sizes)
        template = _template(
            ns, kind=kind, backend=local.backend, sizes=sizes, slot=slot, me=me, peer=host
        )
        outcome = _probe(
            (host, port),
            secret=secret,
            me=me,
            offer=_offer(ns, kind, local.backend, sizes, None),
            template=template,
            ns=ns,
            abort=abort,
        )
        if outcome.error is not None:
            raise _rendezvous_failure(where, outcome.error)
        if outcome.run is None:
            reason = outcome.answer.reason if outcome.answer is not None else "?"
            print(
                f"fabricscope: peer {where} declined the {kind} probe: {reason} (its GPUs are "
                "busy, held by another probe, or it probes with another backend)",
                file=sys.stderr,
            )
            status = 1
            continue
        records = outcome.run.records
        remote = next(
            (str(r.ranks[0][1]) for r in records if r.ranks and r.ranks[0][1] is not None), ""
        )
        title = f"{kind} between {me} ({local.describe([slot])}) and {where}" + (
            f" GPU {remote}" if remote else ""
        )
        print(format_table(title, records), flush=True)
        print(flush=True)
        if any(r.error is not None for r in records):
            status = 1
    return status


def _peer(ns: argparse.Namespace) -> tuple[str, int]:
    try:
        return parse_hostport(ns.peer, DEFAULT_PROBE_PORT)
    except ValueError as exc:
        raise ProbeCliError(f"--peer: {exc}") from None


def _matrix(ns: argparse.Namespace, local: _Local, abort: threading.Event) -> int:
    if not ns.peer:
        raise ProbeCliError("--matrix needs --peer HOST[:PORT]")
    host, port = _peer(ns)
    where = hostport(host, port)
    secret = _secret(ns)
    me = _node_id(ns)
    slots = local.slots
    remote_n = ns.peer_gpus or len(slots)
    size = MATRIX_GPU_SIZE if local.backend == "nccl" else MATRIX_CPU_SIZE
    sizes = tuple(ns.probe_sizes) or (size,)
    fatal: list[ProbeCliError] = []
    lock = threading.Lock()

    def measure(i: int, j: int) -> list[MatrixCell]:
        slot = slots[i]
        label = str(slot.label)

        def failed(reason: str, detail: str) -> list[MatrixCell]:
            return [MatrixCell(i, j, label, str(j), s, None, reason, detail) for s in sizes]

        if slot.label in local.busy:
            return failed("gpu_busy", "local GPU runs compute processes")
        template = _template(
            ns,
            kind="sendrecv",
            backend=local.backend,
            sizes=sizes,
            slot=slot,
            me=me,
            peer=host,
            remote=str(j),
        )
        try:
            outcome = _probe(
                (host, port),
                secret=secret,
                me=me,
                offer=_offer(ns, "sendrecv", local.backend, sizes, j),
                template=template,
                ns=ns,
                abort=abort,
            )
        except Exception as exc:  # a bug must cost this pair, not the matrix
            log.exception("matrix pair %s -> %s", i, j)
            return failed("crashed", str(exc))
        if outcome.error is not None:
            if isinstance(outcome.error, PeerUnreachableError | AuthError | ProtocolError):
                with lock:
                    fatal.append(_rendezvous_failure(where, outcome.error))
            return failed(outcome.error.reason, str(outcome.error))
        if outcome.run is None:
            reason = outcome.answer.reason if outcome.answer is not None else None
            return failed(reason or "init_failure", f"{where} declined GPU {j}")
        records = outcome.run.records or failure_records(template, "crashed", "no records")
        return [
            MatrixCell(
                i,
                j,
                label,
                str(j),
                r.size_bytes,
                r.busbw_bytes_per_second if r.error is None else None,
                r.reason or "",
                r.error.detail if r.error is not None else "",
            )
            for r in records
        ]

    rounds = matrix_rounds(len(slots), remote_n)
    print(
        f"# matrix: {len(slots)} local x {remote_n} remote devices with {where}, "
        f"{len(rounds)} rounds of up to {max(len(r) for r in rounds)} pairs in parallel, "
        f"sendrecv of {', '.join(str(s) for s in sizes)} B",
        file=sys.stderr,
        flush=True,
    )
    cells = run_matrix(
        rounds,
        measure,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
        stop=lambda: bool(fatal) or abort.is_set(),
    )
    if fatal:
        raise fatal[0]
    local_labels = [str(s.label) for s in slots]
    remote_labels = [str(j) for j in range(remote_n)]
    try:
        ns.csv.write_text(to_csv(cells))
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        png = heatmap(
            cells,
            local_labels,
            remote_labels,
            local_node=me,
            remote_node=where,
            when=when,
            device="GPU" if local.backend == "nccl" else "CPU slot",
        )
        ns.png.write_bytes(png)
    except OSError as exc:
        raise ProbeCliError(f"cannot write the matrix: {exc}") from None
    print(f"# sendrecv busbw (GB/s) at {max(sizes)} B, {me} -> {where}")
    print(format_grid(cells, local_labels, remote_labels))
    print(f"# wrote {ns.csv} and {ns.png}", file=sys.stderr)
    return 0 if all(c.ok for c in cells) else 1


def cmd_probe(ns: argparse.Namespace) -> int:
    if ns.probe_command == "plan":
        return main_plan(ns.plan_args)
    abort = threading.Event()
    try:
        # the --matrix heatmap is drawn with matplotlib (part of the same extra)
        missing = missing_worker_modules(("matplotlib",) if ns.matrix else ())
        if missing:
            raise ProbeCliError(
                f"the probe needs {' and '.join(missing)}, not installed here: " + PROBE_EXTRA_HINT
            )
        local = _Local(ns)
        if ns.matrix:
            return _matrix(ns, local, abort)
        if ns.peer:
            return _pair(ns, local, abort)
        return _intra(ns, local, abort)
    except (ProbeCliError, ConfigError) as exc:
        print(error_line("fabricscope probe", str(exc)), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        abort.set()  # workers of pairs still running are killed by their launchers
        for t in threading.enumerate():
            if t is not threading.current_thread() and t.daemon:
                t.join(5.0)
        print("fabricscope: interrupted", file=sys.stderr)
        return 130
