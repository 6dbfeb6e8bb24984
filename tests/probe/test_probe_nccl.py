"""agent/probe/measure/nccl.py: NCCL called directly on torch's communicator (the GPU data plane).

What runs without a GPU is tested here: :func:`attach` refusing every way it can (no
private ``_comm_ptr`` in this torch, a communicator not made yet, no ``libnccl.so.2``), each
with the reason the worker logs, the call sequence and error handling of a group
send/recv, and the bounded wait that stands in for torch's watchdog. CI's torch has no
NCCL, so the library's part is a Python stand-in answering nccl.h's result codes; the real
library runs on the GPU machine (``scripts/gpu_probe_accuracy.sh``: the probe's sendrecv
and all_reduce through it, checked element by element, against nccl-tests)."""

from __future__ import annotations

import ctypes
import time
from typing import Any

import pytest

from agent.probe.measure import nccl as nccl_mod
from agent.probe.measure.nccl import Nccl, NcclError, attach


class _Backend:
    def __init__(self, comm: int | Exception) -> None:
        self.comm = comm

    def _comm_ptr(self) -> int:
        if isinstance(self.comm, Exception):
            raise self.comm
        return self.comm


class _Group:
    def __init__(self, backend: object) -> None:
        self.backend = backend

    def _get_backend(self, device: object) -> object:
        return self.backend


def test_attach_says_why_when_torch_has_no_communicator_to_give() -> None:
    nccl, why = attach(_Group(object()), "cuda:0")
    assert nccl is None and why.startswith("torch gives no NCCL communicator (AttributeError")
    nccl, why = attach(_Group(_Backend(RuntimeError("no comm for device"))), "cuda:0")
    assert nccl is None and "RuntimeError: no comm for device" in why
    nccl, why = attach(_Group(_Backend(0)), "cuda:0")
    assert (nccl, why) == (None, "torch's NCCL communicator is not initialised")


def test_attach_says_why_when_the_library_is_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    """CI's torch is a CPU build: no libnccl.so.2 anywhere, as on a node without NCCL."""
    monkeypatch.setattr(nccl_mod, "SONAME", "libnccl-not-here.so.2")
    nccl, why = attach(_Group(_Backend(0x4416E660)), "cuda:0")
    assert nccl is None and why.startswith("libnccl-not-here.so.2 is not usable:")


class _Lib:
    """Stands in for libnccl: records calls, answers the codes it is given (nccl.h's)."""

    def __init__(self, **codes: int) -> None:
        self.codes = codes
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name == "ncclGetLastError":
            return lambda comm: b"peer 1 closed the connection\n"

        def call(*args: object) -> int:
            self.calls.append(name)
            return self.codes.get(name, 0)

        return call


def test_sendrecv_is_one_group_of_a_send_and_a_receive() -> None:
    lib = _Lib()
    Nccl(lib, 1, 22809).sendrecv(0x10, 0x20, 256, to=1, frm=1, stream=0)
    assert lib.calls == ["ncclGroupStart", "ncclSend", "ncclRecv", "ncclGroupEnd"]


def test_a_failed_send_still_ends_the_group_and_names_the_call() -> None:
    """NCCL's group must be closed whatever failed inside it, or the next call joins it."""
    lib = _Lib(ncclSend=6)
    with pytest.raises(NcclError) as info:
        Nccl(lib, 1, 22809).sendrecv(0x10, 0x20, 256, to=1, frm=1, stream=0)
    assert lib.calls == ["ncclGroupStart", "ncclSend", "ncclGroupEnd"]
    assert str(info.value) == "ncclSend: ncclRemoteError: peer 1 closed the connection"
    assert (info.value.code, info.value.name) == (6, "ncclRemoteError")


def test_all_reduce_errors_carry_the_result_name() -> None:
    with pytest.raises(NcclError, match=r"^ncclAllReduce: ncclUnhandledCudaError: peer"):
        Nccl(_Lib(ncclAllReduce=1), 1, 22809).all_reduce(0x10, 256, 0)
    assert NcclError("ncclSend", 42).name == "ncclResult 42"


def test_a_non_blocking_communicator_is_waited_for_until_settled() -> None:
    """ncclInProgress (7) from a non-blocking communicator: the call polls
    ncclCommGetAsyncError until the state is no longer in progress."""

    class Settling(_Lib):
        polls = 0

        def __getattr__(self, name: str) -> Any:
            if name != "ncclCommGetAsyncError":
                return super().__getattr__(name)

            def poll(comm: int, state: Any) -> int:
                Settling.polls += 1
                ctypes.cast(state, ctypes.POINTER(ctypes.c_int))[0] = 7 if self.polls < 3 else 0
                return 0

            return poll

    lib = Settling(ncclAllReduce=7)
    Nccl(lib, 1, 22809).all_reduce(0x10, 256, 0)
    assert Settling.polls == 3


class _Event:
    """A CUDA event's ``query()``: done after ``polls`` looks (None: never, a stuck NCCL
    kernel whose peer vanished)."""

    def __init__(self, polls: int | None) -> None:
        self.polls = polls
        self.looks = 0

    def query(self) -> bool:
        self.looks += 1
        return self.polls is not None and self.looks > self.polls


def test_a_stuck_collective_times_out_instead_of_blocking_the_worker() -> None:
    """NCCL called directly has no watchdog: the wait for the GPU is bounded by the spec's
    timeout, and the error reads as the reason ``timeout``."""
    from agent.probe.measure import collectives, worker

    stuck = _Event(None)
    began = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        collectives.wait_event(stuck, 0.05)
    assert 0.05 <= time.monotonic() - began < 2.0 and stuck.looks > 2
    assert worker.run_reason(frozenset({"TimeoutError"}), str(info.value)) == "timeout"
    done = _Event(3)
    collectives.wait_event(done, 5.0)
    assert done.looks == 4
