"""The throughput sampler end to end on real directory trees laid out as the kubelet lays out
/var/log/pods (CRI format), and on plain files; and ``fabricscope agent --once
--throughput.file`` against a golden exposition linted by promtool.

The kubelet and API server cannot run here: the pod log tree is written in the kubelet's
documented layout and CRI line format, with message text from the real logs of
tests/fixtures/throughput-logs; pod metadata is parsed from API-shaped JSON by the real
agent.kubernetes.podwatch.parse_pod.
"""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import pytest

from agent.config import ThroughputFile, ThroughputSettings
from agent.core.errors import NoData
from agent.kubernetes.podwatch import PodIndex, parse_pod
from agent.throughput.records import ThroughputSeries, ThroughputSnapshot
from agent.throughput.sampler import ThroughputSampler
from exporter.metrics.spec import Families
from exporter.metrics.throughput import render
from tests.agentrun import throughput_once
from tests.promharness import promtool_check_metrics

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "tests" / "fixtures" / "throughput-logs"
GOLDEN = ROOT / "tests" / "golden" / "throughput.prom"

GOOD = "\t Train throughput/tokens_per_sec: 55803.1245"
BAD = "\t Train throughput/tokens_per_sec: 36769.6582"
UID0 = "0b8a7c1e-1111-4c43-8d6c-6a3a8f2f11aa"
UID1 = "0b8a7c1e-2222-4c43-8d6c-6a3a8f2f11aa"
UID2 = "0b8a7c1e-3333-4c43-8d6c-6a3a8f2f11aa"


def cri(msg: str, ts: str = "2026-11-20T10:00:00.5Z", tag: str = "F") -> str:
    return f"{ts} stdout {tag} {msg}\n"


def container_log(root: Path, ns: str, pod: str, uid: str, container: str, *, n: int = 0) -> Path:
    d = root / f"{ns}_{pod}_{uid}" / container
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{n}.log"


def pod_meta(uid: str, name: str, *, labels: dict[str, str], annotations: dict[str, str]) -> object:
    return {
        "metadata": {
            "uid": uid,
            "name": name,
            "namespace": "training",
            "labels": labels,
            "annotations": {**annotations, "secret.example.com/token": "never kept"},
            "ownerReferences": [
                {"kind": "PyTorchJob", "name": "llm", "controller": True, "uid": "x"}
            ],
        }
    }


def series(snap: ThroughputSnapshot, pod: str, fmt: str = "composer") -> ThroughputSeries:
    return next(s for s in snap.series if s.pod == pod and s.format == fmt)


@pytest.fixture
def pod_logs(tmp_path: Path) -> Path:
    root = tmp_path / "pods"
    container_log(root, "training", "llm-0", UID0, "trainer").write_text(
        cri("[batch=20/20]:") + cri(GOOD, "2026-11-20T10:00:01.25Z")
    )
    container_log(root, "training", "llm-1", UID1, "trainer").write_text(
        cri(BAD, "2026-11-20T10:00:02Z")
    )
    container_log(root, "web", "frontend", UID2, "nginx").write_text(
        cri("\t Train throughput/tokens_per_sec: 1.0")
    )
    return root


def test_gpu_pods_by_default_with_cri_timestamps(pod_logs: Path) -> None:
    s = ThroughputSampler(
        ThroughputSettings(pod_logs=str(pod_logs)),
        gpu_pods=lambda: frozenset({("training", "llm-0"), ("training", "llm-1")}),
    )
    snap = s.sample()
    assert {(x.namespace, x.pod, x.container) for x in snap.series} == {
        ("training", "llm-0", "trainer"),
        ("training", "llm-1", "trainer"),
    }
    assert series(snap, "llm-0").tokens_per_second == 55803.1245
    assert series(snap, "llm-1").tokens_per_second == 36769.6582
    times = {t.pod: t.last_parsed_timestamp_seconds for t in snap.times}
    assert times["llm-0"] == pytest.approx(1795168801.25)
    assert snap.sources == 2


def test_no_attribution_reads_no_pod_and_all_widens(pod_logs: Path) -> None:
    none = ThroughputSampler(ThroughputSettings(pod_logs=str(pod_logs)))
    assert none.sample().series == ()
    everyone = ThroughputSampler(ThroughputSettings(pod_logs=str(pod_logs), pods="all"))
    assert {x.pod for x in everyone.sample().series} == {"llm-0", "llm-1", "frontend"}
    narrowed = ThroughputSampler(
        ThroughputSettings(pod_logs=str(pod_logs), pods="all", namespaces=("training",))
    )
    assert {x.pod for x in narrowed.sample().series} == {"llm-0", "llm-1"}


