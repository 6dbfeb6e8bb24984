"""Worst-case cost of parsing hostile log text: what one pod can make the agent spend.

Three figures, all CPU time of this process (``time.process_time``):

1. per built-in pattern, a 1 MB line crafted against it (the issue's 60,000-digit ``time``
   grown to 1 MB, runs of separators, many partial matches, a bar of carriage returns),
   parsed by the format's function directly, *without* the 16 KiB window: the cost if the
   window were not there (RE2: linear). Then the same line through ``parse_line`` (the
   window applies: the agent's real cost);
2. end to end, a 64 MiB CRI log of one pod whose annotation is the catastrophic regex
   ``^(?:a+)+(?P<tokens_per_second>\\d+)$``, filled with one kind of line (16 KiB lines of
   digits, just inside the window; 1 MiB lines, over it; lines built against the regex;
   short lines that make the Megatron parser run all its searches; short valid lines),
   read whole by the real tailer and sampler in process: CPU per MB of hostile input;
3. for comparison, Python's ``re`` on the pattern the agent used before issue 19 (nanoGPT's
   ``time ...ms``), at 2,000 / 4,000 / 8,000 digits: quadratic.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_hostile_throughput.py [--mib 64]
"""

from __future__ import annotations

import argparse
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from agent.config import ThroughputSettings
from agent.kubernetes.podwatch import PodIndex, PodMeta
from agent.throughput.formats import (
    Reading,
    compile_custom,
    parse_composer,
    parse_custom,
    parse_deepspeed,
    parse_hf_trainer,
    parse_lightning,
    parse_line,
    parse_megatron,
    parse_nanogpt,
    parse_torchtitan,
)
from agent.throughput.sampler import ThroughputSampler
from agent.throughput.tail import WHOLE_FILE

MB = 1_000_000
CATASTROPHIC = compile_custom(r"^(?:a+)+(?P<tokens_per_second>\d+)$")


def fill(head: str, unit: str, size: int) -> str:
    return head + (unit * ((size - len(head)) // len(unit) + 1))[: size - len(head)]


CASES: list[tuple[str, Callable[[str], Reading | None], str]] = [
    ("nanogpt: digits, no 'ms'", parse_nanogpt, fill("iter 1: loss x, time ", "1", MB)),
    ("modded-nanogpt: step_avg digits", parse_nanogpt, fill("step:1/2 step_avg:", "9", MB)),
    ("llm.c: pipes", parse_nanogpt, fill("step 1/2 |", "| 1 ms |", MB)),
    ("composer: digits and commas", parse_composer, fill("Train throughput/x: ", "1,", MB)),
    ("composer: many matches", parse_composer, fill("", " Train throughput/tokens_per_sec: 1", MB)),
    (
        "megatron: digits, commas, dots",
        parse_megatron,
        fill("elapsed time per iteration (ms): ", "1,1.", MB),
    ),
    ("deepspeed: commas", parse_deepspeed, fill("CurrSamplesPerSec=", "1,", MB)),
    ("torchtitan: mfu without %", parse_torchtitan, fill("tps: 1 mfu: ", "1", MB)),
    ("hf_trainer: dict digits", parse_hf_trainer, fill("{'train_samples_per_second': ", "1", MB)),
    ("hf_trainer: carriage returns", parse_hf_trainer, fill("1it/s", "\r", MB)),
    ("lightning: redraws", parse_lightning, fill("Epoch 0: 1it/s", "\r ", MB)),
    ("custom ^(?:a+)+(?P<..>\\d+)$", lambda s: parse_custom(CATASTROPHIC, s), fill("", "a", MB)),
]

#: the nanoGPT pattern before issue 19, compiled by Python's backtracking engine
OLD_NUM = r"([-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
OLD_NANO = re.compile(r"^iter \d+: loss [^,]*, time " + OLD_NUM + r"ms(?:, mfu " + OLD_NUM + "%)?")


def cpu(fn: Callable[[], object]) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64, help="size of the end-to-end hostile log")
    args = ap.parse_args()

    print("1. one 1 MB hostile line per pattern (CPU ms)")
    print(f"   {'case':34} {'parser, no window':>18} {'parse_line':>11}")
    worst = 0.0
    for name, parser, line in CASES:
        raw = min(cpu(lambda: parser(line)) for _ in range(3))  # noqa: B023
        windowed = min(cpu(lambda: parse_line(line, CATASTROPHIC)) for _ in range(3))  # noqa: B023
        worst = max(worst, raw)
        print(f"   {name:34} {raw * 1e3:15.2f} ms {windowed * 1e3:8.3f} ms")
    print(f"   worst without the window: {worst:.3f} s per MB")

    tmp = Path(tempfile.mkdtemp(prefix="fabricscope-bench-hostile-"))
    uid = "0b8a7c1e-aaaa-4c43-8d6c-6a3a8f2f11aa"
    meta = PodMeta(
        uid,
        "tenant",
        "evil-0",
        annotations=(("fabricscope.io/throughput-regex", CATASTROPHIC.pattern),),
    )
    try:
        for label, line in (
            ("16 KiB lines of digits (inside the window)", "iter 1: loss x, time " + "7" * 16_300),
            ("1 MiB lines of digits (over the window)", "iter 1: loss x, time " + "7" * (1 << 20)),
            ("41-byte lines against the custom regex", "a" * 40 + "!"),
            ("short Megatron lines (6 searches each)", "elapsed time per iteration (ms): 1,1"),
            ("short valid Composer lines", "Train throughput/tokens_per_sec: 1.5"),
        ):
            d = tmp / f"tenant_evil-0_{uid}" / "trainer"
            d.mkdir(parents=True, exist_ok=True)
            path = d / "0.log"
            record = f"2026-11-25T10:00:00.000000000Z stdout F {line}\n".encode()
            with path.open("wb") as f:
                block = record * max(1, (4 << 20) // len(record))
                while f.tell() < args.mib << 20:
                    f.write(block)
            size = path.stat().st_size
            sampler = ThroughputSampler(
                ThroughputSettings(
                    pod_logs=str(tmp), pods="all", max_line_bytes=2 << 20, stream_cpu_seconds=1e9
                ),
                pod_index=lambda: PodIndex([meta]),
                limits=WHOLE_FILE,
                once=True,
            )
            seconds = cpu(sampler.sample)
            sampler.close()
            print(
                f"2. {label}: {size / MB:.0f} MB read and parsed in {seconds:.2f} s CPU = "
                f"{seconds / (size / MB) * 1e3:.0f} ms per MB ({size // len(record)} lines)"
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print("3. before issue 19: Python's re, nanoGPT pattern, digits without 'ms' (CPU s)")
    for n in (2000, 4000, 8000):
        line = "iter 1: loss x, time " + "1" * n
        print(f"   {n} digits: {cpu(lambda: OLD_NANO.match(line)):.2f} s")  # noqa: B023
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
