"""Each child's memory ceiling (agent/core/ceiling.py): its share of the pod's limit, its
floor, its ceiling when no limit is known, the RAS child's answer cap that follows from its
share, the kernel refusing an allocation past it in a real process, and a supervised child
that reaches it ended, counted and replaced."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent.core.ceiling import (
    MAIN,
    MIB,
    PARTITIONED,
    SHARES,
    child_ceiling,
    minimum_limit,
    plan,
)
from agent.core.errors import SamplerFailure
from agent.core.isolation import ChildSpec, IsolatedSampler
from agent.ras.sampler import CEILING_PER_ANSWER_BYTE, MIN_ANSWER_CAP, answer_cap
from tests.agentrun import throughput_once

ROOT = Path(__file__).resolve().parents[2]


#: the chart's limits: the agent's, and the probe's (which runs the probe's GPU view too)
VALUES = yaml.safe_load((ROOT / "deploy" / "helm" / "fabricscope" / "values.yaml").read_text())
UNITS = {"Mi": MIB, "Gi": 1024 * MIB}


def quantity(q: str) -> int:
    return int(q[:-2]) * UNITS[q[-2:]]


CHART_LIMIT = quantity(VALUES["resources"]["limits"]["memory"])
PROBE_LIMIT = quantity(VALUES["probe"]["resources"]["limits"]["memory"])
#: processes under one child's ceiling at once: the ibpeer child and the tool it runs, which
#: inherits its RLIMIT_DATA (agent/core/tools.py runs one at a time)
TOGETHER = {"nvml": 1, "throughput": 1, "ibpeer": 2, "ras": 1, "probe-gpus": 1}
RESULTS = ROOT / "bench" / "results"


def measured_main_peak() -> int:
    """The main process's peak resident memory over every sizing run recorded (the 1,000-pod
    node's pod watch, the H200 nodes), in bytes."""
    peaks = [
        p["rss_mib"]
        for f in RESULTS.glob("sizing-*.json")
        for p in json.loads(f.read_text()).get("processes", [])
        if p["role"] == "main" and "rss_mib" in p
    ]
    assert len(peaks) >= 3, peaks
    return int(max(peaks) * MIB)


def documented_limits() -> list[int]:
    """Every agent memory limit docs/install.md names in its ceiling table's heading row
    (``under N MiB``), and the smallest it says holds every floor."""
    doc = (ROOT / "docs" / "install.md").read_text()
    section = doc[doc.index("### Each child's memory ceiling") :]
    section = section[: section.index("\n### ")]
    found = {int(m) * MIB for m in re.findall(r"under (?:the chart.s )?(\d+) MiB", section)}
    assert found, "the ceiling section names no limit"
    return sorted(found)


@pytest.mark.parametrize(
    ("limit", "running"),
    [
        (CHART_LIMIT, ("nvml", "throughput", "ibpeer", "ras")),
        (PROBE_LIMIT, ("nvml", "throughput", "ibpeer", "ras", "probe-gpus")),
        *((lim, ("nvml", "throughput", "ibpeer", "ras")) for lim in documented_limits()),
    ],
)
def test_the_ceilings_of_children_that_run_together_fit_the_limit_beside_the_main_process(
    limit: int, running: tuple[str, ...]
) -> None:
    """Each child that runs at the same time at its ceiling (the ibpeer child's tool too),
    and the main process at its measured peak with the room the partition keeps for it, add
    up to at most the pod's limit: one child at its ceiling cannot take the container to its
    limit (the first attack of round three: the RAS child at 445-466 MiB, the pod OOM-killed)."""
    held = sum(child_ceiling(n, limit) * TOGETHER[n] for n in running)
    assert held + max(measured_main_peak(), MAIN.floor) <= limit, (held >> 20, limit >> 20)
    division = plan(limit, running)
    assert division.over == 0
    assert division.main >= MAIN.floor


def test_a_limit_too_small_for_the_floors_is_said_not_overcommitted_silently() -> None:
    """Below the smallest limit that holds every floor the floors are kept (a ceiling under a
    child's need would only restart it) and the plan says by how much it is short."""
    small = minimum_limit() - 64 * MIB
    division = plan(small, PARTITIONED)
    assert division.over == 64 * MIB
    assert division.ceilings == {n: SHARES[n].floor + SHARES[n].admits for n in PARTITIONED}
    line = division.summary()
    assert "\n" not in line
    assert "is 64 MiB short" in line and f"at least {minimum_limit() >> 20} MiB" in line
    assert plan(minimum_limit(), PARTITIONED).over == 0