def test_label_selector_job_annotation_and_owner(pod_logs: Path) -> None:
    index = PodIndex(
        p
        for p in (
            parse_pod(
                pod_meta(
                    UID0,
                    "llm-0",
                    labels={"app": "llm"},
                    annotations={"fabricscope.io/job": "llm-70b-run7"},
                )
            ),
            parse_pod(pod_meta(UID1, "llm-1", labels={"app": "llm"}, annotations={})),
        )
        if p is not None
    )
    s = ThroughputSampler(
        ThroughputSettings(pod_logs=str(pod_logs), pods="all", selector="app=llm"),
        pod_index=lambda: index,
    )
    snap = s.sample()
    assert {(x.pod, x.job_name) for x in snap.series} == {
        ("llm-0", "llm-70b-run7"),  # the annotation
        ("llm-1", "llm"),  # the controller owning the pod
    }
    assert all(
        p.annotations == () or p.annotations[0][0].startswith("fabricscope.io/")
        for p in index.pods()
    )  # other annotations are never kept


def test_custom_regex_annotation_and_a_bad_one_never_crash(pod_logs: Path) -> None:
    container_log(pod_logs, "training", "llm-0", UID0, "trainer").write_text(
        cri("rank0 step 12 | 1834.2 tok/s | loss 2.1") + cri(GOOD)
    )
    container_log(pod_logs, "training", "llm-1", UID1, "trainer").write_text(cri(BAD))
    good = parse_pod(
        pod_meta(
            UID0,
            "llm-0",
            labels={},
            annotations={
                "fabricscope.io/throughput-regex": r"\| (?P<tokens_per_second>[\d.]+) tok/s"
            },
        )
    )
    bad = parse_pod(
        pod_meta(
            UID1,
            "llm-1",
            labels={},
            annotations={"fabricscope.io/throughput-regex": r"(?P<tokens_per_second>[\d.]+"},
        )
    )
    assert good is not None and bad is not None
    s = ThroughputSampler(
        ThroughputSettings(pod_logs=str(pod_logs), pods="all", namespaces=("training",)),
        pod_index=lambda: PodIndex([good, bad]),
    )
    snap = s.sample()
    assert series(snap, "llm-0", "custom").tokens_per_second == 1834.2
    assert series(snap, "llm-0", "composer").tokens_per_second == 55803.1245
    assert series(snap, "llm-1", "composer").tokens_per_second == 36769.6582  # built-ins still
    assert dict(snap.errors_total)["bad_regex"] == 1
    assert [i.reason for i in snap.issues] == ["parse"]
    assert "does not compile" in snap.issues[0].detail
    snap = s.sample()  # counted once per regex, reported every pass
    assert dict(snap.errors_total)["bad_regex"] == 1 and len(snap.issues) == 1


def test_restart_rotation_gzip_and_deleted_pod_dir(pod_logs: Path) -> None:
    s = ThroughputSampler(
        ThroughputSettings(pod_logs=str(pod_logs), pods="all", namespaces=("training",))
    )
    s.sample()
    log0 = container_log(pod_logs, "training", "llm-0", UID0, "trainer")
    with log0.open("a") as f:
        f.write(cri("\t Train throughput/tokens_per_sec: 100.0"))
    container_log(pod_logs, "training", "llm-0", UID0, "trainer", n=1).write_text(
        cri("\t Train throughput/tokens_per_sec: 200.0")
        + cri("\t Train throughput/samples_per_sec: 3.0")
    )
    snap = s.sample()  # the container restarted: 0.log read to its end, then 1.log whole
    llm0 = series(snap, "llm-0")
    assert (llm0.tokens_per_second, llm0.samples_per_second, llm0.lines_parsed) == (200.0, 3.0, 4)
    shutil.rmtree(pod_logs / f"training_llm-1_{UID1}")
    snap = s.sample()
    assert {x.pod for x in snap.series} == {"llm-0"}
    assert dict(snap.errors_total)["vanished"] == 1


def test_newly_seen_container_seeds_from_its_rotated_gzip(tmp_path: Path) -> None:
    root = tmp_path / "pods"
    live = container_log(root, "training", "llm-0", UID0, "trainer")
    live.write_text(cri("just rotated, nothing yet"))
    with gzip.open(live.parent / "0.log.20261120-100000.gz", "wt") as f:
        f.write(cri(GOOD))
    (live.parent / "0.log.20261120-090000").write_text(cri(BAD))  # older: not read
    s = ThroughputSampler(ThroughputSettings(pod_logs=str(root), pods="all"))
    assert series(s.sample(), "llm-0").tokens_per_second == 55803.1245


