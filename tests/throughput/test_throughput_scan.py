"""The line filter (agent/throughput/scan.py) skips only what could change nothing: every
recorded line a parser reads is looked at, and a splitter with the filter hands its sink
every line that parses, in order, with the same counts as one without, whatever the mix of
CRI pieces, malformed lines, invalid UTF-8, over-long lines and chunk boundaries."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from agent.throughput.formats import BUILTIN, MAX_PARSE_CHARS, parse_line, parse_window
from agent.throughput.lines import LineSplitter
from agent.throughput.nccl import parse_nccl_line
from agent.throughput.scan import MARKERS, next_line

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
STAMP = "2026-11-29T08:00:00.123456789Z"


def recorded_lines() -> list[str]:
    out: list[str] = []
    for d in ("throughput-logs", "nccl-logs"):
        for f in sorted((FIXTURES / d).rglob("*")):
            if f.is_file() and f.suffix != ".md":
                out += f.read_bytes().decode("utf-8", "replace").split("\n")
    return out


def matters(text: str) -> bool:
    """What a throughput stream acts on (:meth:`agent.throughput.stream.Stream.on_line`)."""
    return (
        parse_nccl_line(text) is not None
        or parse_line(text) is not None
        or (len(text) > MAX_PARSE_CHARS and parse_window(text) is None)
    )


def test_every_parser_has_its_markers() -> None:
    assert set(MARKERS) == {name for name, _ in BUILTIN} | {"nccl"}


@pytest.mark.parametrize("cri", [False, True])
def test_every_recorded_line_a_parser_reads_is_looked_at(cri: bool) -> None:
    lines = recorded_lines()
    read = [t for t in lines if matters(t)]
    assert len(read) > 500  # the fixtures hold every format's and NCCL's lines
    for text in read:
        raw = (f"{STAMP} stdout F {text}\n" if cri else text + "\n").encode()
        assert next_line(raw, 0, len(raw), cri=cri, long=MAX_PARSE_CHARS) == 0, text


def test_most_lines_of_a_busy_log_are_skipped() -> None:
    filler = [
        f"{STAMP} stdout F step {i} loss 2.{i:02d} lr 3e-4 grad_norm 0.1 [==>]" for i in range(99)
    ]
    data = (
        "\n".join([*filler, f"{STAMP} stdout F \t Train throughput/tokens_per_sec: 5.0"]) + "\n"
    ).encode()
    got: list[str] = []
    split = LineSplitter(
        lambda t, _: got.append(t),
        Counter(),
        cri=True,
        max_line_bytes=1 << 20,
        filtered=lambda: True,
    )
    split.feed(data)
    assert got == ["\t Train throughput/tokens_per_sec: 5.0"]


S = STAMP.encode()
#: CRI lines (and what is not one) of every kind the splitter treats apart
FIXED = (
    # a marker cut across P pieces: only the joined message states it
    S + b" stdout P \t Train through\n" + S + b" stdout F put/tokens_per_sec: 7",
    S
    + b" stdout P NC\n"
    + S
    + b" stdout P \n"
    + S
    + b" stdout F CL INFO NET/IB : No device found.",
    S + b" stdout P \n" + S + b" stdout F plain",
    "caf\u00e9 Train throughput/tokens_per_sec: 3".encode(),  # no CRI prefix
    S + " stdout F caf\u00e9 ok".encode(),
    S + b" stdout F bad \xff\xfe utf8 tps: 5",
    S + b" stdout F bad \xff utf8",
    b"",
    b"onefield",
    b"two fields",
    S + b" stdout X message",
    S + b" stdout Fx message",
    S + b" stdout F\r",
    S + b" stdout F",
    S + b"  F empty stream field",
    S + b" stdout  F",
    S + b" stdout F 10%|#  | 1/10 [00:01<00:09, 1.00it/s]\r 20%|## | 2/10 [00:02<00:08, 2.0it/s]",
)


def _hostile_lines(rng: random.Random, recorded: list[str], long: int) -> list[bytes]:
    marked = [t for t in recorded if matters(t)]
    out = []
    for _ in range(600):
        kind = rng.randrange(len(FIXED) + 6)
        if kind < len(FIXED):
            out.append(FIXED[kind])
            continue
        text = [
            f"step {rng.randrange(9999)} loss 2.3 lr 3e-4",
            rng.choice(recorded),
            rng.choice(marked),
            "x" * rng.randrange(long - 40, long + 40),
            "y" * (long * 3) + " tps: 9",
            "",
        ][kind - len(FIXED)]
        if text:
            out.append(S + b" stdout F " + text.encode())
        else:  # a message in two P pieces around the bound
            half = b"z" * (long // 2)
            out.append(S + b" stdout P " + half + b"\n" + S + b" stdout F " + half)
    return out


@pytest.mark.parametrize(("cri", "max_line"), [(True, 1 << 20), (True, 300), (False, 300)])
def test_a_filtered_splitter_hands_on_what_an_unfiltered_one_does(cri: bool, max_line: int) -> None:
    rng = random.Random(46)
    recorded = recorded_lines()
    for _ in range(3):
        lines = _hostile_lines(rng, recorded, min(max_line, MAX_PARSE_CHARS))
        marked = [S + b" stdout F " + t.encode() for t in recorded if matters(t)][:40]
        for _ in range(10):  # runs of lines that all matter: the scan gives up on the buffer
            at = rng.randrange(len(lines))
            lines[at:at] = marked[: rng.randrange(5, 40)]
        data = b"\n".join(lines) + b"\n" + b"a partial line"
        outs: list[list[tuple[str, float | None]]] = []
        counts: list[Counter[str]] = []
        pending: list[tuple[int, bool]] = []
        for filtered in (None, lambda: True):
            got: list[tuple[str, float | None]] = []
            seen: Counter[str] = Counter()
            split = LineSplitter(
                lambda t, ts, got=got: got.append((t, ts)) if matters(t) else None,
                seen,
                cri=cri,
                max_line_bytes=max_line,
                filtered=filtered,
            )
            at = 0
            while at < len(data):  # chunks cut anywhere: in a line, in a CRI prefix, at a newline
                n = rng.choice((1, 7, 100, 4096, 65536))
                split.feed(data[at : at + n])
                at += n
            outs.append(got)
            counts.append(seen)
            pending.append((split.pending_bytes(), split.skipping))
            rng.seed(rng.random())  # the next splitter is fed in other chunks
        assert outs[0] == outs[1]
        assert counts[0] == counts[1]
        assert pending[0] == pending[1]
        assert any(outs[0]) and sum(counts[0].values()) > 0
