"""Each child's memory ceiling (agent/core/ceiling.py): its share of the pod's limit, its
floor, its ceiling when no limit is known, the RAS child's answer cap that follows from its
share, the kernel refusing an allocation past it in a real process, and a supervised child
that reaches it ended, counted and replaced."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.core.ceiling import MIB, child_ceiling
from agent.core.errors import SamplerFailure
from agent.core.isolation import ChildSpec, IsolatedSampler
from agent.ras.sampler import CEILING_PER_ANSWER_BYTE, MIN_ANSWER_CAP, answer_cap


@pytest.mark.parametrize(
    ("child", "limit", "ceiling"),
    [
        ("nvml", 256 * MIB, 192 * MIB),  # the floor: a fifth of 256 MiB is below it
        ("nvml", 2048 * MIB, int(2048 * MIB * 0.20)),
        ("nvml", None, 1024 * MIB),  # no limit known: generous
        ("throughput", 256 * MIB, 96 * MIB),
        ("throughput", 1024 * MIB, int(1024 * MIB * 0.15)),
        ("ibpeer", None, 256 * MIB),
        ("ras", 256 * MIB, int(256 * MIB * 0.35)),
        ("a-new-child", 256 * MIB, 128 * MIB),
    ],
)
def test_a_childs_ceiling_is_its_share_never_below_its_floor(
    child: str, limit: int | None, ceiling: int
) -> None:
    assert child_ceiling(child, limit) == ceiling


def test_the_ras_answer_cap_fits_its_share_of_the_limit() -> None:
    """The chart's 256 MiB: answers up to 3 MiB (what 35 % of it decodes), not 16 MiB; the
    ceiling raised for that cap is still the share. Without a limit, the flag's cap."""
    cap = answer_cap(16 * MIB, 256 * MIB)
    assert 2.5 * MIB < cap < 3.5 * MIB
    assert child_ceiling("ras", 256 * MIB, extra=CEILING_PER_ANSWER_BYTE * cap) == int(
        256 * MIB * 0.35
    )
    assert answer_cap(16 * MIB, None) == 16 * MIB
    assert answer_cap(16 * MIB, 64 * MIB) == MIN_ANSWER_CAP  # never below a MiB
    assert answer_cap(1 << 16, 64 * MIB) == 1 << 16  # never above the flag


CHILD = r"""
import sys
from agent.core.ceiling import apply_ceiling, data_bytes
apply_ceiling(int(sys.argv[1]))
small = bytearray(8 << 20)  # well within
try:
    big = bytearray(int(sys.argv[1]))
except MemoryError:
    print("refused", data_bytes() < int(sys.argv[1]))
else:
    print("allocated")
"""


def test_the_kernel_refuses_an_allocation_past_the_ceiling() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(96 * MIB)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.split() == ["refused", "True"], done.stderr


@pytest.mark.parametrize(
    ("take_mib", "said"),
    [
        (1024, "MemoryError in a pass"),  # one allocation past the ceiling: refused
        (6, "in use after a pass"),  # a leak: ended once above 90 % of its ceiling
    ],
)
def test_a_child_at_its_ceiling_is_ended_counted_and_replaced(
    tmp_path: Path, take_mib: int, said: str
) -> None:
    """A child whose sampler asks for more memory than its ceiling (128 MiB: the floor of a
    child with no share of its own) fails its pass as ``memory_ceiling``, is ended, and is
    replaced after its backoff; the replacement answers once the sampler stops asking."""
    quiet = tmp_path / "quiet"
    now = [0.0]
    child = IsolatedSampler(
        "memory_hog",
        ChildSpec("tests.memory_hog:sampler", {"take_mib": take_mib, "quiet": str(quiet)}),
        timeout_seconds=20,
        memory_limit=256 * MIB,
        monotonic=lambda: now[0],
    )
    assert child.memory_ceiling_bytes == 128 * MIB
    try:
        with pytest.raises(SamplerFailure) as failed:
            for _ in range(30):  # 6 MiB a pass crosses 90 % (115 MiB) before 128 MiB
                child.sample()
        assert failed.value.reason == "memory_ceiling"
        assert "reached its memory ceiling of 128 MiB" in str(failed.value)
        assert said in str(failed.value)
        assert child.pid is None  # ended
        quiet.write_text("")
        now[0] = 2.0  # past the 1 s backoff
        assert child.sample() == 0
        assert child.restarts_total == 1
    finally:
        child.close()