def test_plain_files_glob_job_names_and_no_match(tmp_path: Path) -> None:
    (tmp_path / "run-a.log").write_text(GOOD + "\n")
    (tmp_path / "run-b.log").write_text(BAD + "\n")
    with gzip.open(tmp_path / "old.log.gz", "wt") as f:
        f.write("iter 2000: loss 1.1275, time 88782.56ms, mfu 0.43%\n")
    s = ThroughputSampler(
        ThroughputSettings(
            files=(
                ThroughputFile(str(tmp_path / "run-*.log")),
                ThroughputFile(str(tmp_path / "old.log.gz"), "archive"),
                ThroughputFile(str(tmp_path / "missing-*.log")),
            ),
            pod_logs=str(tmp_path / "no-pods"),
        ),
        once=True,
    )
    snap = s.sample()
    assert {(x.job_name, x.format) for x in snap.series} == {
        ("run-a", "composer"),
        ("run-b", "composer"),
        ("archive", "nanogpt"),
    }
    assert {t.job_name for t in snap.times} == {"run-a", "run-b", "archive"}
    assert dict(snap.errors_total)["no_match"] == 1
    assert [i.reason for i in snap.issues] == ["vanished"]


def test_nothing_to_read_is_no_data(tmp_path: Path) -> None:
    with pytest.raises(NoData):
        ThroughputSampler(ThroughputSettings(pod_logs=str(tmp_path / "absent"))).sample()


def test_render_labels_follow_the_contract(pod_logs: Path) -> None:
    s = ThroughputSampler(
        ThroughputSettings(pod_logs=str(pod_logs), pods="all", namespaces=("training",))
    )
    out = Families()
    render(s.sample(), out)
    names = {spec.name: (spec.labels, samples) for spec, samples in out.items()}
    labels, samples = names["fabricscope_throughput_tokens_per_second"]
    assert labels == ("namespace", "pod", "container", "job_name", "format")
    assert (("training", "llm-0", "trainer", "", "composer"), 55803.1245) in samples
    assert names["fabricscope_throughput_last_parsed_timestamp_seconds"][0] == (
        "namespace",
        "pod",
        "container",
        "job_name",
    )


def test_once_prints_the_latest_values_golden_and_lints(tmp_path: Path) -> None:
    """``fabricscope agent --once --throughput.file F=JOB`` on real logs, as a textfile
    collector cron job would run it; the output is diffed against a golden file and linted by
    promtool."""
    log = tmp_path / "train.log"
    shutil.copy(LOGS / "composer" / "rocm-mpt30b-2node.log", log)
    mixtral = tmp_path / "mixtral-16xh100.out"
    shutil.copy(
        LOGS / "megatron" / "nvidia-megatron-lm-issue756.mixtral-16xh100.lines.txt", mixtral
    )
    for f in (log, mixtral):
        os.utime(f, (1795168800, 1795168800))
    proc = throughput_once([f"{log}=mpt-30b", str(mixtral)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = "".join(
        line + "\n"
        for line in proc.stdout.splitlines()
        if line.startswith(
            (
                "fabricscope_throughput",
                "# HELP fabricscope_throughput",
                "# TYPE fabricscope_throughput",
            )
        )
    )
    promtool_check_metrics(proc.stdout)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
    assert (
        'fabricscope_throughput_tokens_per_second{container="",format="composer",'
        'job_name="mpt-30b",namespace="",pod=""} 20082.8418' in text
    )


def test_rotated_away_gzip_files_leave_no_stream_behind(tmp_path: Path) -> None:
    """A glob over a log that logrotate compresses (``train.log-<date>.gz``, the oldest
    removed) meets a new compressed file every rotation: each is read once, and its stream
    and read-once mark go when it does, so the agent holds as many as exist, not as many as
    it ever met."""
    live = tmp_path / "train.log"
    live.write_text(GOOD + "\n")
    s = ThroughputSampler(
        ThroughputSettings(
            files=(ThroughputFile(str(tmp_path / "train.log*"), "train"),),
            pod_logs=str(tmp_path / "no-pods"),
        ),
        count_from=0.0,
    )
    kept = 3
    for day in range(1, 21):
        with gzip.open(tmp_path / f"train.log-202611{day:02d}.gz", "wt") as f:
            f.write(BAD + "\n")
        for old in sorted(tmp_path.glob("train.log-*.gz"))[:-kept]:
            old.unlink()
        snap = s.sample()
        assert {x.job_name for x in snap.series} == {"train"}
        gz_streams = [k for k in s._streams if k.startswith("gz:")]
        assert len(gz_streams) <= kept, gz_streams
        assert len(s._gz_done) <= kept
    # a compressed file still there is not read again
    before = dict(snap.errors_total)
    assert s.sample().series == snap.series and dict(s.sample().errors_total) == before
