"""A supervised child can always be replaced, and its replacement counts no line twice: the
throughput sampler's real child process, real signals, real files.

- SIGSTOP on the child while the agent sends it a pod index nearly three times a pipe's buffer
  (110 pods, ~190 KB): the pass fails as ``hung`` within its deadline, the stopped child is
  killed, and the next child answers with the series.
- SIGKILL on the child between two passes: the next child carries on from the last pass
  the agent exported, so NCCL warnings, IB errors and parsed lines neither jump (a log's
  last MiB read again) nor lose the lines written while no child ran.
- A new agent (a new sampler) on the same logs starts its counters from 0 and counts only
  what is written after it started.
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent.config import ThroughputSettings
from agent.core.errors import SamplerFailure
from agent.core.isolation import IsolatedSampler
from agent.kubernetes.podwatch import PodIndex, PodMeta
from agent.throughput.child import isolated_sampler
from agent.throughput.records import ThroughputInputs, ThroughputSnapshot

UID = "0b8a7c1e-eeee-4c43-8d6c-6a3a8f2f11aa"
#: NCCL 2.20+'s IB completion error, as it prints it (tests/fixtures/nccl-logs)
WARN = (
    "node-7:2041:2290 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer "
    "10.0.0.8<33142> with status=12 opcode=129 len=65536 vendor err 129 (Recv) "
    "localGid ::ffff:10.0.0.7 remoteGids::ffff:10.0.0.8"
)
TOKENS = "\t Train throughput/tokens_per_sec: {}"


def cri(msg: str, at: float | None = None) -> str:
    stamp = datetime.fromtimestamp(time.time() if at is None else at, UTC)
    return f"{stamp.strftime('%Y-%m-%dT%H:%M:%S.%f')}000Z stdout F {msg}\n"


def pod_log(root: Path, i: int = 0) -> Path:
    d = root / f"tenant_trainer-{i}_{UID[:-3]}{i:03d}" / "trainer"
    d.mkdir(parents=True, exist_ok=True)
    return d / "0.log"


def append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def warnings(snap: ThroughputSnapshot) -> int:
    return sum(dict(s.warnings).get("ib_completion", 0) for s in snap.nccl)


def ib_errors(snap: ThroughputSnapshot) -> int:
    return sum(n for s in snap.nccl for _, _, n in s.ib_errors)


def parsed(snap: ThroughputSnapshot) -> int:
    return sum(s.lines_parsed for s in snap.series)


def until_answer(child: IsolatedSampler, within: float) -> ThroughputSnapshot:
    """Passes until one answers (a replaced child waits out its backoff first)."""
    deadline = time.monotonic() + within
    while True:
        try:
            snap = child.sample()
            assert isinstance(snap, ThroughputSnapshot)
            return snap
        except SamplerFailure as exc:
            assert exc.reason == "backoff", exc
            assert time.monotonic() < deadline, f"no child answered within {within}s"
            time.sleep(0.1)


def big_index(n: int = 110) -> PodIndex:
    """A node's pod index as the API-server watch keeps it: 110 pods, each with the labels,
    container ids and fabricscope annotation a training pod carries."""
    pods = []
    for i in range(n):
        labels = tuple((f"example.com/label-{k:02d}", f"value-{i}-{k}" * 2) for k in range(20))
        containers = tuple((f"{i:04d}{k:060d}", f"container-{k}") for k in range(8))
        regex = r"step (?P<iterations_per_second>\d+(?:\.\d+)?) it/s " + "x" * 200
        pods.append(
            PodMeta(
                f"uid-{i:05d}",
                "tenant",
                f"pod-{i}",
                containers=containers,
                labels=labels,
                annotations=(("fabricscope.io/throughput-regex", regex),),
                owner=f"job-{i}",
            )
        )
    return PodIndex(pods)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, dict[str, object]]:
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def test_a_stopped_child_is_replaced_while_a_pod_index_is_sent(tmp_path: Path) -> None:
    log = pod_log(tmp_path)
    log.write_text(cri(TOKENS.format("1.5")))
    index = big_index()
    assert len(pickle.dumps(index)) > 2 * 64 * 1024  # more than twice what a pipe holds
    inputs = [ThroughputInputs(None, PodIndex())]
    timeout = 2.0
    settings = ThroughputSettings(pod_logs=str(tmp_path), pods="all")
    child = isolated_sampler(settings, timeout, lambda: inputs[0])
    stopped: int | None = None
    try:
        first = until_answer(child, 60)  # a fresh child on a loaded machine
        assert [s.tokens_per_second for s in first.series] == [1.5]
        stopped = child.pid
        assert stopped is not None
        os.kill(stopped, signal.SIGSTOP)
        inputs[0] = ThroughputInputs(None, index)  # the watch saw the node's pods
        t0 = time.monotonic()
        worker, box = in_thread(child.sample)
        # the pass's own deadline, the kill, and a loaded machine's slack
        worker.join(timeout + 15)
        assert not worker.is_alive(), "the pass blocked writing to a stopped child"
        assert time.monotonic() - t0 < timeout + 15
        failure = box.get("error")
        assert isinstance(failure, SamplerFailure) and failure.reason == "hung", box
        assert not alive(stopped), "the stopped child was left running"
        append(log, cri(TOKENS.format("2.5")))
        snap = until_answer(child, 60)  # its replacement, after the backoff
        assert child.pid not in (None, stopped)
        assert child.restarts_total == 1
        assert [s.tokens_per_second for s in snap.series] == [2.5]  # the series moves again
    finally:
        if stopped is not None and alive(stopped):
            os.kill(stopped, signal.SIGKILL)  # today's code: unblock the stuck write
        child.close()


def test_a_killed_child_is_replaced_without_counting_a_line_twice(tmp_path: Path) -> None:
    log = pod_log(tmp_path)
    log.write_text(cri(TOKENS.format("0.5")))
    settings = ThroughputSettings(pod_logs=str(tmp_path), pods="all")
    started = time.time() - 1
    child = isolated_sampler(settings, 5.0, ThroughputInputs, count_from=started)
    try:
        until_answer(child, 60)
        append(log, cri(WARN) * 10)
        snap = until_answer(child, 30)
        assert warnings(snap) == 10
        # more than the MiB a fresh child reads again, then five more warnings
        filler = cri(TOKENS.format("7.5") + " " + "x" * 200)
        append(log, filler * ((1 << 20) // len(filler) + 2000) + cri(WARN) * 5)
        snap = until_answer(child, 30)
        assert warnings(snap) == ib_errors(snap) == 15
        lines = parsed(snap)
        before = child.pid
        assert before is not None
        os.kill(before, signal.SIGKILL)
        append(log, cri(WARN) * 2)  # written while no child runs
        with pytest.raises(SamplerFailure) as failed:
            child.sample()
        assert failed.value.reason == "crashed"
        snap = until_answer(child, 30)
        assert child.pid not in (None, before)
        # today's code: the new child counts the 5 + 2 of the last MiB again from zero (a
        # drop Prometheus takes for a reset, and adds as 7 new warnings)
        assert warnings(snap) == ib_errors(snap) == 17
        assert parsed(snap) == lines
        append(log, cri(WARN) + cri(TOKENS.format("8.5")))
        snap = until_answer(child, 30)
        assert warnings(snap) == 18 and parsed(snap) == lines + 1
        assert [s.tokens_per_second for s in snap.series] == [8.5]
    finally:
        child.close()
    # a new agent on the same log: its counters start from 0 (a reset), and only what is
    # written after it started counts; its latest values are there at once
    again = isolated_sampler(settings, 5.0, ThroughputInputs, count_from=time.time())
    try:
        snap = until_answer(again, 60)
        assert warnings(snap) == 0 and parsed(snap) == 0
        assert [s.tokens_per_second for s in snap.series] == [8.5]
        append(log, cri(WARN) * 3)
        snap = until_answer(again, 30)
        assert warnings(snap) == 3
    finally:
        again.close()
