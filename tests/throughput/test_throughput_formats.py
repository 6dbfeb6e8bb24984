"""Table tests for the throughput parsers (agent/throughput/formats.py) on real log lines
(tests/fixtures/throughput-logs, PROVENANCE.md there says where each comes from)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.throughput.formats import (
    BadRegex,
    Reading,
    compile_custom,
    parse_custom,
    parse_line,
)

LOGS = Path(__file__).parents[1] / "fixtures" / "throughput-logs"


def latest(rel: str) -> dict[tuple[str, str], float]:
    """(format, field) -> latest value after parsing every line of a fixture log."""
    out: dict[tuple[str, str], float] = {}
    for line in (LOGS / rel).read_text(encoding="utf-8", errors="replace").splitlines():
        r = parse_line(line)
        if r is not None:
            for name, v in r.values():
                out[(r.format, name)] = v
    return out


def lines_read(rel: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in (LOGS / rel).read_text(encoding="utf-8", errors="replace").splitlines():
        r = parse_line(line)
        if r is not None:
            out[r.format] = out.get(r.format, 0) + 1
    return out


# one real line per format and shape -> exactly what it states
LINES = [
    (
        "\t Train throughput/tokens_per_sec: 222.2194",
        Reading("composer", tokens_per_second=222.2194),
    ),
    (
        "         Train throughput/samples_per_sec: 2.7330",
        Reading("composer", samples_per_second=2.733),
    ),
    (
        "         Train throughput/batches_per_sec: 0.0027",
        Reading("composer", iterations_per_second=0.0027),
    ),
    ("         Train throughput/device/tokens_per_sec: 1255.1776", None),
    ("         Train time/token: 29254495", None),
    (
        " [2024-04-06 02:55:45] iteration        2/     100 | consumed samples:          256 | "
        "elapsed time per iteration (ms): 5630.1 | throughput per GPU (TFLOP/s/GPU): 231.9 | "
        "learning rate: 4.000000E-07 | global batch size:   128 | lm loss: 2.021530E+00 | "
        "load_balancing_loss: 1.087362E+00 | loss scale: 1.0 | grad norm: 6.895 | num zeros: "
        "0.0 | number of skipped iterations:   0 | number of nan iterations:   0 |",
        Reading(
            "megatron",
            samples_per_second=pytest.approx(128 / 5.6301),
            iterations_per_second=pytest.approx(1 / 5.6301),
            step_seconds=pytest.approx(5.6301),
            flops_per_gpu=pytest.approx(231.9e12),
        ),
    ),
    (
        "vm-07-14:  iteration        2/       5 | consumed samples:         4096 | consumed "
        "tokens:      8388608 | elapsed time per iteration (ms): 75254.0 | learning rate: "
        "2.400E-07 | global batch size:  2048 | lm loss: 1.100421E+01 | loss scale: 2048.0 | "
        "actual seqlen:  2048 | number of skipped iterations:   0 | number of nan iterations:"
        "   0 | samples per second: 27.215 | TFLOPs: 149.10 |",
        Reading(
            "megatron",
            tokens_per_second=pytest.approx(2048 * 2048 / 75.254),
            samples_per_second=27.215,
            iterations_per_second=pytest.approx(1 / 75.254),
            step_seconds=pytest.approx(75.254),
            flops_per_gpu=pytest.approx(149.10e12),
        ),
    ),
    (
        "vm-07-05: [2023-11-29 08:56:16,103] [INFO] [timer.py:260:stop] epoch=0/micro_step=4/"
        "global_step=4, RunningAvgSamplesPerSec=303.1183419363961, CurrSamplesPerSec="
        "315.5642580603495, MemAllocated=17.54GB, MaxMemAllocated=66.97GB",
        Reading("deepspeed", samples_per_second=315.5642580603495),
    ),
    (
        "[rank0]:[titan] 2025-07-21 15:57:43,242 - root - INFO - step:  4  loss:  4.6671  "
        "grad_norm:  2.5457  memory:  0.00GiB(0.00%)  tps: 35,051  tflops: 3.59  mfu: 0.36%",
        Reading(
            "torchtitan",
            tokens_per_second=35051.0,
            flops_per_gpu=pytest.approx(3.59e12),
            mfu_ratio=pytest.approx(0.0036),
        ),
    ),
    (
        "{'train_runtime': 273.0148, 'train_samples_per_second': 3.663, "
        "'train_steps_per_second': 0.007, 'epoch': 1.0}",
        Reading("hf_trainer", samples_per_second=3.663, iterations_per_second=0.007),
    ),
    (
        "  0%|          | 0/4 [00:00<?, ?it/s] 25%|██▌       | 1/4 [03:45<11:15, 225.28s/it] "
        "50%|█████     | 2/4 [07:15<07:21, 220.73s/it]",
        Reading(
            "hf_trainer",
            iterations_per_second=pytest.approx(1 / 220.73),
            step_seconds=220.73,
        ),
    ),
    (
        "Epoch 0: 100%|██████████| 311/311 [00:13<00:00, 23.54it/s, v_num=422]",
        Reading(
            "lightning",
            iterations_per_second=23.54,
            step_seconds=pytest.approx(1 / 23.54),
        ),
    ),
    ("Testing DataLoader 0: 100%|██████████| 133/133 [00:07<00:00, 17.44it/s]", None),
    (
        "iter 2000: loss 1.1275, time 88782.56ms, mfu 0.43%",
        Reading(
            "nanogpt",
            iterations_per_second=pytest.approx(1 / 88.78256),
            step_seconds=pytest.approx(88.78256),
            mfu_ratio=pytest.approx(0.0043),
        ),
    ),
    ("step 2000: train loss 1.0549, val loss 1.4811", None),
    (
        "step:2/1490 train_time:108ms step_avg:53.87ms",
        Reading(
            "nanogpt",
            iterations_per_second=pytest.approx(1000 / 53.87),
            step_seconds=pytest.approx(0.05387),
        ),
    ),
    ("step:1/1393 train_time:17608ms step_avg:nanms", None),
    (
        "step    2/32000 | loss 10.539388 (+nanz)| norm 43.5996 (+nanz)| lr 1.71e-06 | "
        "2747.19 ms | 47.4% bf16 MFU | 381690 tok/s",
        Reading(
            "nanogpt",
            tokens_per_second=381690.0,
            iterations_per_second=pytest.approx(1 / 2.74719),
            step_seconds=pytest.approx(2.74719),
            mfu_ratio=pytest.approx(0.474),
        ),
    ),
    ("val loss 11.129390", None),
    ("", None),
    ("\ufffd\ufffd garbage \x00 with tps: nan", None),
]


@pytest.mark.parametrize(("line", "expected"), LINES)
def test_real_lines(line: str, expected: Reading | None) -> None:
    assert parse_line(line) == expected


@pytest.mark.parametrize(
    ("rel", "expected"),
    [
        (
            "composer/rocm-mpt30b-2node.log",
            {
                ("composer", "tokens_per_second"): 20082.8418,
                ("composer", "samples_per_second"): 2.733,
                ("composer", "iterations_per_second"): 0.0027,
            },
        ),
        (
            "composer/moe-wandb-batch20.log",
            {
                ("composer", "tokens_per_second"): 222.2194,
                ("composer", "samples_per_second"): 0.217,
                ("composer", "iterations_per_second"): 0.1085,
            },
        ),
        (
            "hf_trainer/hf_ds_gpt2_base_n4-1832555.out",
            {
                ("hf_trainer", "samples_per_second"): 1.088,
                ("hf_trainer", "iterations_per_second"): pytest.approx(1 / 57.45),
                ("hf_trainer", "step_seconds"): 57.45,
            },
        ),
        (
            "megatron/meg_gpt2_perf_n16.out",
            {
                ("megatron", "samples_per_second"): pytest.approx(1024 / 128.8915),
                ("megatron", "iterations_per_second"): pytest.approx(1 / 128.8915),
                ("megatron", "step_seconds"): pytest.approx(128.8915),
            },
        ),
        (
            "megatron/meg_ds_zero_gpt2_perf_n16_nbs48_ms48.out",
            {
                ("megatron", "iterations_per_second"): pytest.approx(1 / 123.9078),
                ("megatron", "step_seconds"): pytest.approx(123.9078),
            },
        ),
        (
            "deepspeed/superbench-megatron-deepspeed-2node.log",
            {
                ("deepspeed", "samples_per_second"): 329.45074244342015,
                ("megatron", "samples_per_second"): 27.492,
                ("megatron", "flops_per_gpu"): pytest.approx(150.62e12),
                ("megatron", "step_seconds"): pytest.approx(74.4949),
                ("megatron", "iterations_per_second"): pytest.approx(1 / 74.4949),
                ("megatron", "tokens_per_second"): pytest.approx(2048 * 2048 / 74.4949),
            },
        ),
        (
            "torchtitan/pytorch-torchtitan-pr2389.tps-lines.txt",
            {
                ("torchtitan", "tokens_per_second"): 10007.0,
                ("torchtitan", "flops_per_gpu"): pytest.approx(313.36e12),
                ("torchtitan", "mfu_ratio"): pytest.approx(0.1393),
            },
        ),
        (
            "nanogpt/2025-01-16_Sub3Min.1d3bd93b.log-after-code.txt",
            {
                ("nanogpt", "step_seconds"): pytest.approx(0.12981),
                ("nanogpt", "iterations_per_second"): pytest.approx(1 / 0.12981),
            },
        ),
        (
            "nanogpt/llmc-rtx5090-unknown-mfu.log",
            {
                ("nanogpt", "tokens_per_second"): 195645.0,
                ("nanogpt", "step_seconds"): pytest.approx(2.67979),
                ("nanogpt", "iterations_per_second"): pytest.approx(1 / 2.67979),
            },
        ),
        (
            "lightning/tqdm-slow-epoch.log",
            {
                ("lightning", "iterations_per_second"): 0.01,
                ("lightning", "step_seconds"): 100.0,
            },
        ),
        (
            "lightning/tqdm-fit-stopped.log",
            {
                ("lightning", "iterations_per_second"): 162.25,
                ("lightning", "step_seconds"): pytest.approx(1 / 162.25),
            },
        ),
    ],
)
def test_real_logs_latest_values(rel: str, expected: dict[tuple[str, str], float]) -> None:
    assert latest(rel) == expected


def test_lines_counted_per_format_on_real_logs() -> None:
    assert lines_read("megatron/nvidia-megatron-lm-issue756.mixtral-16xh100.lines.txt") == {
        "megatron": 2
    }
    assert lines_read("deepspeed/superbench-megatron-deepspeed-2node.log") == {
        "megatron": 5,
        "deepspeed": 3,
    }
    assert lines_read("torchtitan/pytorch-torchtitan-pr1437.tps-lines.txt") == {"torchtitan": 8}
    assert lines_read("nanogpt/karpathy-nanogpt-iter-lines.log") == {"nanogpt": 19}
    assert lines_read("nanogpt/2025-01-16_Sub3Min.1d3bd93b.log-after-code.txt") == {
        "nanogpt": 1393  # of 1395 step lines: two print step_avg:nanms
    }
    assert lines_read("lightning/tqdm-epoch-lines.log") == {"lightning": 2}


@pytest.mark.parametrize(
    ("pattern", "line", "expected"),
    [
        (
            r"tok/s=(?P<tokens_per_second>[\d.]+)",
            "step 10 tok/s=1234.5 loss=2.1",
            Reading("custom", tokens_per_second=1234.5),
        ),
        (
            r"step (?P<step_seconds>[\d.]+)s, (?P<mfu_ratio>[\d.]+) mfu",
            "rank0: step 1.25s, 0.41 mfu",
            Reading("custom", step_seconds=1.25, mfu_ratio=0.41),
        ),
        (r"tok/s=(?P<tokens_per_second>[\d.]+)", "no figure here", None),
    ],
)
def test_custom_regex(pattern: str, line: str, expected: Reading | None) -> None:
    rx = compile_custom(pattern)
    assert parse_custom(rx, line) == expected
    assert parse_line(line, rx) == expected  # custom first, then nothing built in matches


def test_custom_regex_wins_over_builtin_on_its_lines() -> None:
    rx = compile_custom(r"tps: (?P<samples_per_second>[\d,]+)")
    line = "step:  4  loss:  4.6671  tps: 35,051  tflops: 3.59  mfu: 0.36%"
    assert parse_line(line, rx) == Reading("custom", samples_per_second=35051.0)


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        (r"tok/s=(?P<tokens_per_second>[\d.]+", "does not compile"),
        (r"tok/s=([\d.]+)", "names no group"),
        (r"tok/s=(?P<tokens>[\d.]+)", "unknown named group(s) tokens"),
        ("x" * 2000, "longer than 1024"),
        # what only a backtracking engine runs is refused at compile time, never run
        (r"(\d+) (?P<tokens_per_second>\1)", "linear-time (RE2) regex: invalid escape"),
        (r"(?=x)(?P<tokens_per_second>\d+)", "linear-time (RE2) regex: invalid perl operator"),
        (r"(?<=tps: )(?P<tokens_per_second>\d+)", "linear-time (RE2) regex"),
        (r"(?P<tokens_per_second>\d++)", "linear-time (RE2) regex: bad repetition operator"),
        (r"(?:(?:(?:a{100}){10}){10})(?P<tokens_per_second>\d+)", "linear-time (RE2) regex"),
        (r"(?P<tokens_per_second>\d{1,999}) (?P<step_seconds>\d{1,999})", "at most 2000"),
    ],
)
def test_bad_custom_regex_is_a_clear_error(pattern: str, message: str) -> None:
    with pytest.raises(BadRegex, match=message.replace("(", r"\(").replace(")", r"\)")):
        compile_custom(pattern)