def test_every_limit_is_divided_exactly_and_never_above_a_childs_most() -> None:
    for mib in range(minimum_limit() >> 20, 16384, 37):
        division = plan(mib * MIB, PARTITIONED)
        held = sum(c * SHARES[n].processes for n, c in division.ceilings.items())
        assert held + division.main <= mib * MIB + len(PARTITIONED)  # whole bytes
        assert division.main >= MAIN.floor
        for n, c in division.ceilings.items():
            assert SHARES[n].floor + SHARES[n].admits <= c <= SHARES[n].most, (n, mib)
    assert (
        abs(MAIN.weight + sum(SHARES[n].weight * SHARES[n].processes for n in PARTITIONED) - 1)
        < 1e-9
    )


def test_no_floor_is_below_what_its_child_was_measured_to_need() -> None:
    """The floors come from measurements (bench/results): each child's worst case counted
    (VmData, what the kernel holds against the ceiling) under the bench's worst inputs, the
    NVML and throughput children on an H200 node, and the main process's peak. The RAS
    child's need grows with its answer cap: its worst is held against its floor and what
    the cap of that run adds."""
    bench = json.loads((RESULTS / "ceilings.json").read_text())
    worst: dict[str, float] = {}
    for row in bench["children"]:
        if row["ended_at_ceiling"] == 0:  # the leaking library is meant to be ended
            worst[row["child"]] = max(worst.get(row["child"], 0), row["peak_counted_mib"])
    for p in json.loads((RESULTS / "sizing-h200-limit.json").read_text())["processes"]:
        child = p["role"].removesuffix(" child")
        if child != "main":
            worst[child] = max(worst.get(child, 0), p["vmdata_mib"])
    assert set(worst) == set(PARTITIONED), worst
    ras_cap = bench["ras_answer_cap_bytes"]
    for child, mib in worst.items():
        need = SHARES[child].floor + (CEILING_PER_ANSWER_BYTE * ras_cap if child == "ras" else 0)
        assert mib * MIB < need, (child, mib)
    assert measured_main_peak() < MAIN.floor


@pytest.mark.parametrize(
    ("child", "limit", "ceiling"),
    [
        ("nvml", CHART_LIMIT, int(134.8 * MIB)),
        ("nvml", minimum_limit() - MIB, 112 * MIB),  # too small: its floor, said at start
        ("nvml", None, 1024 * MIB),  # no limit known: generous
        ("throughput", 8192 * MIB, 256 * MIB),  # never above its most
        ("ibpeer", None, 256 * MIB),
        ("probe-gpus", PROBE_LIMIT, 112 * MIB),  # outside the partition: its floor
        ("a-new-child", CHART_LIMIT, 128 * MIB),
    ],
)
def test_a_childs_ceiling_is_its_floor_and_share_never_above_its_most(
    child: str, limit: int | None, ceiling: int
) -> None:
    assert abs(child_ceiling(child, limit) - ceiling) < MIB // 10


def test_the_ras_answer_cap_fits_its_share_of_the_limit() -> None:
    """The chart's limit: answers up to what the RAS child's ceiling decodes, not 16 MiB;
    the ceiling raised for that cap is still its part of the limit. Without a limit, the
    flag's cap."""
    cap = answer_cap(16 * MIB, CHART_LIMIT)
    ceiling = child_ceiling("ras", CHART_LIMIT)
    assert 3 * MIB < cap < 4 * MIB
    assert cap == (ceiling - SHARES["ras"].floor) // CEILING_PER_ANSWER_BYTE
    assert child_ceiling("ras", CHART_LIMIT, extra=CEILING_PER_ANSWER_BYTE * cap) == ceiling
    assert answer_cap(16 * MIB, None) == 16 * MIB
    assert answer_cap(16 * MIB, 64 * MIB) == MIN_ANSWER_CAP  # never below a MiB
    assert SHARES["ras"].admits == CEILING_PER_ANSWER_BYTE * MIN_ANSWER_CAP
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


@pytest.mark.parametrize(("limit", "short_mib"), [(64 * MIB, 80), (512 * MIB, 0)])
def test_a_limit_too_small_is_said_in_one_line_at_start_and_exported(
    tmp_path: Path, limit: int, short_mib: int
) -> None:
    """The real agent (``--once``, the throughput child alone: 48 MiB and the main process's
    96 MiB): a limit that cannot hold them is one warning line at start and the shortfall in
    ``fabricscope_agent_memory_overcommit_bytes``; one that holds them, 0 and no warning."""
    log = tmp_path / "train.log"
    log.write_text("")
    done = throughput_once(
        [str(log)], tmp_path, f"--agent.memory-limit={limit}", "--log.level=warning"
    )
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "--agent.memory-limit of" in line]
    if short_mib:
        assert len(said) == 1, done.stderr
        assert f"is {short_mib} MiB short" in said[0] and "at least 144 MiB" in said[0]
    else:
        assert said == [], done.stderr
    got = re.search(r"^fabricscope_agent_memory_overcommit_bytes (\S+)$", done.stdout, re.M)
    assert got is not None, done.stdout[-2000:]
    assert float(got.group(1)) == short_mib * MIB
