"""The throughput sampler: the latest throughput each training job printed, per container
or log file, read from its logs with no change to the training code.

Sources, each a *stream* with its own tail and its own latest values:

- plain files (``--throughput.file PATH[=JOB]``, globs expanded every pass): namespace, pod
  and container empty; job name from ``=JOB``, ``--throughput.job`` or the file's stem;
- container logs under ``--path.pod-logs`` (CRI format) of the selected pods
  (:mod:`agent.throughput.pods`); job name from the pod annotation ``fabricscope.io/job``,
  else the pod's controller; a custom format from ``fabricscope.io/throughput-regex``.

Each pass reads only what was appended (:mod:`agent.throughput.tail`), parses each line
(:mod:`agent.throughput.formats`) and keeps, per stream and format, the latest value of
each figure, the lines parsed, and the time of the last parsed line (the CRI timestamp; for
plain files the file's modification time when it was read). A stalled job therefore shows
as a stale timestamp, not as a frozen rate alone. A stream's values go when its pod's log
directory goes.

No log line is ever kept past its parse, exported or logged: only numbers and bounded
identifiers (HCA names, a version, fixed vocabularies) leave.

What a pod can write costs bounded work. Parsing is linear per line (RE2, a per-line window:
:mod:`agent.throughput.formats`). Each stream may use ``stream_cpu_seconds`` of CPU per
pass; past it the rest of its file waits for the next pass (``cpu_budget``). A pass stops
starting streams after ``pass_seconds`` (``pass_deadline`` per stream not reached; the next
pass starts with them): streams not read keep their last values. At most
``max_open_files`` files stay open between passes (idle ones are closed and reopened at
their offset). In the agent all of this runs in a supervised child process
(:func:`isolated_sampler`): a pass that still hangs costs that pass, counted as the
throughput sampler's ``hung``, never a scrape.

The same lines feed :mod:`agent.throughput.nccl`: NCCL's own lines (a job run with
``NCCL_DEBUG=INFO`` or ``WARN``) give, per stream, the transports and HCAs its channels use
(reset when the container restarts: a new log is a new run), its NCCL warnings by kind and
its communicator inits and aborts (:class:`NcclSeries`).
"""

from __future__ import annotations

import glob
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agent.config import ThroughputFile, ThroughputSettings
from agent.core.errors import NoData
from agent.core.isolation import ChildSpec, IsolatedSampler
from agent.core.sysfs import ReadIssue
from agent.kubernetes.podwatch import PodIndex, PodMeta
from agent.throughput.formats import (
    MAX_PARSE_CHARS,
    BadRegex,
    compile_custom,
    parse_line,
    parse_window,
)
from agent.throughput.linear import Pattern
from agent.throughput.nccl import WARNING_KINDS, NcclRun, parse_nccl_line
from agent.throughput.pods import (
    current_log,
    newest_rotated,
    parse_pod_dir,
    parse_selector,
    selector_matches,
)
from agent.throughput.tail import (
    TAIL_REASONS,
    UNREAD_BYTES,
    WHOLE_FILE,
    FileTail,
    Limits,
    read_gzip_tail,
)

log = logging.getLogger(__name__)

#: reasons counted in ``ThroughputSnapshot.errors_total``
ERROR_REASONS = tuple(
    sorted(
        {*TAIL_REASONS, "bad_regex", "no_match", "too_long_to_parse", "cpu_budget", "pass_deadline"}
    )
)
JOB_ANNOTATION = "fabricscope.io/job"
REGEX_ANNOTATION = "fabricscope.io/throughput-regex"

#: an issue's reason in the ReadIssue vocabulary, for the runner's read_errors_total
_ISSUE_REASON = {
    "not_regular_file": "unsupported",
    "symlink": "unsupported",
    "outside_root": "unsupported",
    "bad_regex": "parse",
    "gzip": "parse",
    "no_match": "vanished",
}


