"""NCCL called directly, on the communicator torch built: the probe's data plane on GPUs.

nccl-tests times a loop of NCCL calls made from C. Through torch.distributed the same loop
costs far more CPU per call than the GPU needs at small sizes: on one H200, 37-82 us per
torch sendrecv (nccl-tests' C loop makes one in 7-10 us), so an eager torch loop times
Python and torch, not the fabric, and a CUDA graph of torch calls adds ~5-20 us of stream
joins per call (``bench/probe_graph_variants.py``). NCCL's own entry points, called
through ctypes from the probe's loop, took 10-20 us per sendrecv there, as the lend's CPU
varied (``scripts/gpu_probe_accuracy.sh`` on one GPU).

The communicator is torch's (``ProcessGroupNCCL._comm_ptr()``), not a second one: NCCL's
buffers take hundreds of MiB per communicator, and a second would break the probe's
2 GiB-per-GPU bound. torch's process group stays the control plane (agreements, rank
identities); this module only issues the timed collectives. The library is the
``libnccl.so.2`` torch already loaded (its soname resolves to that copy), so both speak
to one NCCL. When any of it is missing (an older torch without ``_comm_ptr``, a torch
without NCCL) :func:`attach` says why and the worker keeps torch's calls.

The constants are NCCL's ABI (``nccl.h``, unchanged since NCCL 2.0): ``ncclFloat32`` is 7,
``ncclSum`` 0, ``ncclUniqueId`` is not needed (torch made the communicator).
"""

from __future__ import annotations

import ctypes
import logging
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

NCCL_FLOAT32 = 7
NCCL_SUM = 0
NCCL_IN_PROGRESS = 7
#: ncclResult_t, nccl.h
RESULTS = {
    0: "ncclSuccess",
    1: "ncclUnhandledCudaError",
    2: "ncclSystemError",
    3: "ncclInternalError",
    4: "ncclInvalidArgument",
    5: "ncclInvalidUsage",
    6: "ncclRemoteError",
    7: "ncclInProgress",
}
SONAME = "libnccl.so.2"
#: how long a non-blocking communicator may stay "in progress" after a call
IN_PROGRESS_SECONDS = 30.0


class NcclError(RuntimeError):
    """A call into NCCL returned an error: ``code`` (ncclResult_t) and its name."""

    def __init__(self, call: str, code: int, detail: str = "") -> None:
        self.call = call
        self.code = code
        self.name = RESULTS.get(code, f"ncclResult {code}")
        super().__init__(f"{call}: {self.name}{': ' + detail if detail else ''}")


def _bind(lib: Any) -> None:
    """Argument and result types of the entry points used (nccl.h)."""
    vp, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    lib.ncclGetVersion.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.ncclAllReduce.argtypes = [vp, vp, sz, i, i, vp, vp]
    lib.ncclSend.argtypes = [vp, sz, i, i, vp, vp]
    lib.ncclRecv.argtypes = [vp, sz, i, i, vp, vp]
    lib.ncclGroupStart.argtypes = []
    lib.ncclGroupEnd.argtypes = []
    lib.ncclCommGetAsyncError.argtypes = [vp, ctypes.POINTER(ctypes.c_int)]
    for name in (
        "ncclGetVersion",
        "ncclAllReduce",
        "ncclSend",
        "ncclRecv",
        "ncclGroupStart",
        "ncclGroupEnd",
        "ncclCommGetAsyncError",
    ):
        getattr(lib, name).restype = ctypes.c_int
    lib.ncclGetLastError.argtypes = [vp]
    lib.ncclGetLastError.restype = ctypes.c_char_p


@dataclass(frozen=True, slots=True)
class Nccl:
    """NCCL's collectives on one communicator (``comm``: the ncclComm_t as an integer),
    issued on the stream given to each call (a cudaStream_t as an integer)."""

    lib: Any
    comm: int
    version: int

    def _check(self, call: str, code: int) -> None:
        if code == NCCL_IN_PROGRESS:
            code = self._settle()
        if code != 0:
            last = self.lib.ncclGetLastError(self.comm) or b""
            raise NcclError(call, code, last.decode(errors="replace").strip())

    def _settle(self) -> int:
        """A non-blocking communicator's state once it is no longer in progress."""
        state = ctypes.c_int(NCCL_IN_PROGRESS)
        deadline = time.monotonic() + IN_PROGRESS_SECONDS
        while state.value == NCCL_IN_PROGRESS and time.monotonic() < deadline:
            code = self.lib.ncclCommGetAsyncError(self.comm, ctypes.byref(state))
            if code != 0:
                return int(code)
        return int(state.value)

    def all_reduce(self, buffer: int, count: int, stream: int) -> None:
        """In-place sum of ``count`` float32 at device address ``buffer``."""
        code = self.lib.ncclAllReduce(
            buffer, buffer, count, NCCL_FLOAT32, NCCL_SUM, self.comm, stream
        )
        self._check("ncclAllReduce", code)

    def sendrecv(self, send: int, recv: int, count: int, *, to: int, frm: int, stream: int) -> None:
        """Send ``count`` float32 from ``send`` to rank ``to`` while receiving as many into
        ``recv`` from rank ``frm``, as one group (nccl-tests' sendrecv)."""
        self._check("ncclGroupStart", self.lib.ncclGroupStart())
        first: tuple[str, int] | None = None
        try:
            code = self.lib.ncclSend(send, count, NCCL_FLOAT32, to, self.comm, stream)
            if code not in (0, NCCL_IN_PROGRESS):
                first = ("ncclSend", code)
            else:
                code = self.lib.ncclRecv(recv, count, NCCL_FLOAT32, frm, self.comm, stream)
                if code not in (0, NCCL_IN_PROGRESS):
                    first = ("ncclRecv", code)
        finally:
            end = self.lib.ncclGroupEnd()
        if first is not None:
            self._check(*first)
        self._check("ncclGroupEnd", end)


def attach(process_group: Any, device: Any) -> tuple[Nccl | None, str]:
    """NCCL on the communicator of ``process_group`` (torch's default group) for
    ``device``, or None and why not. Never raises."""
    try:
        backend = process_group._get_backend(device)
        comm = int(backend._comm_ptr())
    except Exception as exc:  # no such (private) method in this torch, or no NCCL backend
        return None, f"torch gives no NCCL communicator ({type(exc).__name__}: {exc})"
    if not comm:
        return None, "torch's NCCL communicator is not initialised"
    try:
        lib = ctypes.CDLL(SONAME)
        _bind(lib)
        version = ctypes.c_int()
        if lib.ncclGetVersion(ctypes.byref(version)) != 0:
            return None, "ncclGetVersion failed"
    except (OSError, AttributeError) as exc:
        return None, f"{SONAME} is not usable: {exc}"
    return Nccl(lib=lib, comm=comm, version=version.value), ""
