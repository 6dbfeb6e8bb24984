"""The throughput sampler: the latest throughput each training job printed, per container
or log file, read from its logs with no change to the training code.

Sources (:mod:`agent.throughput.sources`), each a *stream* with its own tail and its own
latest values (:class:`agent.throughput.stream.Stream`):

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
pass (not ``--once``, which reads every file whole); past it the rest of its file waits for
the next pass (``cpu_budget``). A pass stops starting streams after ``pass_seconds``
(``pass_deadline`` per stream not reached; the next pass starts with them): streams not read
keep their last values. At most ``max_open_files`` files are open at any time, within a
pass too (the least recently read is closed before another is opened, and reopens at its
offset when its turn comes), and never more than half the process's soft limit on open
files (``RLIMIT_NOFILE``): thousands of logs are read in turns, each every pass. A log that
still cannot be opened for want of a descriptor is counted (``fd_limit``) and read next
pass. In the agent all of this runs in a supervised child process
(:func:`agent.throughput.child.isolated_sampler`): a pass that still hangs costs that pass,
counted as the throughput sampler's ``hung``, never a scrape.

Counters (lines parsed, NCCL lines, warnings, IB errors, inits, aborts) count each line
once, across restarts:

- an agent (re)started mid-job reads a log's latest values from the window before its end,
  but counts only lines written after it started (``count_from``: the CRI timestamp; a plain
  file met in the first pass counts from where that pass stopped reading). A counter that
  starts again from 0 is a reset Prometheus understands; one that jumped by the warnings of
  the last MiB would read as a burst of new ones;
- a supervised child that replaces one that died carries on from the last pass the agent
  exported (``resumable``: each snapshot holds, per stream, where its tail stopped and its
  counts, :class:`ThroughputResume`, which the agent hands to the next child): nothing read
  twice, nothing skipped.

The same lines feed :mod:`agent.throughput.nccl`: NCCL's own lines (a job run with
``NCCL_DEBUG=INFO`` or ``WARN``) give, per stream, the transports and HCAs its channels use
(reset when the container restarts: a new log is a new run), its NCCL warnings by kind and
its communicator inits and aborts (:class:`~agent.throughput.records.NcclSeries`).
"""

from __future__ import annotations

import logging
import os
import resource
import time
from collections import Counter, OrderedDict
from collections.abc import Callable

from agent.config import ThroughputSettings
from agent.core.errors import SamplerFailure
from agent.core.sysfs import ReadIssue
from agent.kubernetes.pods import PodIndex
from agent.throughput.formats import BadRegex, compile_custom
from agent.throughput.gaps import MISSED_BYTES, MISSED_LINES
from agent.throughput.gzlog import read_gzip_tail
from agent.throughput.nccl_join import nccl_series
from agent.throughput.nccl_run import NODE_HCAS, NODE_IB_ERROR_PAIRS, Admission, NcclRun
from agent.throughput.pods import newest_rotated, parse_selector
from agent.throughput.records import (
    ERROR_REASONS,
    Labels,
    StreamResume,
    StreamTime,
    ThroughputInputs,
    ThroughputResume,
    ThroughputSeries,
    ThroughputSnapshot,
)
from agent.throughput.sources import (
    REGEX_ANNOTATION,
    find_files,
    find_pod_logs,
    nothing_to_read,
)
from agent.throughput.stream import Stream
from agent.throughput.tail import UNREAD_BYTES, WHOLE_FILE, FileTail, Limits

log = logging.getLogger(__name__)

