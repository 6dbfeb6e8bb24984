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

No log line is ever kept past its parse, exported or logged: only numbers leave.
"""

from __future__ import annotations

import glob
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agent.config import ThroughputSettings
from agent.core.errors import NoData
from agent.core.sysfs import ReadIssue
from agent.kubernetes.podwatch import PodIndex, PodMeta
from agent.throughput.formats import BadRegex, compile_custom, parse_line
from agent.throughput.linear import Pattern
from agent.throughput.pods import (
    current_log,
    newest_rotated,
    parse_pod_dir,
    parse_selector,
    selector_matches,
)
from agent.throughput.tail import TAIL_REASONS, WHOLE_FILE, FileTail, Limits, read_gzip_tail

log = logging.getLogger(__name__)

#: reasons counted in ``ThroughputSnapshot.errors_total``
ERROR_REASONS = tuple(sorted({*TAIL_REASONS, "bad_regex", "no_match"}))
JOB_ANNOTATION = "fabricscope.io/job"
REGEX_ANNOTATION = "fabricscope.io/throughput-regex"

#: an issue's reason in the ReadIssue vocabulary, for the runner's read_errors_total
_ISSUE_REASON = {
    "not_regular_file": "unsupported",
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
class ThroughputSnapshot:
    """One pass: series sorted by labels; ``sources`` logs tailed; errors since start."""

    series: tuple[ThroughputSeries, ...] = ()
    times: tuple[StreamTime, ...] = ()
    sources: int = 0
    errors_total: tuple[tuple[str, int], ...] = tuple((r, 0) for r in ERROR_REASONS)
    issues: tuple[ReadIssue, ...] = ()


# --- streams -------------------------------------------------------------------------------

Labels = tuple[str, str, str, str]  # namespace, pod, container, job_name


@dataclass(slots=True)
class _Stream:
    labels: Labels
    cri: bool
    tail: FileTail | None = None
    values: dict[str, dict[str, float]] = field(default_factory=dict)
    parsed: Counter[str] = field(default_factory=Counter)
    last_ts: float | None = None
    custom: Pattern | None = None
    custom_source: str | None = None
    custom_error: str | None = None
    parsed_this_poll: bool = False
    line_ts: float | None = None

    def on_line(self, text: str, ts: float | None) -> None:
        r = parse_line(text, self.custom)
        if r is None:
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
            self.tail.close()
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
        once: bool = False,
        limits: Limits | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._gpu_pods = gpu_pods
        self._pod_index = pod_index
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

    # -- the pass --------------------------------------------------------------------------

    def sample(self) -> ThroughputSnapshot:
        s = self._settings
        pod_logs_present = os.path.isdir(s.pod_logs)
        if not s.files and not pod_logs_present:
            raise NoData(f"no --throughput.file given and no pod log directory at {s.pod_logs}")
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
        stream = self._streams.setdefault("gz:" + path, _Stream(labels, cri=False))
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
                    stream = self._streams[key] = _Stream(labels, cri=True)
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
        path = os.path.join(cdir, rotated)
        if rotated.endswith(".gz"):
            problem = read_gzip_tail(
                path, stream.on_line, self._counts, cri=True, limits=self._limits
            )
        else:
            tail = FileTail(path, stream.on_line, self._counts, cri=True, limits=self._limits)
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
        for key in [k for k in self._streams if not k.startswith("gz:")]:
            if key not in wanted:
                stream = self._streams.pop(key)
                if stream.tail is not None:
                    stream.tail.poll()  # what was written before it went
                    if not os.path.exists(stream.tail.path):
                        self._counts["vanished"] += 1
                stream.close()
        for key, (path, labels, cri, new) in wanted.items():
            st = self._streams.get(key)
            if st is None:
                st = self._streams[key] = _Stream(labels, cri=cri)
            st.labels = labels
            fresh = new
            if st.tail is not None and st.tail.path != path:
                st.tail.poll()  # the container restarted: finish its previous log
                self._finish_poll(st, st.tail.path)
                st.close()
                fresh = True
            if st.tail is None:
                st.tail = FileTail(
                    path, st.on_line, self._counts, cri=cri, limits=self._limits, new_file=fresh
                )
            problem = st.tail.poll()
            if problem is not None:
                issues.append(
                    ReadIssue(path, _ISSUE_REASON.get(problem[0], problem[0]), problem[1])
                )
            self._finish_poll(st, path)

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
