"""Which logs a throughput pass reads, and the labels each stream carries.

- plain files (``--throughput.file PATH[=JOB]``): globs expanded every pass; namespace, pod
  and container empty; job name from ``=JOB``, ``--throughput.job`` or the file's stem;
- container logs under ``--path.pod-logs`` of the selected pods (the layout and the
  selection: :mod:`agent.throughput.pods`); job name from the pod annotation
  ``fabricscope.io/job``, else the pod's controller; a custom format from
  ``fabricscope.io/throughput-regex``.

Both are generators: the sampler acts on each log as it is found, in the order found.
"""

from __future__ import annotations

import glob
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from agent.config import ThroughputSettings
from agent.core.errors import NoData
from agent.core.sysfs import ReadIssue
from agent.kubernetes.pods import PodIndex, PodMeta
from agent.throughput.pods import (
    Requirement,
    current_log,
    parse_pod_dir,
    selector_matches,
)
from agent.throughput.records import Labels

JOB_ANNOTATION = "fabricscope.io/job"
REGEX_ANNOTATION = "fabricscope.io/throughput-regex"

#: longest job name kept (a Kubernetes object name is at most 253 characters; an annotation,
#: the pod's own text, may hold 256 KiB, and the name is a label of every stream's series)
MAX_JOB_NAME = 253


def job_from_file(pattern_job: str | None, default_job: str | None, path: str) -> str:
    return pattern_job or default_job or Path(path).stem


def job_from_pod(meta: PodMeta | None) -> str:
    """The pod's ``fabricscope.io/job`` annotation, else its controller's name: printable
    ASCII (others become ``?``), at most :data:`MAX_JOB_NAME` characters."""
    if meta is None:
        return ""
    name = meta.annotation(JOB_ANNOTATION) or meta.owner or ""
    return "".join(c if " " <= c <= "~" else "?" for c in name[:MAX_JOB_NAME])


def nothing_to_read(settings: ThroughputSettings) -> None:
    """Raise ``NoData`` when there is no log to read at all (no file given, no pod log
    directory): checked in the agent before any child process is started."""
    if not settings.files and not os.path.isdir(settings.pod_logs):
        raise NoData(f"no --throughput.file given and no pod log directory at {settings.pod_logs}")


def find_files(
    settings: ThroughputSettings, counts: Counter[str], issues: list[ReadIssue]
) -> Iterator[tuple[str, Labels]]:
    """Each plain file given (globs expanded now) with its labels; a pattern that matches
    nothing is counted (``no_match``) and reported."""
    for f in settings.files:
        paths = sorted(glob.glob(f.pattern)) if glob.has_magic(f.pattern) else [f.pattern]
        if not paths:
            counts["no_match"] += 1
            issues.append(ReadIssue(f.pattern, "vanished", "no file matches"))
        for p in paths:
            yield p, ("", "", "", job_from_file(f.job, settings.job, p))


@dataclass(frozen=True, slots=True)
class PodLog:
    """A selected pod's container, found in this pass, with its live log."""

    #: the stream's key: ``cri:<pod uid>/<container>``
    key: str
    labels: Labels
    #: the container's log directory, the names in it and the live log's name
    cdir: str
    names: list[str]
    current: str
    #: the pod's ``fabricscope.io/throughput-regex`` annotation
    regex: str | None
    #: ``namespace/pod``, for messages
    pod: str

    @property
    def path(self) -> str:
        return os.path.join(self.cdir, self.current)


def find_pod_logs(
    settings: ThroughputSettings,
    selector: tuple[Requirement, ...] | None,
    gpu_pods: Callable[[], frozenset[tuple[str, str]] | None],
    pod_index: Callable[[], PodIndex | None],
    issues: list[ReadIssue],
) -> Iterator[PodLog]:
    """Each container log of the selected pods under ``settings.pod_logs``; an unreadable
    log directory is reported, a pod or container gone between two listings skipped."""
    s = settings
    try:
        entries = sorted(os.listdir(s.pod_logs))
    except OSError as exc:
        issues.append(ReadIssue(s.pod_logs, "io", exc.strerror or str(exc)))
        return
    gpu = gpu_pods() if s.pods == "gpu" else None
    index = pod_index()
    for entry in entries:
        pd = parse_pod_dir(entry)
        if pd is None:
            continue
        if s.pods == "gpu" and (gpu is None or (pd.namespace, pd.pod) not in gpu):
            continue
        if s.namespaces and pd.namespace not in s.namespaces:
            continue
        meta = index.by_uid(pd.uid) if index is not None else None
        if selector is not None and (
            meta is None or not selector_matches(selector, dict(meta.labels))
        ):
            continue
        pod_dir = os.path.join(s.pod_logs, entry)
        try:
            containers = sorted(os.listdir(pod_dir))
        except OSError:
            continue  # the pod went between two listings: its streams go in the sampler
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
            yield PodLog(
                key=f"cri:{pd.uid}/{c}",
                labels=(pd.namespace, pd.pod, c, job),
                cdir=cdir,
                names=names,
                current=current,
                regex=regex,
                pod=f"{pd.namespace}/{pd.pod}",
            )