#: an issue's reason in the ReadIssue vocabulary, for the runner's read_errors_total
_ISSUE_REASON = {
    "not_regular_file": "unsupported",
    "symlink": "unsupported",
    "outside_root": "unsupported",
    "bad_regex": "parse",
    "gzip": "parse",
    "no_match": "vanished",
}


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
        count_from: float | None = None,
        resumable: bool = False,
    ) -> None:
        """``pass_seconds``: after this long a pass starts no more streams (None: no bound);
        with ``once``, the time the whole read may take: a file not read whole by then fails
        the pass (``timeout``: no series rather than a stale value). ``cpu_clock`` measures
        each stream's CPU time in a pass.
        ``count_from``: the agent's start (wall time): lines written before it are not
        counted (None: every line read counts, as ``--once`` wants). ``resumable``: each
        snapshot carries its :class:`ThroughputResume` (a supervised child's)."""
        self._settings = settings
        self._once = once
        self._once_deadline: float | None = None
        self._cut = False  # a --once read stopped before the end of a file
        self._count_from = None if once else count_from
        self._resumable = resumable
        self._resume: dict[str, StreamResume] = {}
        self._resumed = False
        self._resume_cache: dict[str, StreamResume] = {}
        self._open: OrderedDict[str, None] = OrderedDict()  # streams with an open tail, LRU
        self._fd_bound = fd_bound(settings.max_open_files)
        self._ib_admission = Admission(NODE_IB_ERROR_PAIRS)
        self._hca_admission = Admission(NODE_HCAS)
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
        self._streams: dict[str, Stream] = {}
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

    def accept_resume(self, value: object) -> None:
        """Carry on from the child this one replaces (its last exported pass), in the child
        process before its first pass."""
        if not isinstance(value, ThroughputResume):
            raise TypeError(f"expected ThroughputResume, got {type(value).__name__}")
        self._resume = {r.key: r for r in value.streams}
        self._gz_done.update(value.gz_done)
        self._counts.update(dict(value.counts))
        self._resumed = True

    def _new_stream(self, key: str, labels: Labels, cri: bool) -> Stream:
        """A stream met for the first time, or taken over from the child this one replaces."""
        st = Stream(
            labels,
            cri=cri,
            counts=self._counts,
            nccl=NcclRun(self._ib_admission, self._hca_admission),
            count_from=self._count_from,
            # a plain file already written when the agent started: its window is history
            history=not cri
            and self._count_from is not None
            and not (self._started or self._resumed),
        )
        resume = self._resume.pop(key, None)
        if resume is not None:
            st.history = False
            st.restore(resume.state, self._ib_admission, self._hca_admission)
            if resume.tail is not None:
                st.tail = FileTail(
                    resume.tail.path,
                    st.on_line,
                    self._counts,
                    cri=cri,
                    limits=self._limits,
                    root=self._settings.pod_logs if cri else None,
                    head_sink=st.on_head_line,
                    filtered=st.filterable,
                    resume=resume.tail,
                )
        self._streams[key] = st
        return st

    def _drop_stream(self, key: str) -> Stream:
        self._open.pop(key, None)
        stream = self._streams.pop(key)
        stream.nccl.release()
        self._resume_cache.pop(key, None)
        return stream

    # -- the pass --------------------------------------------------------------------------

    def sample(self) -> ThroughputSnapshot:
        s = self._settings
        if self._once and self._pass_seconds is not None:
            self._once_deadline = self._mono() + self._pass_seconds
        self._cut = False
        pod_logs_present = os.path.isdir(s.pod_logs)
        if not s.files and not pod_logs_present:
            nothing_to_read(s)
        issues: list[ReadIssue] = []
        wanted: dict[str, tuple[str, Labels, bool, bool]] = {}  # key -> path, labels, cri, new
        gz_seen: set[str] = set()
        for p, labels in find_files(s, self._counts, issues):
            if p.endswith(".gz"):
                gz_seen.add(p)
                self._read_gz_once(p, labels, issues)
                continue
            wanted[p] = (p, labels, False, False)
        self._forget_gz(gz_seen)
        if pod_logs_present:
            self._discover_pods(wanted, issues)
        self._reconcile(wanted, issues)
        self._started = True
        if self._once and self._cut:
            raise SamplerFailure(
                "timeout",
                f"--once: the logs were not read whole within {self._pass_seconds:g}s "
                "(--sampling.timeout); no throughput series rather than stale ones",
            )
        return self._snapshot(issues)

    def _forget_gz(self, seen: set[str]) -> None:
        """A compressed file no pattern matches any more (rotated away, deleted) takes its
        stream and its read-once mark with it: a glob over a rotating log meets a new one
        every rotation, and kept they would grow with the agent's uptime."""
        for key in [k for k in self._streams if k.startswith("gz:") and k[3:] not in seen]:
            self._drop_stream(key).close()
        self._gz_done.intersection_update(seen)

    def _read_gz_once(self, path: str, labels: Labels, issues: list[ReadIssue]) -> None:
        key = "gz:" + path
        stream = self._streams.get(key) or self._new_stream(key, labels, cri=False)
        if path in self._gz_done:
            return
        problem = read_gzip_tail(
            path,
            stream.on_line,
            self._counts,
            cri=False,
            limits=self._limits,
            filtered=stream.filterable,
        )
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
        found = find_pod_logs(
            self._settings, self._selector, self._gpu_pods, self._pod_index, issues
        )
        for pl in found:
            stream = self._streams.get(pl.key)
            if stream is None:
                resumed = pl.key in self._resume
                stream = self._new_stream(pl.key, pl.labels, cri=True)
                if not resumed:
                    self._seed_from_rotated(stream, pl.cdir, pl.names, pl.current, issues)
            self._set_custom(stream, pl.regex, pl.pod, issues)
            # a log met for the first time starts initial_bytes before its end, which is
            # its start for a pod that began after the agent did
            wanted[pl.key] = (pl.path, pl.labels, True, False)

    def _seed_from_rotated(
        self, stream: Stream, cdir: str, names: list[str], current: str, issues: list[ReadIssue]
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
                path,
                stream.on_line,
                self._counts,
                cri=True,
                limits=self._limits,
                root=root,
                filtered=stream.filterable,
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
                filtered=stream.filterable,
            )
            problem = tail.poll()
            tail.close()
        if problem is not None:
            issues.append(ReadIssue(path, _ISSUE_REASON.get(problem[0], problem[0]), problem[1]))
        self._finish_poll(stream, path)

    def _set_custom(
        self, stream: Stream, regex: str | None, pod: str, issues: list[ReadIssue]
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
                stream = self._drop_stream(key)
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
                self._cut = True
                self._cursor = keys.index(key)
                break
            self._poll_stream(key, wanted[key], issues)
        else:
            self._cursor = 0

    def _budget_stop(self) -> Callable[[], bool]:
        """A ``stop`` for one stream's poll: True once it used its CPU budget. ``--once``
        has no next pass to leave the rest to: it reads every file whole."""
        if self._once:
            deadline = self._once_deadline
            return lambda: deadline is not None and self._mono() > deadline
        limit = self._settings.stream_cpu_seconds
        start = self._cpu()
        return lambda: self._cpu() - start > limit

    def _poll_stream(
        self, key: str, want: tuple[str, Labels, bool, bool], issues: list[ReadIssue]
    ) -> None:
        path, labels, cri, new = want
        st = self._streams.get(key)
        if st is None:
            st = self._new_stream(key, labels, cri)
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
                filtered=st.filterable,
            )
        if not st.tail.is_open:
            self._make_room(1)
        problem = st.tail.poll(stop)
        if problem is not None and problem[0] == "fd_limit":  # others hold what is left
            self._make_room(len(self._open) // 2 + 1)
            problem = st.tail.poll(stop)
        if st.tail.is_open:
            self._open[key] = None
            self._open.move_to_end(key)
        else:
            self._open.pop(key, None)
        st.history = False  # the first pass's window is read: what comes next counts
        if st.tail.stopped:  # over its budget with bytes left (the tail counted it)
            self._cut = True
        if problem is not None:
            issues.append(ReadIssue(path, _ISSUE_REASON.get(problem[0], problem[0]), problem[1]))
        self._finish_poll(st, path)

    def _make_room(self, n: int) -> None:
        """Close the least recently read open logs until ``n`` more may open within the
        bound (they reopen at their offset when read again)."""
        while self._open and len(self._open) + n > self._fd_bound:
            key, _ = self._open.popitem(last=False)
            st = self._streams.get(key)
            if st is not None and st.tail is not None:
                st.tail.close()

    def _finish_poll(self, stream: Stream, path: str) -> None:
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
            missed_bytes_total=self._counts.get(MISSED_BYTES, 0),
            missed_lines_total=self._counts.get(MISSED_LINES, 0),
            nccl=nccl_series(
                ((st.labels, st.cri, st.nccl) for st in self._streams.values()),
                self._numa(),
                self._nvlinks(),
            ),
            resume=self._resume_state() if self._resumable else None,
        )

    def _resume_state(self) -> ThroughputResume:
        out = []
        for key, st in self._streams.items():
            tail = st.tail.resume_state() if st.tail is not None else None
            cached = self._resume_cache.get(key)
            if cached is None or st.dirty or cached.tail != tail:
                if cached is None or st.dirty:
                    state = st.state()
                    st.dirty = False
                else:
                    state = cached.state
                if tail is None and cached is not None:
                    tail = cached.tail  # a dropped tail: where it stopped still holds
                cached = self._resume_cache[key] = StreamResume(key, tail, state)
            out.append(cached)
        return ThroughputResume(
            streams=tuple(out),
            gz_done=tuple(sorted(self._gz_done)),
            counts=tuple(sorted(self._counts.items())),
        )

    def close(self) -> None:
        for stream in self._streams.values():
            stream.close()
            stream.nccl.release()
        self._streams.clear()


def fd_bound(max_open_files: int) -> int:
    """Logs open at once: ``max_open_files``, but at most half the soft limit on open files
    (the rest is the process's own: sockets, pipes, libraries), and at least 1."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max(1, max_open_files)
    return max(1, min(max_open_files, soft // 2))


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None
