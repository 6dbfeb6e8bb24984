"""The XID event watch of the NVML sampler: one event set, polled at the end of each pass.

See :mod:`agent.nvml.sampler` ("XID errors") for why there is no XID thread.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from agent.nvml.api import NvmlApi, NvmlCallError
from agent.nvml.snapshot import XidCount, XidRegistration

log = logging.getLogger(__name__)


#: the most XID events one pass collects (the rest wait for the next pass)
XID_EVENTS_PER_PASS = 1000


class XidEvents:
    """The XID event set and the counts. Used only from the thread running a pass: it
    registers the GPUs on the first pass and collects queued events at the end of each."""

    def __init__(self, api: NvmlApi) -> None:
        self._api = api
        self._counts: dict[tuple[int, int], int] = {}
        self._opened = False
        self._failing = False
        self.registrations: tuple[XidRegistration, ...] = ()

    def open(self, gpus: Sequence[int]) -> None:
        """Create the event set and register every GPU (a refusal is noted, not fatal)."""
        try:
            self._api.xid_open()
        except NvmlCallError as exc:
            log.warning("XID events not watched: %s", exc)
            self.registrations = tuple(XidRegistration(g, False, exc.name) for g in gpus)
            return
        self._opened = True
        regs = []
        for gpu in gpus:
            try:
                self._api.xid_register(gpu)
            except NvmlCallError as exc:
                log.warning("XID events of GPU %d not watched: %s", gpu, exc)
                regs.append(XidRegistration(gpu, False, exc.name))
            else:
                regs.append(XidRegistration(gpu, True))
        self.registrations = tuple(regs)

    def poll(self, wait_ms: int = 0) -> int:
        """Count the events queued (waiting up to ``wait_ms`` for the first); how many."""
        if not any(r.watched for r in self.registrations):
            return 0
        n = 0
        while n < XID_EVENTS_PER_PASS:
            try:
                event = self._api.xid_wait(wait_ms if n == 0 else 0)
            except NvmlCallError as exc:
                if exc.name != "TIMEOUT":
                    if not self._failing:
                        log.error("collecting XID events failed: %s; trying every pass", exc)
                    self._failing = True
                    return n
                break
            log.warning("GPU %d: XID %d", event.gpu, event.xid)
            key = (event.gpu, event.xid)
            self._counts[key] = self._counts.get(key, 0) + 1
            n += 1
        if self._failing:
            log.info("collecting XID events works again")
            self._failing = False
        return n

    def counts(self) -> tuple[XidCount, ...]:
        return tuple(XidCount(g, x, n) for (g, x), n in sorted(self._counts.items()))

    def close(self) -> None:
        if not self._opened:
            return
        self._opened = False
        try:
            self._api.xid_close()
        except NvmlCallError as exc:
            log.debug("freeing the XID event set: %s", exc)
