"""The main process's malloc arenas are capped: eight threads allocating at once leave at
most one arena besides the main heap (glibc would give each its own)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = """
import sys, threading
from agent.core.allocator import limit_arenas
applied = limit_arenas() if sys.argv[1] == "cap" else False
def work(start):
    start.wait()
    for _ in range(2000):
        blocks = [bytearray(4096) for _ in range(20)]
        del blocks
start = threading.Barrier(8)
threads = [threading.Thread(target=work, args=(start,)) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
arenas = 0  # an arena's heap: an anonymous reservation of 64 MiB, mostly PROT_NONE
for line in open("/proc/self/maps"):
    f = line.split()
    lo, hi = (int(x, 16) for x in f[0].split("-"))
    arenas += f[1] == "---p" and len(f) < 6 and hi - lo > 1 << 20
print(applied, arenas)
"""


def arenas(mode: str) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=env,
    )
    applied, count = done.stdout.split()
    return applied, int(count)


def test_eight_allocating_threads_share_two_arenas() -> None:
    applied, capped = arenas("cap")
    assert applied == "True"
    assert capped <= 1
    # what the cap prevents: glibc gives each new thread an arena of its own up to its limit
    _, uncapped = arenas("none")
    assert uncapped > 2


TRIM = """
from agent.core.allocator import trim
blocks = [bytearray(2000) for _ in range(20000)]  # malloc's heap, not Python's arenas
del blocks
print(trim())
"""


def test_trim_hands_freed_heap_back() -> None:
    """After 40 MB of blocks are freed, ``malloc_trim`` releases memory (glibc)."""
    done = subprocess.run(
        [sys.executable, "-c", TRIM], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


HOLD = """
import sys

import pytest
from agent.core.allocator import hold_heap
applied = hold_heap() if sys.argv[1] == "hold" else False
def anon():
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("Anonymous:"):
            return int(line.split()[1])
# 40 MB of blocks from malloc's heap (not Python's arenas), freed at once: the free space
# ends at the top of the heap
blocks = [bytearray(2000) for _ in range(20000)]
full = anon()
del blocks
print(applied, full - anon())
"""


def kept_after_free(mode: str) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run(
        [sys.executable, "-c", HOLD, mode],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    )
    applied, released = done.stdout.split()
    return applied, int(released)


def test_the_main_process_keeps_its_freed_heap() -> None:
    """glibc gives the freed top of the heap back by itself (and the next allocations fault
    it in again); held, the pages stay: the RSS does not saw up and down."""
    applied, released = kept_after_free("hold")
    assert applied == "True"
    assert released < 1024  # KiB: nothing of the 40 MB given back
    _, default = kept_after_free("default")
    assert default > 20 * 1024  # what glibc does on its own: most of it trimmed


def test_hold_heap_leaves_an_explicit_setting_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.core.allocator import hold_heap

    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert hold_heap() is False
