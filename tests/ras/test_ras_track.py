"""What a job's RAS answers mean across polls (agent/ras/track.py): counts moving, a hang, a
stopped rank, a straggler, the few ranks named. Answers are built in NCCL's layout with
synthetic values (tests/ras_standin.py): each test is a sequence a real job goes through."""

from __future__ import annotations

from agent.ras.parse import parse_status
from agent.ras.track import JobStatus, JobTracker
from tests.ras_standin import communicator, job, missing_entry, rank_entry, status_json


def feed(tracker: JobTracker, answers: list[bytes], step: float = 30.0) -> list[JobStatus]:
    return [tracker.update(parse_status(a), i * step) for i, a in enumerate(answers)]


def test_a_healthy_job_moves_and_names_nobody() -> None:
    # collectives outpace the gather: a rank or two behind by one, a different one each time
    answers = [
        job(4, [10, 10, 9, 10]),
        job(4, [20, 19, 20, 20]),
        job(4, [30, 30, 30, 29]),
        job(4, [41, 40, 40, 40]),
        job(4, [50, 50, 50, 50]),
    ]
    out = feed(JobTracker(), answers)
    assert [s.counts_unchanged_seconds for s in out] == [0.0] * 5
    assert [s.mismatched_communicators for s in out] == [1, 1, 1, 1, 0]
    assert [s.count_spread for s in out] == [1, 1, 1, 1, 0]
    assert all(s.named == () for s in out)
    assert out[-1].ranks == (("dead", 0), ("responsive", 4), ("unresponsive", 0))


def test_counts_that_stop_everywhere_grow_the_unchanged_time() -> None:
    answers = [job(4, 100), job(4, 101), job(4, 101), job(4, 101), job(4, 101)]
    out = feed(JobTracker(), answers)
    assert [s.counts_unchanged_seconds for s in out] == [0.0, 0.0, 30.0, 60.0, 90.0]
    assert all(s.mismatched_communicators == 0 and s.named == () for s in out)


def test_a_stopped_rank_is_unresponsive_then_dead_and_named_first() -> None:
    answers = [
        job(4, 100),
        job(4, [103, 103, 102, 103]),
        job(4, 103, stopped=[2]),
        job(4, 103, stopped=[2]),
        job(4, 103, stopped=[2], dead=True),
    ]
    out = feed(JobTracker(), answers)
    assert [s.rank_count("unresponsive") for s in out] == [0, 0, 1, 1, 0]
    assert [s.rank_count("dead") for s in out] == [0, 0, 0, 0, 1]
    assert [s.rank_count("responsive") for s in out] == [4, 4, 3, 3, 3]
    # the others wait on it: nothing moves once it stopped
    assert [s.counts_unchanged_seconds for s in out] == [0.0, 0.0, 30.0, 60.0, 90.0]
    named = out[2].named
    assert [(r.rank, r.state, r.host, r.pid, r.gpu) for r in named] == [
        (2, "unresponsive", "10.0.0.1", 1002, 2)
    ]
    assert out[4].named[0].state == "dead"


def test_a_rank_stuck_outside_nccl_is_named_lagging() -> None:
    # rank 1 sits in its data loader: its RAS thread answers, its count stays behind
    answers = [job(4, [50, 50, 50, 50])] + [job(4, [51, 50, 51, 51])] * 5
    out = feed(JobTracker(lag_answers=4), answers)
    assert [len(s.named) for s in out] == [0, 0, 0, 0, 1, 1]
    r = out[4].named[0]
    assert (r.rank, r.state, r.behind, r.answers) == (1, "lagging", 1, 4)
    assert out[5].named[0].answers == 5
    assert out[5].counts_unchanged_seconds == 120.0


def test_a_straggler_that_catches_up_resets_its_streak() -> None:
    answers = [
        job(2, [10, 9]),
        job(2, [20, 19]),
        job(2, [30, 29]),
        job(2, [40, 40]),
        job(2, [50, 49]),
    ]
    out = feed(JobTracker(lag_answers=4), answers)
    assert all(s.named == () for s in out)


def test_a_rank_in_several_communicators_counts_once_with_its_world_rank() -> None:
    world = communicator([rank_entry(r, allreduce=5) for r in range(4)], hash_="0x1", size=4)
    # a 2-rank subcommunicator: world ranks 2 and 3 are its ranks 0 and 1
    sub = communicator(
        [rank_entry(0, pid=1002, gpu=2, allreduce=3)],
        [missing_entry(1, pid=1003, gpu=3)],
        hash_="0x2",
        size=2,
    )
    s = JobTracker().update(parse_status(status_json([sub, world])), 0.0)
    assert s.communicators == 2
    assert s.ranks == (("dead", 0), ("responsive", 3), ("unresponsive", 1))
    assert [(r.rank, r.pid) for r in s.named] == [(3, 1003)]


def test_async_errors_by_kind() -> None:
    ranks = [rank_entry(0, async_error=6), rank_entry(1, async_error=2), rank_entry(2)]
    s = JobTracker().update(parse_status(status_json([communicator(ranks)])), 0.0)
    kinds = dict(s.async_error_ranks)
    assert kinds["remote_error"] == 1 and kinds["system_error"] == 1
    assert sum(kinds.values()) == 2


def test_named_ranks_are_capped_dead_first() -> None:
    ranks = [rank_entry(r) for r in range(2)]
    missing = [missing_entry(r, dead=r % 3 == 0) for r in range(2, 40)]
    s = JobTracker(max_named=8).update(
        parse_status(status_json([communicator(ranks, missing)])), 0.0
    )
    assert len(s.named) == 8
    assert [r.state for r in s.named[:3]] == ["dead"] * 3
    assert s.rank_count("dead") + s.rank_count("unresponsive") == 38


def test_a_new_communicator_is_movement() -> None:
    one = status_json([communicator([rank_entry(0, allreduce=5)], hash_="0x1")])
    two = status_json(
        [
            communicator([rank_entry(0, allreduce=5)], hash_="0x1"),
            communicator([rank_entry(0, allreduce=0)], hash_="0x2"),
        ]
    )
    out = feed(JobTracker(), [one, one, two])
    assert [s.counts_unchanged_seconds for s in out] == [0.0, 30.0, 0.0]
