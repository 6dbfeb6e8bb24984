"""One NVML sampling pass's plumbing: its error policy (:class:`Pass`: a value, or why not,
and a :class:`~agent.core.sysfs.ReadIssue` where it failed) and the batched field values one
GPU's pass gathers so that ``nvmlDeviceGetFieldValues`` is called once (:class:`Batch`).

The policy is the one :mod:`agent.nvml.sampler` describes: ``NOT_SUPPORTED`` (and the other
``quiet`` answers) is a quiet :attr:`Miss.UNSUPPORTED`; ``GPU_IS_LOST`` raises
:class:`GpuLost`; any other error is an issue and :attr:`Miss.FAILED`.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Sequence
from typing import NoReturn, TypeAlias, TypeVar

from agent.core.sysfs import ReadIssue
from agent.nvml.api import UNSUPPORTED, NvmlAnswerError, NvmlApi, NvmlCallError

T = TypeVar("T")


class GpuLost(Exception):  # noqa: N818 - control flow, never escapes the sampler
    pass


def _issue_reason(name: str) -> str:
    if name == "NO_PERMISSION":
        return "permission"
    if name in ("NOT_FOUND", "GPU_NOT_FOUND"):
        return "vanished"
    return "io"


def _raise(exc: Exception) -> NoReturn:
    raise exc


def _path(where: str, call: str) -> str:
    """``nvml/<gpu>/<call>/<qualifier>`` from ``<gpu>/<qualifier>``."""
    gpu, _, qualifier = where.partition("/")
    return "/".join(p for p in ("nvml", gpu, call, qualifier) if p)


class Miss(enum.Enum):
    """Why a read gave no value: NVML does not offer it here, or it failed (an issue)."""

    UNSUPPORTED = "unsupported"
    FAILED = "failed"


#: one entry of a batched nvmlDeviceGetFieldValues as the sampler sees it (a failed whole call
#: or an answer of the wrong shape stands for every entry)
FieldAnswer: TypeAlias = int | NvmlCallError | NvmlAnswerError


class Pass:
    """Error policy of one sampling pass (see the module docstring)."""

    def __init__(self) -> None:
        self.issues: list[ReadIssue] = []

    def attempt(
        self, where: str, thunk: Callable[[], T], *, quiet: frozenset[str] = UNSUPPORTED
    ) -> T | Miss:
        """``thunk()``, or why not; ``where`` is ``<gpu>`` or ``<gpu>/<qualifier>`` or ``""``.
        An error in ``quiet`` is :attr:`Miss.UNSUPPORTED`, any other an issue and
        :attr:`Miss.FAILED`; GPU_IS_LOST raises :class:`GpuLost`."""
        try:
            return thunk()
        except NvmlCallError as exc:
            if exc.name in quiet:
                return Miss.UNSUPPORTED
            if exc.name == "GPU_IS_LOST" and where.partition("/")[0]:
                raise GpuLost(str(exc)) from exc
            self.issues.append(ReadIssue(_path(where, exc.call), _issue_reason(exc.name), str(exc)))
        except NvmlAnswerError as exc:  # an answer of the wrong shape
            self.issues.append(ReadIssue(_path(where, exc.call), "parse", str(exc)))
        except ValueError as exc:  # an answer fabricscope cannot parse (a mangled PCI address)
            self.issues.append(ReadIssue(f"nvml/{where}", "parse", str(exc)))
        return Miss.FAILED

    def get(
        self, where: str, thunk: Callable[[], T], *, quiet: frozenset[str] = UNSUPPORTED
    ) -> T | None:
        """``thunk()``, or ``None`` (see :meth:`attempt`)."""
        value = self.attempt(where, thunk, quiet=quiet)
        return None if isinstance(value, Miss) else value

    def answer(self, where: str, answer: FieldAnswer) -> int | Miss:
        """One entry of a batched field-values call, under the policy of a call of its own."""
        if isinstance(answer, int):
            return answer
        return self.attempt(where, functools.partial(_raise, answer))


class Batch:
    """The field values one GPU's pass needs, gathered so that NVML is called once."""

    def __init__(self) -> None:
        self.fields: list[tuple[int, int]] = []
        self._index: dict[tuple[int, str], int] = {}
        self._answers: tuple[FieldAnswer, ...] = ()

    def ask(self, key: tuple[int, str], field_id: int, scope_id: int) -> None:
        self._index[key] = len(self.fields)
        self.fields.append((field_id, scope_id))

    def __contains__(self, key: tuple[int, str]) -> bool:
        return key in self._index

    def run(self, api: NvmlApi, gpu: int) -> None:
        if not self.fields:
            return
        n = len(self.fields)
        try:
            answers: tuple[FieldAnswer, ...] = api.field_values(gpu, self.fields)
        except (NvmlCallError, NvmlAnswerError) as exc:  # the whole call: every entry
            answers = (exc,) * n
        if len(answers) != n:
            error = NvmlAnswerError(
                "nvmlDeviceGetFieldValues", f"{len(answers)} answers to {n} fields"
            )
            answers = (error,) * n
        self._answers = answers

    def __getitem__(self, key: tuple[int, str]) -> FieldAnswer:
        return self._answers[self._index[key]]


def combine(p: Pass, where: str, answers: Sequence[FieldAnswer]) -> tuple[int, ...] | Miss:
    """Several fields standing for one value: all their values, or the first entry's miss."""
    values: list[int] = []
    for answer in answers:
        got = p.answer(where, answer)
        if isinstance(got, Miss):
            return got
        values.append(got)
    return tuple(values)
