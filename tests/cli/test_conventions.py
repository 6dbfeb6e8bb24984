"""The command line's conventions, across every subcommand's parser: one syntax per kind of
value (durations as Prometheus writes them, byte sizes with SI or IEC units or plain, every
boolean with its ``--no-`` form), combinations that would do nothing refused with their
reason, and one error format. Parsed in process, through the real parser; the error format
through the real command."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from agent.config import SAMPLER_NAMES, format_bytes, parse_bytes
from agent.core.errors import ConfigError
from agent.core.sysfs import SysfsReader
from agent.nvml.record import ReplayNvml
from agent.samplers import build_specs
from exporter.cli.agent_flags import config_from_args
from exporter.cli.agent_run import _say_nothing_kept
from exporter.cli.main import _check_combinations, build_parser
from tests.agentrun import fabricscope
from tests.nvml.test_nvml_fixtures import h200x2_recording

DGX_SYS = Path(__file__).resolve().parents[1] / "fixtures" / "dgx-h100" / "sys"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("16MiB", 16 << 20),
        ("16Mi", 16 << 20),
        ("16M", 16_000_000),
        ("16MB", 16_000_000),
        ("512KiB", 512 << 10),
        ("1Ki", 1024),
        ("2k", 2000),
        ("1GiB", 1 << 30),
        ("4096", 4096),
        ("4096B", 4096),
        (" 8 Mi ", 8 << 20),
    ],
)
def test_byte_sizes(text: str, value: int) -> None:
    assert parse_bytes(text) == value
    assert parse_bytes(format_bytes(value)) == value  # what help shows parses back


@pytest.mark.parametrize(
    "text", ["", "-1", "1.5M", "16 MiBs", "Mi", "16m", "16iB", "0x10", "9" * 30, "1e6", "16MiBB"]
)
def test_bad_byte_sizes(text: str) -> None:
    with pytest.raises(ValueError, match="not a byte size"):
        parse_bytes(text)


def _parse(*argv: str) -> argparse.Namespace:
    ns = build_parser().parse_args(list(argv))
    _check_combinations(ns, list(argv))
    return ns


def _every_parser() -> list[argparse.ArgumentParser]:
    out: list[argparse.ArgumentParser] = []
    todo = [build_parser()]
    while todo:
        p = todo.pop()
        out.append(p)
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                todo.extend(a.choices.values())
    return out


def test_every_boolean_flag_has_its_no_form() -> None:
    """No store_true/store_false anywhere: each switch is --x / --no-x."""
    for p in _every_parser():
        for a in p._actions:
            if isinstance(a, argparse._StoreTrueAction | argparse._StoreFalseAction):
                pytest.fail(f"{p.prog} {a.option_strings}: no --no- form")
    assert _parse("agent", "--no-once").once is False
    assert _parse("probe", "--no-matrix").matrix is False


def test_byte_and_duration_flags_take_their_units() -> None:
    ns = _parse("agent", "--ras.max-answer-bytes=16MiB", "--ras.gather-timeout=5s")
    assert ns.ras_max_answer_bytes == 16 << 20 and ns.ras_gather_timeout == 5
    assert _parse("agent", "--ras.max-answer-bytes=16Mi").ras_max_answer_bytes == 16 << 20
    assert _parse("agent", "--ras.gather-timeout=1m").ras_gather_timeout == 60
    ns = _parse(
        "explain", "--prometheus.url=http://x", "--job=j", "--prometheus.max-body-bytes=64M"
    )
    assert ns.prom_max_body == 64_000_000
    # the container's limit as a user writes it, and as the kubelet expands it (plain bytes)
    assert _parse("agent", "--agent.memory-limit=512Mi").memory_limit == 512 << 20
    assert _parse("agent", "--agent.memory-limit=536870912").memory_limit == 512 << 20
    assert _parse("agent", "--agent.memory-limit=0").memory_limit == 0
    # message sizes in the same syntax as every other byte size, not a dialect of their own
    ns = _parse("probe", "--probe.sizes=64KiB,16Mi,16M,4096")
    assert ns.probe_sizes == (64 << 10, 16 << 20, 16_000_000, 4096)
    for bad in ("6", "0", "16m"):
        with pytest.raises(SystemExit):
            _parse("probe", f"--probe.sizes={bad}")


def test_the_nvml_sampler_runs_at_twice_the_sampling_interval_unless_told() -> None:
    """An NVML pass is most of the agent's CPU at 8 GPUs and the chart scrapes every 30 s:
    by default NVML runs every other sampling interval, its timeout bounded by its own."""
    specs = {
        s.sampler.name: s
        for s in build_specs(
            config_from_args(_parse("agent", "--sampler.nvml", "--sampler.pci")),
            SysfsReader(DGX_SYS),
            nvml_api=lambda: ReplayNvml(h200x2_recording()),
            watch_xid=False,
            run_probes=False,
        )
    }
    assert (specs["nvml"].interval_seconds, specs["nvml"].timeout_seconds) == (30.0, 10.0)
    assert (specs["pci"].interval_seconds, specs["pci"].timeout_seconds) == (15.0, 10.0)
    config = config_from_args(_parse("agent", "--sampling.interval=1"))
    assert config.nvml.interval_seconds == 2.0
    config = config_from_args(_parse("agent", "--nvml.interval=5s", "--sampling.timeout=8s"))
    assert config.nvml.interval_seconds == 5.0
    specs = {
        s.sampler.name: s
        for s in build_specs(
            config,
            SysfsReader(DGX_SYS),
            nvml_api=lambda: ReplayNvml(h200x2_recording()),
            watch_xid=False,
            run_probes=False,
        )
    }
    assert (specs["nvml"].interval_seconds, specs["nvml"].timeout_seconds) == (5.0, 5.0)


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (
            ("agent", "--once", "--sampling.interval=1m30s"),
            "--sampling.interval has no effect with --once: one pass is taken",
        ),
        (
            ("agent", "--once", "--ibpeer.interval=5m"),
            "--ibpeer.interval has no effect with --once",
        ),
        (
            ("snapshot", "--ibpeer.interval=5m", "-o", "x.tar.gz"),
            "--ibpeer.interval has no effect on snapshot: a snapshot takes one pass",
        ),
        (
            ("snapshot", "--sampling.interval=1m", "-o", "x.tar.gz"),
            "--sampling.interval has no effect on snapshot",
        ),
        (
            ("agent", "--once", "--nvml.interval=1m"),
            "--nvml.interval has no effect with --once",
        ),
        (
            ("snapshot", "--nvml.interval=1m", "-o", "x.tar.gz"),
            "--nvml.interval has no effect on snapshot",
        ),
        (
            ("agent", "--once", "--snapshot=x.tar.gz", "--infiniband.state-file=/x"),
            "--infiniband.state-file has no effect with --snapshot",
        ),
    ],
)
def test_a_combination_that_would_do_nothing_is_refused_with_its_reason(
    argv: tuple[str, ...], reason: str
) -> None:
    with pytest.raises(ConfigError, match="^" + reason.replace(".", r"\.")):
        _parse(*argv)


def test_one_error_format_from_argparse_and_from_the_settings_alike() -> None:
    """A value argparse refuses and a combination the settings refuse read the same:
    ``fabricscope CMD: error: WHY (see fabricscope CMD --help)``, one line, status 2."""
    bad_value = fabricscope(["agent", "--ras.gather-timeout=1500ms"])
    bad_combo = fabricscope(["agent", "--once", "--sampling.interval=1m30s"])
    for proc, why in (
        (bad_value, "must be a whole number of seconds: '1500ms'"),
        (bad_combo, "--sampling.interval has no effect with --once"),
    ):
        assert proc.returncode == 2, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith("fabricscope agent: error: ") and why in line, line
        assert line.endswith("(see fabricscope agent --help)"), line


def test_a_start_without_a_state_file_says_so_in_one_line(tmp_path: Path) -> None:
    """Without ``--infiniband.state-file`` (the chart's ``nonRoot: true``) the real agent
    says at start, once, that a restart can show as a counter reset."""
    others = (f"--no-sampler.{n}" for n in SAMPLER_NAMES if n != "infiniband")
    argv = ["agent", "--once", f"--path.sysfs={tmp_path}", *others, "--infiniband.state-file="]
    proc = fabricscope([*argv, "--infiniband.reset-saturated"])
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "no --infiniband.state-file" in line]
    assert len(lines) == 1 and "counter reset" in lines[0], proc.stderr
    assert "reset-saturated cleared" in lines[0], lines[0]


@pytest.mark.parametrize(
    "argv",
    [
        ("agent", "--infiniband.state-file=/var/lib/x/state.json"),  # kept
        ("agent", "--infiniband.state-file=", "--infiniband.perfquery=off"),  # no PMA reads
        ("agent", "--infiniband.state-file=", "--no-sampler.infiniband"),
    ],
)
def test_no_such_line_where_nothing_is_lost(
    argv: tuple[str, ...], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        _say_nothing_kept(config_from_args(_parse(*argv)))
    assert not caplog.records
