"""The guest side of one node-pair probe: propose an offer to the host's rendezvous (asking
again while it declines ``gpu_busy``), and on acceptance run rank 1 against the host's
store. Used by the probe service's rounds and by ``fabricscope probe --peer``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from agent.probe.measure.launch import Launcher, WorkerRun
from agent.probe.measure.records import WorkerSpec
from agent.probe.rendezvous.client import propose
from agent.probe.rendezvous.messages import Answer, Offer
from agent.probe.rendezvous.wire import RendezvousError
from agent.probe.run.addresses import is_unspecified

#: longest a guest waits for a host's rendezvous answer
RENDEZVOUS_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class GuestOutcome:
    """One offer's fate: ``error`` when the rendezvous failed; ``answer`` declined; or
    ``answer`` accepted and ``run`` the local rank's records."""

    answer: Answer | None = None
    error: RendezvousError | None = None
    run: WorkerRun | None = None


def guest_probe(
    peer: tuple[str, int],
    *,
    secret: bytes,
    node_id: str,
    offer: Offer,
    make_spec: Callable[[str, int], WorkerSpec],
    launcher: Launcher,
    deadline_seconds: float,
    rendezvous_timeout: float = RENDEZVOUS_TIMEOUT_SECONDS,
    abort: threading.Event | None = None,
    expected_host_id: str | None = None,
    busy_retries: int = 0,
    retry_seconds: float = 1.0,
) -> GuestOutcome:
    """Propose ``offer`` to the host at ``peer``; if accepted, run rank 1 (the spec
    ``make_spec(master_addr, master_port)``) against the host's store.

    A ``gpu_busy`` decline is proposed again up to ``busy_retries`` times, ``retry_seconds``
    apart: the host's rank of the previous probe may still be exiting and hold its GPU for a
    moment after ours has."""
    host, port = peer
    waiter = abort or threading.Event()
    for attempt in range(busy_retries + 1):
        try:
            answer = propose(
                host,
                port,
                secret,
                node_id,
                offer,
                rendezvous_timeout,
                expected_host_id=expected_host_id,
            )
        except RendezvousError as exc:
            return GuestOutcome(error=exc)
        if answer.accepted or answer.reason != "gpu_busy" or attempt == busy_retries:
            break
        if waiter.wait(retry_seconds):
            break
    if not answer.accepted or answer.master_addr is None or answer.master_port is None:
        return GuestOutcome(answer=answer)
    addr = host if is_unspecified(answer.master_addr) else answer.master_addr
    spec = make_spec(addr, answer.master_port)
    run = launcher([spec], deadline_seconds=deadline_seconds, abort=abort)
    return GuestOutcome(answer=answer, run=run)
