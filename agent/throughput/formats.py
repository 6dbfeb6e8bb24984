"""Pure parsers: one training-log line in, the throughput figures it states out.

Each parser takes one line (already decoded, without its newline) and returns a
:class:`Reading` holding only the fields the line states, or None when the line is not
one of its format's throughput lines. Nothing here touches a file, a clock or a log: the
tailer (``tail.py``) feeds lines, the sampler (``sampler.py``) keeps the latest values.

Units are converted here, once: milliseconds to seconds, TFLOP/s to FLOP/s, percentages
to ratios. A figure the line does not state is None (absent), never 0. A figure derived
from others (iterations/s from the time per iteration, samples/s from the global batch
size and the time per iteration) is derived here and said so in the parser's docstring.

Formats (the ``format`` label): composer, hf_trainer, megatron, deepspeed, torchtitan,
lightning, nanogpt, custom (a pod's ``fabricscope.io/throughput-regex``).

Lines are untrusted (any pod on the node writes them), so parsing is linear in a line's
length and bounded per line: every pattern is compiled by RE2 (:mod:`.linear`), whose
matching time is linear in the text whatever the pattern, and numbers are matched by
:data:`_NUM`, whose quantifiers cannot overlap. :func:`parse_line` looks at no more than
:data:`MAX_PARSE_CHARS` characters of a line (the latest redraw of a ``\r``-separated
progress bar); a longer one is not parsed (:func:`parse_window` says so, the sampler counts
it). A format is a pure function from one such bounded line to a :class:`Reading`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

from agent.throughput.linear import NotLinear, Pattern, compile_linear

#: every built-in format, in the order lines are tried, then ``custom``
FORMATS = (
    "composer",
    "megatron",
    "deepspeed",
    "torchtitan",
    "hf_trainer",
    "lightning",
    "nanogpt",
    "custom",
)

#: the figures a line can state: Reading's value fields, and a custom regex's group names
FIELDS = (
    "tokens_per_second",
    "samples_per_second",
    "iterations_per_second",
    "step_seconds",
    "flops_per_gpu",
    "mfu_ratio",
)


@dataclass(frozen=True, slots=True)
class Reading:
    """What one line states. Every value field is None unless the line states it.

    ``tokens_per_second``, ``samples_per_second``, ``iterations_per_second``: rates as the
    job printed them (job-wide, except torchtitan's ``tps``, which is per device).
    ``step_seconds``: time per iteration. ``flops_per_gpu``: model FLOP/s per GPU (TFLOP/s
    x 1e12). ``mfu_ratio``: model FLOPs utilisation, 0..1.
    """

    format: str
    tokens_per_second: float | None = None
    samples_per_second: float | None = None
    iterations_per_second: float | None = None
    step_seconds: float | None = None
    flops_per_gpu: float | None = None
    mfu_ratio: float | None = None

    def values(self) -> list[tuple[str, float]]:
        """(field, value) for every field the line stated."""
        out = []
        for name in FIELDS:
            v = getattr(self, name)
            if v is not None:
                out.append((name, v))
        return out


assert tuple(f.name for f in fields(Reading))[1:] == FIELDS

Parser = Callable[[str], "Reading | None"]

#: a printed number: digits (with thousands commas), an optional fraction, an optional
#: exponent. No two quantifiers can consume the same character (``\d[\d,]*\.?\d*`` could:
#: backtracking tried every split of a digit run, quadratic in its length)
_NUM = r"([-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)"
#: the most characters of one line a parser looks at (the latest redraw of a progress bar);
#: the longest throughput line of the recorded fixtures is under 1,000
MAX_PARSE_CHARS = 16384


def parse_window(line: str) -> str | None:
    """The part of ``line`` parsers look at: the latest non-blank ``\r``-separated redraw
    (a tqdm bar's updates share one line), or None when that is longer than
    :data:`MAX_PARSE_CHARS`. Linear in the line's length (C-level ``rstrip``/``rfind``)."""
    if "\r" in line:
        line = line.rstrip()
        line = line[line.rfind("\r") + 1 :]
    return line if len(line) <= MAX_PARSE_CHARS else None


def number(text: str | None) -> float | None:
    """A printed number as a float (``30,768`` -> 30768.0); None for nan, inf, junk or an
    optional group that did not match (None)."""
    if text is None:
        return None
    try:
        v = float(text.replace(",", ""))
    except ValueError:
        return None
    return v if math.isfinite(v) else None


#: the most matches of one pattern a parser takes from one line (a real line has a dozen)
MAX_MATCHES = 64


def _at_literal(rx: Pattern, literal: str, line: str) -> list[tuple[str | None, ...]]:
    """The groups of the matches of ``rx`` (which begins with ``literal``) where ``literal``
    occurs: found with ``str.find`` and matched anchored there, one RE2 call each instead
    of an unanchored search's three passes. At most :data:`MAX_MATCHES` matches and four
    times as many attempts per line."""
    out: list[tuple[str | None, ...]] = []
    at = line.find(literal)
    attempts = 0
    while at >= 0 and len(out) < MAX_MATCHES and attempts < 4 * MAX_MATCHES:
        attempts += 1
        groups = rx.groups_at(line, at)
        if groups is not None:
            out.append(groups)
        at = line.find(literal, at + 1)
    return out


def _first(rx: Pattern, literal: str, line: str) -> float | None:
    """The non-negative number in group 1 of the first match of ``rx`` at ``literal``."""
    at = line.find(literal)
    attempts = 0
    while at >= 0 and attempts < 4 * MAX_MATCHES:
        attempts += 1
        groups = rx.groups_at(line, at)
        if groups is not None:
            return _nonneg(number(groups[0]))
        at = line.find(literal, at + 1)
    return None


def _matches(rx: Pattern, line: str) -> list[tuple[str, str]]:
    """Groups 1 and 2 of the first :data:`MAX_MATCHES` matches of ``rx`` in ``line``: a line
    of 30,000 repeated figures costs 64 matches, not 30,000 (each one costs Python work)."""
    out = []
    for m in rx.finditer(line):
        out.append((m.group(1) or "", m.group(2) or ""))
        if len(out) == MAX_MATCHES:
            break
    return out


def _rate(per_unit: float | None) -> float | None:
    """1 / x for a positive time, else None."""
    return 1.0 / per_unit if per_unit is not None and per_unit > 0 else None


def _nonneg(v: float | None) -> float | None:
    return v if v is not None and v >= 0 else None


# --- MosaicML Composer ---------------------------------------------------------------------

_COMPOSER = compile_linear(r"Train throughput/((?:device/)?[a-z_]+): " + _NUM)
_COMPOSER_KEYS = {
    "tokens_per_sec": "tokens_per_second",
    "samples_per_sec": "samples_per_second",
    "batches_per_sec": "iterations_per_second",
    "device/flops_per_sec": "flops_per_gpu",
    "device/mfu": "mfu_ratio",
}


def parse_composer(line: str) -> Reading | None:
    """Composer's ConsoleLogger (one metric per line, or several on one line)::

        \\t Train throughput/tokens_per_sec: 20082.8418

    Job-wide ``tokens_per_sec``, ``samples_per_sec``, ``batches_per_sec`` (iterations/s),
    ``device/flops_per_sec`` (per GPU) and ``device/mfu`` (a ratio already). Other per-device
    variants (``device/tokens_per_sec`` ...) are the job-wide figure divided by the world
    size: not exported twice.
    """
    if "Train throughput/" not in line:
        return None
    found: dict[str, float] = {}
    for key, raw in _at_literal(_COMPOSER, "Train throughput/", line):
        name = _COMPOSER_KEYS.get(key or "")
        v = _nonneg(number(raw))
        if name is not None and v is not None:
            found[name] = v
    return Reading("composer", **found) if found else None


# --- Megatron-LM, Megatron-Core, Megatron-DeepSpeed ---------------------------------------

_MEG_ELAPSED = compile_linear(r"elapsed time per iteration \(ms\): " + _NUM)
_MEG_TFLOPS_CORE = compile_linear(r"throughput per GPU \(TFLOP/s/GPU\): " + _NUM)
_MEG_TFLOPS_DS = compile_linear(r"TFLOPs: " + _NUM)
_MEG_SAMPLES = compile_linear(r"samples per second: " + _NUM)
_MEG_TOKENS = compile_linear(r"tokens per second: " + _NUM)
_MEG_GBS = compile_linear(r"global batch size: +" + _NUM)
_MEG_SEQLEN = compile_linear(r"actual seqlen: +" + _NUM)


def parse_megatron(line: str) -> Reading | None:
    """Megatron's training-log line (``iteration N/M | ... |``)::

        iteration 2/ 100 | consumed samples: 256 | elapsed time per iteration (ms): 5630.1 |
        throughput per GPU (TFLOP/s/GPU): 231.9 | ... | global batch size: 128 | ...

    ``elapsed time per iteration (ms)`` -> step seconds and iterations/s (its inverse);
    ``throughput per GPU (TFLOP/s/GPU)`` (Megatron-Core) or ``TFLOPs`` (Megatron-DeepSpeed,
    per GPU) -> FLOP/s per GPU; ``samples per second`` (Megatron-DeepSpeed) as printed, else
    derived as global batch size / step seconds; ``tokens per second`` as printed, else
    derived from ``actual seqlen`` (Megatron-DeepSpeed) x global batch size / step seconds.
    """
    if "elapsed time per iteration (ms)" not in line:
        return None
    ms = _first(_MEG_ELAPSED, "elapsed time per iteration (ms): ", line)
    step = ms / 1000.0 if ms is not None and ms > 0 else None
    tflops = _first(_MEG_TFLOPS_CORE, "throughput per GPU (TFLOP/s/GPU): ", line)
    if tflops is None:
        tflops = _first(_MEG_TFLOPS_DS, "TFLOPs: ", line)
    samples = _first(_MEG_SAMPLES, "samples per second: ", line)
    tokens = _first(_MEG_TOKENS, "tokens per second: ", line)
    gbs = _first(_MEG_GBS, "global batch size: ", line)
    if samples is None and gbs is not None and step is not None:
        samples = gbs / step
    seqlen = _first(_MEG_SEQLEN, "actual seqlen: ", line)
    if tokens is None and seqlen is not None and gbs is not None and step is not None:
        tokens = gbs * seqlen / step
    return Reading(
        "megatron",
        tokens_per_second=tokens,
        samples_per_second=samples,
        iterations_per_second=_rate(step),
        step_seconds=step,
        flops_per_gpu=tflops * 1e12 if tflops is not None else None,
    )


def _search(pattern: Pattern, line: str) -> float | None:
    m = pattern.search(line)
    return _nonneg(number(m.group(1))) if m else None


# --- DeepSpeed ----------------------------------------------------------------------------

_DS_CURR = compile_linear(r"CurrSamplesPerSec=" + _NUM)
_DS_SAMPLES_SEC = compile_linear(r"(?:samples/sec|SamplesPerSec)[=:] *" + _NUM)


def parse_deepspeed(line: str) -> Reading | None:
    """DeepSpeed's throughput timer (``timer.py``, every ``steps_per_print`` steps)::

        epoch=0/micro_step=4/global_step=4, RunningAvgSamplesPerSec=303.11,
        CurrSamplesPerSec=315.56, MemAllocated=17.54GB, MaxMemAllocated=66.97GB

    ``CurrSamplesPerSec`` (the latest interval, job-wide: DeepSpeed times the train batch
    size) is preferred over the running average; ``samples/sec: N`` lines count too.
    """
    if "SamplesPerSec" not in line and "samples/sec" not in line:
        return None
    v = _first(_DS_CURR, "CurrSamplesPerSec=", line)
    if v is None:
        v = _search(_DS_SAMPLES_SEC, line)
    return Reading("deepspeed", samples_per_second=v) if v is not None else None


# --- torchtitan ---------------------------------------------------------------------------

_TT_TPS = compile_linear(r"\btps: +" + _NUM)
_TT_TFLOPS = compile_linear(r"\btflops: +" + _NUM)
_TT_MFU = compile_linear(r"\bmfu: +" + _NUM + "%")


def parse_torchtitan(line: str) -> Reading | None:
    """torchtitan's metrics line (per rank)::

        step:  4  loss:  7.62585  grad_norm: 26.6250  memory: 66.91GiB(37.51%)
        tps: 10,050  tflops: 314.71  mfu: 13.99%

    ``tps`` is tokens per second **per device** as torchtitan prints it; ``tflops`` ->
    FLOP/s per GPU; ``mfu`` percent -> ratio.
    """
    if "tps: " not in line:
        return None
    tps = _first(_TT_TPS, "tps: ", line)
    if tps is None:
        return None
    tflops = _first(_TT_TFLOPS, "tflops: ", line)
    mfu = _first(_TT_MFU, "mfu: ", line)
    return Reading(
        "torchtitan",
        tokens_per_second=tps,
        flops_per_gpu=tflops * 1e12 if tflops is not None else None,
        mfu_ratio=mfu / 100.0 if mfu is not None else None,
    )


# --- Hugging Face Trainer (and tqdm bars) -------------------------------------------------

_HF_KEYS = {
    "train_tokens_per_second": "tokens_per_second",
    "train_samples_per_second": "samples_per_second",
    "train_steps_per_second": "iterations_per_second",
}
_HF_DICT = compile_linear(
    r"""['"](train_tokens_per_second|train_samples_per_second|train_steps_per_second)['"]: """
    + _NUM
)
#: ``N it/s`` / ``N s/it`` not preceded by a digit, ``.`` or ``?`` (RE2 has no lookbehind:
#: the preceding character, or the line's start, is matched instead)
_TQDM = compile_linear(r"(?:^|[^\d.?])(\d+(?:\.\d+)?)(it/s|s/it)")
#: descriptions of Lightning's bars: training (``Epoch N``) and the loops that are not
_LIGHTNING_BARS = ("Epoch ", "Validation", "Testing", "Predicting", "Sanity Checking")


def parse_hf_trainer(line: str) -> Reading | None:
    """Hugging Face Trainer: its logged dicts, and tqdm progress bars.

        {'train_runtime': 273.0148, 'train_samples_per_second': 3.663,
         'train_steps_per_second': 0.007, 'epoch': 1.0}
        ... 25%|##5       | 1/4 [03:45<11:15, 225.28s/it]

    The dict's ``train_samples_per_second`` / ``train_steps_per_second`` /
    ``train_tokens_per_second`` (printed at the end of ``train()``, and by SFT-style trainers
    in step dicts). A tqdm bar (``\\r``-separated updates on one line) gives its latest rate:
    ``N it/s`` -> iterations/s, ``N s/it`` -> step seconds, each with its inverse. A bar
    whose description starts with ``Epoch`` is Lightning's (:func:`parse_lightning`).
    """
    if "_per_second" in line:
        found: dict[str, float] = {}
        for key, raw in _matches(_HF_DICT, line):
            v = _nonneg(number(raw))
            if v is not None:
                found[_HF_KEYS[key]] = v
        if found:
            return Reading("hf_trainer", **found)
    if "it/s" not in line and "s/it" not in line:
        return None
    if _last_segment(line).lstrip().startswith(_LIGHTNING_BARS):
        return None
    return _tqdm("hf_trainer", line)


def _last_segment(line: str) -> str:
    """The latest redraw of a ``\r``-separated progress bar (blank redraws skipped)."""
    if "\r" not in line:
        return line
    line = line.rstrip()
    return line[line.rfind("\r") + 1 :]


def _tqdm(fmt: str, text: str) -> Reading | None:
    found = _matches(_TQDM, text)
    if not found:
        return None
    raw, unit = found[-1]
    v = number(raw)
    if v is None or v <= 0:
        return None
    if unit == "it/s":
        return Reading(fmt, iterations_per_second=v, step_seconds=1.0 / v)
    return Reading(fmt, iterations_per_second=1.0 / v, step_seconds=v)


# --- PyTorch Lightning --------------------------------------------------------------------


def parse_lightning(line: str) -> Reading | None:
    """PyTorch Lightning's progress bar (TQDMProgressBar; its updates are ``\\r``-separated
    on one line)::

        Epoch 0:  45%|####5     | 450/1000 [00:30<00:36, 15.00it/s, v_num=0, loss=2.34]

    The latest ``it/s`` (or ``s/it``) of a bar whose description starts with ``Epoch``;
    validation bars are skipped (their rate is not the training rate).
    """
    if "Epoch " not in line or ("it/s" not in line and "s/it" not in line):
        return None
    last = _last_segment(line)
    if not last.lstrip().startswith("Epoch "):
        return None
    return _tqdm("lightning", last)


# --- nanoGPT, modded-nanogpt, llm.c -------------------------------------------------------

_NANO_ITER = compile_linear(r"^iter \d+: loss [^,]*, time " + _NUM + r"ms(?:, mfu " + _NUM + "%)?")
_MODDED = compile_linear(r"^step:\d+/\d+ .*step_avg:" + _NUM + "ms")
_LLMC = compile_linear(
    r"^step +\d+/\d+ \|.*\| " + _NUM + r" ms \|(?: " + _NUM + r"% bf16 MFU \|)? " + _NUM + " tok/s"
)


def parse_nanogpt(line: str) -> Reading | None:
    """nanoGPT-style step lines::

        iter 100: loss 4.1234, time 123.45ms, mfu 31.23%          (karpathy/nanoGPT)
        step:2/1490 train_time:108ms step_avg:53.87ms             (modded-nanogpt)
        step    2/32000 | loss 10.539388 (+nanz)| norm 43.5996 (+nanz)| lr 1.71e-06 |
        2747.19 ms | 47.4% bf16 MFU | 381690 tok/s                      (llm.c)

    The time per step in ms -> step seconds and iterations/s; ``mfu`` percent -> ratio
    (llm.c prints -100% when it does not know the GPU's peak: absent); ``tok/s`` ->
    tokens/s. modded-nanogpt's ``step_avg`` is the running mean since the start of timing
    (``nanms`` before the first timed step: skipped).
    """
    s = line.lstrip()
    if not s.startswith(("iter ", "step")):
        return None
    m = _NANO_ITER.match(s)
    if m:
        ms = _nonneg(number(m.group(1)))
        mfu = _nonneg(number(m.group(2))) if m.group(2) else None
        step = ms / 1000.0 if ms else None
        if step is None:
            return None
        return Reading(
            "nanogpt",
            iterations_per_second=_rate(step),
            step_seconds=step,
            mfu_ratio=mfu / 100.0 if mfu is not None else None,
        )
    m = _MODDED.match(s)
    if m:
        ms = _nonneg(number(m.group(1)))
        if not ms:
            return None
        return Reading("nanogpt", iterations_per_second=1000.0 / ms, step_seconds=ms / 1000.0)
    m = _LLMC.match(s)
    if m:
        ms, tok = _nonneg(number(m.group(1))), _nonneg(number(m.group(3)))
        mfu = _nonneg(number(m.group(2))) if m.group(2) else None
        if not ms:
            return None
        return Reading(
            "nanogpt",
            tokens_per_second=tok,
            iterations_per_second=1000.0 / ms,
            step_seconds=ms / 1000.0,
            mfu_ratio=mfu / 100.0 if mfu is not None else None,
        )
    return None


# --- custom (a pod annotation's regex) ----------------------------------------------------


class BadRegex(ValueError):  # noqa: N818 - a value that is wrong, reported as a reason
    """A ``fabricscope.io/throughput-regex`` that cannot be used; the message says why."""


#: longest custom regex accepted (characters)
MAX_CUSTOM_REGEX = 1024


def compile_custom(pattern: str) -> Pattern:
    """Compile a custom format's regex. It must name at least one group after a figure
    (``tokens_per_second``, ``samples_per_second``, ``iterations_per_second``,
    ``step_seconds``, ``flops_per_gpu``, ``mfu_ratio``) and no other group. Raises
    :class:`BadRegex` with a message fit for a log line and an event.

    The regex is compiled by RE2 (linear-time matching): a pattern RE2 cannot run that way
    (backreferences ``\\1``, lookahead ``(?=``, lookbehind ``(?<=``, possessive or atomic
    groups, repetitions over 1000) is refused, never run by a backtracking engine."""
    if len(pattern) > MAX_CUSTOM_REGEX:
        raise BadRegex(f"longer than {MAX_CUSTOM_REGEX} characters")
    try:
        rx = compile_linear(pattern)
    except NotLinear as exc:
        raise BadRegex(f"does not compile as a linear-time (RE2) regex: {exc}") from None
    names = set(rx.groupindex)
    unknown = names - set(FIELDS)
    if unknown:
        raise BadRegex(
            f"unknown named group(s) {', '.join(sorted(unknown))}; use {', '.join(FIELDS)}"
        )
    if not names:
        raise BadRegex(
            f"names no group; name one of {', '.join(FIELDS)}, e.g. (?P<step_seconds>...)"
        )
    return rx


def parse_custom(rx: Pattern, line: str) -> Reading | None:
    """The named groups of the first match of a custom regex, as numbers; groups that did
    not match or are not numbers are absent. None when nothing usable matched."""
    m = rx.search(line)
    if m is None:
        return None
    found: dict[str, float] = {}
    for name, raw in m.groupdict().items():
        v = _nonneg(number(raw)) if raw is not None else None
        if v is not None:
            found[name] = v
    return Reading("custom", **found) if found else None


# --- all of them --------------------------------------------------------------------------

BUILTIN: tuple[tuple[str, Parser], ...] = (
    ("composer", parse_composer),
    ("megatron", parse_megatron),
    ("deepspeed", parse_deepspeed),
    ("torchtitan", parse_torchtitan),
    ("lightning", parse_lightning),
    ("hf_trainer", parse_hf_trainer),
    ("nanogpt", parse_nanogpt),
)


def parse_line(line: str, custom: Pattern | None = None) -> Reading | None:
    """The first format that reads ``line``: the custom regex first (the pod asked for it),
    then the built-in formats. None when no format states a figure on this line, or when
    the line is too long to parse (:func:`parse_window`). Linear in the line's length."""
    window = parse_window(line)
    if window is None:
        return None
    line = window
    if custom is not None:
        r = parse_custom(custom, line)
        if r is not None:
            return r
    for _, parse in BUILTIN:
        r = parse(line)
        if r is not None and r.values():
            return r
    return None


def with_format(r: Reading, fmt: str) -> Reading:
    return replace(r, format=fmt)
