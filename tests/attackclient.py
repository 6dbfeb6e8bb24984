"""What the attack clients for tests and benchmarks share (tests/slowloris.py,
tests/healthflood.py, tests/wrongpass.py, run as scripts: they import this by their folder):
a set of connections from several source addresses, each started once and reopened until the
attack stops; ``ready`` printed once each was tried; held until SIGTERM or the duration."""

from __future__ import annotations

import asyncio
import resource
import signal
import time
from collections.abc import Callable, Coroutine, Sequence


def raise_fd_limit(need: int) -> None:
    """Raise the soft RLIMIT_NOFILE towards ``need`` (never above the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


class Connections:
    """``per_source`` connections from each of ``sources``; a subclass's ``one(source, i,
    deadline)`` runs connection ``i`` of ``source`` until ``deadline`` or :attr:`stopping`,
    calling :meth:`tried` after its first attempt (connected or failed)."""

    def __init__(self, sources: Sequence[str], per_source: int) -> None:
        self.sources = list(sources)
        self.per_source = per_source
        self.total = per_source * len(self.sources)
        self.attempted = 0
        self.stopping = False
        self.ready = asyncio.Event()

    def tried(self) -> None:
        self.attempted += 1
        if self.attempted == self.total:
            self.ready.set()

    async def attack(
        self, one: Callable[[str, int, float], Coroutine[object, object, None]], duration: float
    ) -> None:
        """Run every connection; print ``ready`` once each was tried; hold them until
        SIGTERM or ``duration`` seconds, then set :attr:`stopping` and cancel them."""
        deadline = time.monotonic() + duration
        tasks = [
            asyncio.create_task(one(source, i, deadline))
            for source in self.sources
            for i in range(self.per_source)
        ]

        async def announce() -> None:
            await self.ready.wait()
            print("ready", flush=True)

        announcer = asyncio.create_task(announce())
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait([stopper], timeout=duration)
        self.stopping = True
        for task in [*tasks, announcer, stopper]:
            task.cancel()
        await asyncio.gather(*tasks, announcer, stopper, return_exceptions=True)
