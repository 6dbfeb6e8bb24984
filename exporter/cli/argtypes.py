"""Argument types shared by every subcommand's flags: one wording for one kind of mistake,
and the parser class every subcommand uses (no abbreviations, one-line errors)."""

from __future__ import annotations

import argparse
import difflib
import sys
from typing import Any, NoReturn

from agent.config import parse_bytes, parse_duration


def error_line(prog: str, message: str) -> str:
    """The one format of every command-line error, from argparse or from checking the
    settings: ``fabricscope agent: error: ... (see fabricscope agent --help)``."""
    return f"{prog}: error: {message} (see {prog} --help)"


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` as fabricscope's commands need it:

    - no abbreviations (``allow_abbrev=False``): ``--path.sys`` must not silently mean
      ``--path.sysfs``; subparsers made through :meth:`add_subparsers` are this class too, and
      get the same default;
    - an error is one line on stderr, ``fabricscope agent: error: ... (see fabricscope agent
      --help)``, exit status 2, instead of the whole usage (46 lines for ``agent``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, error_line(self.prog, message) + "\n")

    def unknown(self, extras: list[str]) -> NoReturn:
        """Refuse arguments this (sub)command does not take, naming the nearest flag."""
        flags = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
        first = extras[0].partition("=")[0]
        close = difflib.get_close_matches(first, flags, n=1, cutoff=0.75)
        hint = f"; did you mean {close[0]}?" if close and first.startswith("-") else ""
        self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")


def parse_known(parser: Parser, argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv``; arguments no parser took are refused by the subcommand that got them
    (argparse itself would blame the top-level parser and print its usage)."""
    ns, extras = parser.parse_known_args(argv)
    if extras:
        sub = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = getattr(ns, action.dest or "", None)
                if chosen in action.choices:
                    sub = action.choices[chosen]
        assert isinstance(sub, Parser)
        sub.unknown(extras)
    return ns


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def positive(text: str) -> float:
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def duration(text: str) -> float:
    """A duration in seconds: Prometheus's syntax (``15s``, ``1m30s``, ``6h``) or plain
    seconds (``15``, ``0.5``); >= 0."""
    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_duration(text: str) -> float:
    value = duration(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def _at_least_one(text: str, what: str, unit: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1{unit}: {text!r}")
    return value


def count(text: str) -> int:
    return _at_least_one(text, "an integer", "")


def count_or_zero(text: str) -> int:
    """A whole number >= 0 (0 switches something off)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
    return value


def byte_size_or_zero(text: str) -> int:
    """A byte size: ``16MiB``, ``16Mi``, ``16M`` (10^6), ``16MB``, or plain bytes
    (:func:`agent.config.parse_bytes`); 0 switches something off."""
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def byte_size(text: str) -> int:
    """A byte size (:func:`byte_size_or_zero`'s syntax) of at least 1 byte."""
    value = byte_size_or_zero(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte: {text!r}")
    return value


def whole_seconds(text: str) -> int:
    """A positive duration that is a whole number of seconds (``5s``, ``1m``, ``5``): for
    settings handed to a program that counts in seconds."""
    value = positive_duration(text)
    if value != int(value):
        raise argparse.ArgumentTypeError(f"must be a whole number of seconds: {text!r}")
    return int(value)


def warn(message: str) -> None:
    """A flag that is accepted but has no effect in this mode: said once, on stderr."""
    print(f"fabricscope: note: {message}", file=sys.stderr)


#: argparse's add_argument_group and ArgumentParser both take add_argument
_Adds = argparse.ArgumentParser | argparse._ArgumentGroup


def add_prometheus_timeout(g: _Adds) -> None:
    """``--prometheus.timeout``: every command that asks Prometheus takes it alike."""
    g.add_argument(
        "--prometheus.timeout",
        dest="prom_timeout",
        type=duration,
        default=10.0,
        metavar="DURATION",
        help="per request: connect, headers and the whole answer (default: 10s)",
    )


def add_choice(
    g: _Adds, flag: str, dest: str, *, choices: tuple[str, ...], default: str, help: str
) -> None:
    """A flag of a few named values, its help ending with the default."""
    g.add_argument(
        flag, dest=dest, choices=choices, default=default, help=f"{help} (default: %(default)s)"
    )