# --- snapshot ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ThroughputSeries:
    """The latest figures one stream printed in one format (None: never printed)."""

    namespace: str
    pod: str
    container: str
    job_name: str
    format: str
    lines_parsed: int
    tokens_per_second: float | None = None
    samples_per_second: float | None = None
    iterations_per_second: float | None = None
    step_seconds: float | None = None
    flops_per_gpu: float | None = None
    mfu_ratio: float | None = None


@dataclass(frozen=True, slots=True)
class StreamTime:
    """Wall time (seconds since the epoch) of a stream's last parsed line."""

    namespace: str
    pod: str
    container: str
    job_name: str
    last_parsed_timestamp_seconds: float


@dataclass(frozen=True, slots=True)
class NcclSeries:
    """What one stream's NCCL lines said (:mod:`agent.throughput.nccl`).

    ``channels``: (transport, GPUDirect RDMA, connections) of the current run (the
    container's current log); ``hca_channels``: (HCA, connections) of its NET/IB channels
    whose NET index maps to an HCA NCCL listed; ``warnings``: (kind, lines) for every kind;
    ``ib_errors``: (ibv_wc_status name, vendor error, lines). ``lines``, ``warnings``,
    ``ib_errors``, ``inits`` and ``aborts`` count since the stream was first read.
    ``last_init_timestamp_seconds``: CRI time of the latest ``Init COMPLETE`` (None: none, or a
    plain file without timestamps). ``version``: the latest ``NCCL version`` printed.
    ``gpu_hca_channels``: (GPU PCI address, HCA, connections) of the NET/IB channels whose
    process named its GPU. ``hca_numa``: per HCA whose channels could be judged (the NUMA
    node of the HCA and of the channel's GPU both known, :attr:`ThroughputInputs.numa`),
    (HCA, channels judged, channels whose GPU is on another NUMA node than the HCA).
    ``nvlink_channels``: see :func:`nvlink_channels`.
    """

    namespace: str
    pod: str
    container: str
    job_name: str
    lines: int
    version: str | None = None
    channels: tuple[tuple[str, bool, int], ...] = ()
    hca_channels: tuple[tuple[str, int], ...] = ()
    warnings: tuple[tuple[str, int], ...] = ()
    ib_errors: tuple[tuple[str, str, int], ...] = ()
    inits: int = 0
    aborts: int = 0
    last_init_timestamp_seconds: float | None = None
    gpu_hca_channels: tuple[tuple[str, str, int], ...] = ()
    hca_numa: tuple[tuple[str, int, int], ...] = ()
    #: (GPU, peer GPU, transport, connections) of channels between two GPUs of this node
    #: that NVML shows joined by NVLink (:attr:`ThroughputInputs.nvlinks`): the addresses
    #: sorted within each pair; a transport other than P2P/* does not use the NVLinks
    nvlink_channels: tuple[tuple[str, str, str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class ThroughputSnapshot:
    """One pass: series sorted by labels; ``sources`` logs tailed; errors since start;
    ``nccl``: per stream that printed NCCL lines, what they said."""

    series: tuple[ThroughputSeries, ...] = ()
    times: tuple[StreamTime, ...] = ()
    sources: int = 0
    errors_total: tuple[tuple[str, int], ...] = tuple((r, 0) for r in ERROR_REASONS)
    issues: tuple[ReadIssue, ...] = ()
    #: bytes known to have been written to a log and never read (see agent.throughput.tail)
    unread_bytes_total: int = 0
    nccl: tuple[NcclSeries, ...] = ()


@dataclass(frozen=True, slots=True)
class ThroughputInputs:
    """What the sampler needs from the rest of the agent each pass: the (namespace, pod)
    pairs holding a GPU of this node (None: no attribution answer) and the API server's pod
    index (None: not watching). Sent to the child process when it changes (the index is
    compared by identity: the watcher replaces it on every change)."""

    gpu_pods: frozenset[tuple[str, str]] | None = None
    index: PodIndex | None = None
    #: the NUMA node of each GPU (by PCI address) and RDMA device (by name) of the node, from
    #: sysfs (None: not known; a device whose platform reports no node is left out)
    numa: tuple[tuple[str, int], ...] | None = None
    #: pairs of this node's GPUs (PCI addresses) joined by active NVLinks, with how many, from
    #: NVML (None: not known)
    nvlinks: tuple[tuple[str, str, int], ...] | None = None


# --- streams -------------------------------------------------------------------------------

Labels = tuple[str, str, str, str]  # namespace, pod, container, job_name


@dataclass(slots=True)
class _Stream:
    labels: Labels
    cri: bool
    counts: Counter[str]
    tail: FileTail | None = None
    values: dict[str, dict[str, float]] = field(default_factory=dict)
    parsed: Counter[str] = field(default_factory=Counter)
    last_ts: float | None = None
    custom: Pattern | None = None
    custom_source: str | None = None
    custom_error: str | None = None
    parsed_this_poll: bool = False
    line_ts: float | None = None
    nccl: NcclRun = field(default_factory=NcclRun)

    def on_head_line(self, text: str, ts: float | None) -> None:
        """A line of the log's beginning, read once when the agent meets a log already past
        its initial window: what NCCL chose (version, HCA lists, channels, each process's
        GPU) is kept; its warnings and inits are not counted (they are history, and a
        counter that jumps at an agent's start would read as a burst) and no throughput is
        taken from it (stale)."""
        n = parse_nccl_line(text)
        if n is not None:
            self.nccl.feed(n, ts, history=True)

    def on_line(self, text: str, ts: float | None) -> None:
        n = parse_nccl_line(text)
        if n is not None:  # NCCL's own line: it states no throughput
            self.nccl.feed(n, ts)
            return
        r = parse_line(text, self.custom)
        if r is None:
            if len(text) > MAX_PARSE_CHARS and parse_window(text) is None:
                self.counts["too_long_to_parse"] += 1
            return
        slot = self.values.setdefault(r.format, {})
        for name, v in r.values():
            slot[name] = v
        self.parsed[r.format] += 1
        self.parsed_this_poll = True
        if ts is not None:
            self.line_ts = ts

    def close(self) -> None:
        if self.tail is not None:
            self.tail.drop()
            self.tail = None


def job_from_file(pattern_job: str | None, default_job: str | None, path: str) -> str:
    return pattern_job or default_job or Path(path).stem


def job_from_pod(meta: PodMeta | None) -> str:
    if meta is None:
        return ""
    return meta.annotation(JOB_ANNOTATION) or meta.owner or ""


class ThroughputSampler:
    """Samples training throughput from logs; see the module docstring.

    ``gpu_pods`` returns the (namespace, pod) pairs holding a GPU of this node (None when
    attribution has no answer); ``pod_index`` the API server's pod index (labels,
    annotations, owners; None when not watching). ``once``: read every file whole (``--once``).
    """

    name = "throughput"

    def __init__(
        self,
        settings: ThroughputSettings,
        *,
        gpu_pods: Callable[[], frozenset[tuple[str, str]] | None] = lambda: None,
        pod_index: Callable[[], PodIndex | None] = lambda: None,
        numa: Callable[[], tuple[tuple[str, int], ...] | None] = lambda: None,
        nvlinks: Callable[[], tuple[tuple[str, str, int], ...] | None] = lambda: None,
        once: bool = False,
        limits: Limits | None = None,
        clock: Callable[[], float] = time.time,
        pass_seconds: float | None = None,
        cpu_clock: Callable[[], float] = time.thread_time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``pass_seconds``: after this long a pass starts no more streams (None: no bound,
        for ``--once``); ``cpu_clock`` measures each stream's CPU time in a pass."""
        self._settings = settings
        self._pass_seconds = pass_seconds
        self._cpu = cpu_clock
        self._mono = monotonic
        self._cursor = 0  # where the previous pass stopped, when it ran out of time
        self._gpu_pods = gpu_pods
        self._pod_index = pod_index
        self._numa = numa
        self._nvlinks = nvlinks
        self._clock = clock
        base = limits or (WHOLE_FILE if once else Limits())
        self._limits = Limits(
            max_line_bytes=settings.max_line_bytes,
            max_bytes_per_pass=base.max_bytes_per_pass,
            initial_bytes=None if base.initial_bytes is None else settings.initial_bytes,
            chunk_bytes=base.chunk_bytes,
        )
        self._selector = parse_selector(settings.selector) if settings.selector else None
        self._streams: dict[str, _Stream] = {}
        self._gz_done: set[str] = set()
        self._counts: Counter[str] = Counter()
        self._started = False

    def accept_inputs(self, value: object) -> None:
        """The agent's latest :class:`ThroughputInputs` (in the child process)."""
        if not isinstance(value, ThroughputInputs):
            raise TypeError(f"expected ThroughputInputs, got {type(value).__name__}")
        self._gpu_pods = lambda: value.gpu_pods
        self._pod_index = lambda: value.index
        self._numa = lambda: value.numa
        self._nvlinks = lambda: value.nvlinks

    # -- the pass --------------------------------------------------------------------------

    def sample(self) -> ThroughputSnapshot:
        s = self._settings
        pod_logs_present = os.path.isdir(s.pod_logs)
        if not s.files and not pod_logs_present:
            nothing_to_read(s)
        issues: list[ReadIssue] = []
        wanted: dict[str, tuple[str, Labels, bool, bool]] = {}  # key -> path, labels, cri, new
        for f in s.files:
            paths = sorted(glob.glob(f.pattern)) if glob.has_magic(f.pattern) else [f.pattern]
            if not paths:
                self._counts["no_match"] += 1
                issues.append(ReadIssue(f.pattern, "vanished", "no file matches"))
            for p in paths:
                labels: Labels = ("", "", "", job_from_file(f.job, s.job, p))
                if p.endswith(".gz"):
                    self._read_gz_once(p, labels, issues)
                    continue
                wanted[p] = (p, labels, False, False)
        if pod_logs_present:
            self._discover_pods(wanted, issues)
        self._reconcile(wanted, issues)
        self._started = True
        return self._snapshot(issues)

    def _read_gz_once(self, path: str, labels: Labels, issues: list[ReadIssue]) -> None:
        stream = self._streams.setdefault(
            "gz:" + path, _Stream(labels, cri=False, counts=self._counts)
        )
        if path in self._gz_done:
            return
        problem = read_gzip_tail(path, stream.on_line, self._counts, cri=False, limits=self._limits)
        if problem is not None:
            issues.append(ReadIssue(path, _ISSUE_REASON.get(problem[0], problem[0]), problem[1]))
            return
        self._gz_done.add(path)
        if stream.parsed_this_poll:
            stream.parsed_this_poll = False
            stream.last_ts = _mtime(path) or self._clock()

    def _discover_pods(
        self, wanted: dict[str, tuple[str, Labels, bool, bool]], issues: list[ReadIssue]
    ) -> None:
        s = self._settings
        try:
            entries = sorted(os.listdir(s.pod_logs))
        except OSError as exc:
            issues.append(ReadIssue(s.pod_logs, "io", exc.strerror or str(exc)))
            return
        gpu = self._gpu_pods() if s.pods == "gpu" else None
        index = self._pod_index()
        for entry in entries:
            pd = parse_pod_dir(entry)
            if pd is None:
                continue
            if s.pods == "gpu" and (gpu is None or (pd.namespace, pd.pod) not in gpu):
                continue
            if s.namespaces and pd.namespace not in s.namespaces:
                continue
            meta = index.by_uid(pd.uid) if index is not None else None
            if self._selector is not None and (
                meta is None or not selector_matches(self._selector, dict(meta.labels))
            ):
                continue
            pod_dir = os.path.join(s.pod_logs, entry)
            try:
                containers = sorted(os.listdir(pod_dir))
            except OSError:
                continue  # the pod went between two listings: its streams go below
            job = job_from_pod(meta)
            regex = meta.annotation(REGEX_ANNOTATION) if meta is not None else None
            for c in containers:
                cdir = os.path.join(pod_dir, c)
                try:
                    names = os.listdir(cdir)
                except OSError:
                    continue
                current = current_log(names)
                if current is None:
                    continue
                key = f"cri:{pd.uid}/{c}"
                labels: Labels = (pd.namespace, pd.pod, c, job)
                stream = self._streams.get(key)
                if stream is None:
                    stream = self._streams[key] = _Stream(labels, cri=True, counts=self._counts)
                    self._seed_from_rotated(stream, cdir, names, current, issues)
                self._set_custom(stream, regex, f"{pd.namespace}/{pd.pod}", issues)
                # a log met for the first time starts initial_bytes before its end, which is
                # its start for a pod that began after the agent did
                wanted[key] = (os.path.join(cdir, current), labels, True, False)

    def _seed_from_rotated(
        self, stream: _Stream, cdir: str, names: list[str], current: str, issues: list[ReadIssue]
    ) -> None:
        """A container met for the first time whose live log holds less than the initial
        window (just rotated): its newest rotated file holds the latest values."""
        initial = self._limits.initial_bytes
        if initial is None:
            return
        try:
            if os.stat(os.path.join(cdir, current)).st_size >= initial:
                return
        except OSError:
            return
        rotated = newest_rotated(names, current)
        if rotated is None:
            return
        root = self._settings.pod_logs
        path = os.path.join(cdir, rotated)
        if rotated.endswith(".gz"):
            problem = read_gzip_tail(
                path, stream.on_line, self._counts, cri=True, limits=self._limits, root=root
            )
        else:
            tail = FileTail(
                path,
                stream.on_line,
                self._counts,
                cri=True,
                limits=self._limits,
                root=root,
                head_sink=stream.on_head_line,
            )
            problem = tail.poll()
            tail.close()
        if problem is not None:
            issues.append(ReadIssue(path, _ISSUE_REASON.get(problem[0], problem[0]), problem[1]))
        self._finish_poll(stream, path)

    def _set_custom(
        self, stream: _Stream, regex: str | None, pod: str, issues: list[ReadIssue]
    ) -> None:
        if regex != stream.custom_source:
            stream.custom_source = regex
            stream.custom = None
            stream.custom_error = None
            if regex is not None:
                try:
                    stream.custom = compile_custom(regex)
                except BadRegex as exc:
                    stream.custom_error = str(exc)
                    self._counts["bad_regex"] += 1
                    log.warning(
                        "pod %s: annotation %s is not usable (%s); built-in formats only",
                        pod,
                        REGEX_ANNOTATION,
                        exc,
                    )
        if stream.custom_error is not None:
            issues.append(ReadIssue(f"{pod} {REGEX_ANNOTATION}", "parse", stream.custom_error))

    def _reconcile(
        self, wanted: dict[str, tuple[str, Labels, bool, bool]], issues: list[ReadIssue]
    ) -> None:
        started = self._mono()
        for key in [k for k in self._streams if not k.startswith("gz:")]:
            if key not in wanted:
                stream = self._streams.pop(key)
                if stream.tail is not None:
                    stream.tail.poll(self._budget_stop())  # what was written before it went
                    if not os.path.exists(stream.tail.path):
                        self._counts["vanished"] += 1
                stream.close()
        keys = list(wanted)
        if self._cursor >= len(keys):
            self._cursor = 0
        order = keys[self._cursor :] + keys[: self._cursor]  # who waited last pass goes first
        for i, key in enumerate(order):
            if self._pass_seconds is not None and self._mono() - started > self._pass_seconds:
                self._counts["pass_deadline"] += len(order) - i
                self._cursor = keys.index(key)
                break
            self._poll_stream(key, wanted[key], issues)
        else:
            self._cursor = 0
        self._bound_open_files()

    def _budget_stop(self) -> Callable[[], bool]:
        """A ``stop`` for one stream's poll: True once it used its CPU budget."""
        limit = self._settings.stream_cpu_seconds
        start = self._cpu()
        return lambda: self._cpu() - start > limit

    def _poll_stream(
        self, key: str, want: tuple[str, Labels, bool, bool], issues: list[ReadIssue]
    ) -> None:
        path, labels, cri, new = want
        st = self._streams.get(key)
        if st is None:
            st = self._streams[key] = _Stream(labels, cri=cri, counts=self._counts)
        st.labels = labels
        fresh = new
        root = self._settings.pod_logs if cri else None
        stop = self._budget_stop()
        if st.tail is not None and st.tail.path != path:
            st.tail.poll(stop)  # the container restarted: finish its previous log
            self._finish_poll(st, st.tail.path)
            st.close()
            st.nccl.new_run()  # its next run chooses its transports again
            fresh = True
        if st.tail is None:
            st.tail = FileTail(
                path,
                st.on_line,
                self._counts,
                cri=cri,
                limits=self._limits,
                new_file=fresh,
                root=root,
                head_sink=st.on_head_line,
            )
        problem = st.tail.poll(stop)
        if stop():
            self._counts["cpu_budget"] += 1
        if problem is not None:
            issues.append(ReadIssue(path, _ISSUE_REASON.get(problem[0], problem[0]), problem[1]))
        self._finish_poll(st, path)

    def _bound_open_files(self) -> None:
        """Keep at most ``max_open_files`` logs open: close the idle ones first (they reopen
        at their offset on the next pass), then any beyond the bound."""
        tails = [st.tail for st in self._streams.values() if st.tail is not None]
        open_tails = [t for t in tails if t.is_open]
        excess = len(open_tails) - self._settings.max_open_files
        if excess <= 0:
            return
        open_tails.sort(key=lambda t: t.last_poll_bytes > 0)  # idle first
        for t in open_tails[:excess]:
            t.close()

    def _finish_poll(self, stream: _Stream, path: str) -> None:
        if not stream.parsed_this_poll:
            return
        stream.parsed_this_poll = False
        if stream.cri and stream.line_ts is not None:
            stream.last_ts = stream.line_ts
        else:
            mtime = stream.tail.last_read_mtime if stream.tail is not None else None
            stream.last_ts = mtime if mtime is not None else (_mtime(path) or self._clock())

    def _snapshot(self, issues: list[ReadIssue]) -> ThroughputSnapshot:
        merged: dict[tuple[str, ...], dict[str, float]] = {}
        parsed: Counter[tuple[str, ...]] = Counter()
        times: dict[Labels, float] = {}
        for stream in self._streams.values():
            for fmt, values in stream.values.items():
                key = (*stream.labels, fmt)
                merged.setdefault(key, {}).update(values)
                parsed[key] += stream.parsed[fmt]
            if stream.last_ts is not None:
                times[stream.labels] = max(stream.last_ts, times.get(stream.labels, 0.0))
        series = tuple(
            ThroughputSeries(
                namespace=key[0],
                pod=key[1],
                container=key[2],
                job_name=key[3],
                format=key[4],
                lines_parsed=parsed[key],
                tokens_per_second=v.get("tokens_per_second"),
                samples_per_second=v.get("samples_per_second"),
                iterations_per_second=v.get("iterations_per_second"),
                step_seconds=v.get("step_seconds"),
                flops_per_gpu=v.get("flops_per_gpu"),
                mfu_ratio=v.get("mfu_ratio"),
            )
            for key, v in sorted(merged.items())
        )
        return ThroughputSnapshot(
            series=series,
            times=tuple(StreamTime(*labels, ts) for labels, ts in sorted(times.items())),
            sources=sum(1 for st in self._streams.values() if st.tail is not None),
            errors_total=tuple((r, self._counts.get(r, 0)) for r in ERROR_REASONS),
            issues=tuple(issues),
            unread_bytes_total=self._counts.get(UNREAD_BYTES, 0),
            nccl=nccl_series(self._streams.values(), self._numa(), self._nvlinks()),
        )

    def close(self) -> None:
        for stream in self._streams.values():
            stream.close()
        self._streams.clear()


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def nccl_series(
    streams: Iterable[_Stream],
    numa: tuple[tuple[str, int], ...] | None = None,
    nvlinks: tuple[tuple[str, str, int], ...] | None = None,
) -> tuple[NcclSeries, ...]:
    """One :class:`NcclSeries` per label set whose streams printed NCCL lines (streams with
    the same labels, a restarted pod's old and new directory, add up), sorted by labels;
    ``numa`` (:attr:`ThroughputInputs.numa`) judges which HCA each GPU's channels use,
    ``nvlinks`` (:attr:`ThroughputInputs.nvlinks`) which channels join NVLinked GPUs."""
    node_of = dict(numa or ())
    merged: dict[Labels, list[NcclRun]] = {}
    ranks = RankGpus()
    for st in streams:
        ranks.add(st.nccl.comm_gpus, local=st.cri)
        if st.nccl.heard:
            merged.setdefault(st.labels, []).append(st.nccl)
    joined = {(a, b) for a, b, n in nvlinks or () if n > 0}
    joined |= {(b, a) for a, b in joined}
    out = []
    for labels, runs in sorted(merged.items()):
        channels: Counter[tuple[str, bool]] = Counter()
        hcas: Counter[str] = Counter()
        warnings: Counter[str] = Counter()
        ib_errors: Counter[tuple[str, str]] = Counter()
        pairs: Counter[tuple[str, str]] = Counter()
        for run in runs:
            channels.update(run.channels)
            hcas.update(run.hca_channels)
            warnings.update(run.warnings)
            ib_errors.update(run.ib_errors)
            pairs.update(run.gpu_hca_channels)
        inits = [r.last_init_ts for r in runs if r.last_init_ts is not None]
        versions = [r.version for r in runs if r.version is not None]
        out.append(
            NcclSeries(
                *labels,
                lines=sum(r.lines for r in runs),
                version=versions[-1] if versions else None,
                channels=tuple((t, g, n) for (t, g), n in sorted(channels.items())),
                hca_channels=tuple(sorted(hcas.items())),
                warnings=tuple((k, warnings.get(k, 0)) for k in WARNING_KINDS),
                ib_errors=tuple((st, v, n) for (st, v), n in sorted(ib_errors.items())),
                inits=sum(r.inits for r in runs),
                aborts=sum(r.aborts for r in runs),
                last_init_timestamp_seconds=max(inits) if inits else None,
                gpu_hca_channels=tuple((g, h, n) for (g, h), n in sorted(pairs.items())),
                hca_numa=hca_numa(pairs, node_of),
                nvlink_channels=nvlink_channels(runs, ranks, joined),
            )
        )
    return tuple(out)


class RankGpus:
    """Node-wide: the GPU and host of every (communicator, rank) whose ``Init START`` a log
    read on this node printed. A pod's log holds only processes of this node, so its ranks
    are local whatever host name their lines print (each pod has its own); a plain file
    (``--throughput.file``, a Slurm job's output may hold every node's lines) vouches for a
    pair only when both ranks' lines name the same host."""

    def __init__(self) -> None:
        self._where: dict[tuple[str, int], tuple[str, str, bool]] = {}

    def add(self, comm_gpus: Mapping[tuple[str, int], tuple[str, str]], *, local: bool) -> None:
        for key, (bus, host) in comm_gpus.items():
            if key not in self._where or local:
                self._where[key] = (bus, host, local)

    def pair(self, comm: str, a: int, b: int) -> tuple[str, str] | None:
        """The two ranks' GPU addresses when both are known to be on this node."""
        wa, wb = self._where.get((comm, a)), self._where.get((comm, b))
        if wa is None or wb is None:
            return None
        if not (wa[2] and wb[2]) and not (wa[1] and wa[1] == wb[1]):
            return None
        return wa[0], wb[0]


def nvlink_channels(
    runs: Iterable[NcclRun], ranks: RankGpus, joined: set[tuple[str, str]]
) -> tuple[tuple[str, str, str, int], ...]:
    """(GPU, peer GPU, transport, connections) of the runs' channels whose two ranks are on
    GPUs of this node joined by NVLink (``joined``, both orders), the addresses sorted within
    each pair, sorted."""
    out: Counter[tuple[str, str, str]] = Counter()
    for run in runs:
        for (comm, a, b, transport), n in run.rank_channels.items():
            pair = ranks.pair(comm, a, b)
            if pair is None or pair[0] == pair[1] or pair not in joined:
                continue
            lo, hi = sorted(pair)
            out[(lo, hi, transport)] += n
    return tuple((a, b, t, n) for (a, b, t), n in sorted(out.items()))


def hca_numa(
    pairs: Mapping[tuple[str, str], int], node_of: Mapping[str, int]
) -> tuple[tuple[str, int, int], ...]:
    """(HCA, channels judged, channels whose GPU is on another NUMA node than the HCA) for
    every HCA with a channel whose GPU and HCA NUMA nodes are both known, sorted by HCA."""
    judged: Counter[str] = Counter()
    off: Counter[str] = Counter()
    for (gpu, hca), n in pairs.items():
        g, h = node_of.get(gpu), node_of.get(hca)
        if g is None or h is None:
            continue
        judged[hca] += n
        if g != h:
            off[hca] += n
    return tuple((hca, n, off.get(hca, 0)) for hca, n in sorted(judged.items()))


# --- in a child process ---------------------------------------------------------------------


def settings_json(settings: ThroughputSettings) -> str:
    """The settings as one JSON string: what travels to the child (plain values only)."""
    return json.dumps(
        {
            "files": [[f.pattern, f.job] for f in settings.files],
            "job": settings.job,
            "pod_logs": settings.pod_logs,
            "pods": settings.pods,
            "namespaces": list(settings.namespaces),
            "selector": settings.selector,
            "max_line_bytes": settings.max_line_bytes,
            "initial_bytes": settings.initial_bytes,
            "isolate": settings.isolate,
            "stream_cpu_seconds": settings.stream_cpu_seconds,
            "max_open_files": settings.max_open_files,
        }
    )


def settings_from_json(text: str) -> ThroughputSettings:
    d = json.loads(text)
    return ThroughputSettings(
        files=tuple(ThroughputFile(p, j) for p, j in d["files"]),
        job=d["job"],
        pod_logs=d["pod_logs"],
        pods=d["pods"],
        namespaces=tuple(d["namespaces"]),
        selector=d["selector"],
        max_line_bytes=int(d["max_line_bytes"]),
        initial_bytes=int(d["initial_bytes"]),
        isolate=bool(d["isolate"]),
        stream_cpu_seconds=float(d["stream_cpu_seconds"]),
        max_open_files=int(d["max_open_files"]),
    )


def child_sampler(*, settings: str, pass_seconds: float) -> ThroughputSampler:
    """The sampler as the agent's child process builds it (:mod:`agent.core.isolation`); its
    inputs arrive with each pass that changes them (:class:`ThroughputInputs`)."""
    return ThroughputSampler(settings_from_json(settings), pass_seconds=pass_seconds)


def nothing_to_read(settings: ThroughputSettings) -> None:
    """Raise ``NoData`` when there is no log to read at all (no file given, no pod log
    directory): checked in the agent before any child process is started."""
    if not settings.files and not os.path.isdir(settings.pod_logs):
        raise NoData(f"no --throughput.file given and no pod log directory at {settings.pod_logs}")


def isolated_sampler(
    settings: ThroughputSettings,
    timeout_seconds: float,
    inputs: Callable[[], ThroughputInputs],
) -> IsolatedSampler:
    """The throughput sampler in a supervised child process: a pass is given
    ``timeout_seconds`` before its child is killed (``hung``); the child stops starting
    streams after half of it, so a slow pass ends with the streams it reached."""
    return IsolatedSampler(
        "throughput",
        ChildSpec(
            "agent.throughput.sampler:child_sampler",
            {"settings": settings_json(settings), "pass_seconds": timeout_seconds / 2},
        ),
        timeout_seconds=timeout_seconds,
        inputs=inputs,
        precheck=lambda: nothing_to_read(settings),
    )
