"""A ``/healthz`` flood for tests and benchmarks: many keep-alive connections from many
source addresses, each sending ``GET /healthz`` back to back (the next as soon as the
answer arrived), reconnecting at once when the server closes one.

    python tests/healthflood.py --port P [--host 127.0.0.1] --source 127.0.1.1 ...
        [--connections 16] [--duration 12]

Prints ``ready`` once every connection was tried once, and a JSON summary at the end:
``answers`` by status code, ``opened`` connections, ``errors``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from attackclient import Connections, raise_fd_limit  # this script's folder: run as a script

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: x\r\nUser-Agent: healthflood\r\n\r\n"


class Flood(Connections):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args.source, args.connections)
        self.args = args
        self.stats: dict[str, int] = {"opened": 0, "errors": 0}
        self.answers: dict[str, int] = {}

    async def one(self, source: str, _: int, deadline: float) -> None:
        first = True
        while time.monotonic() < deadline and not self.stopping:
            writer = None
            try:
                reader, writer = await asyncio.open_connection(
                    self.args.host, self.args.port, local_addr=(source, 0)
                )
                self.stats["opened"] += 1
                if first:
                    first = False
                    self.tried()
                while not self.stopping:
                    writer.write(REQUEST)
                    await writer.drain()
                    head = await reader.readuntil(b"\r\n\r\n")
                    status = head.split(b" ", 2)[1].decode()
                    self.answers[status] = self.answers.get(status, 0) + 1
                    length = 0
                    for line in head.split(b"\r\n"):
                        if line.lower().startswith(b"content-length:"):
                            length = int(line.split(b":", 1)[1])
                    await reader.readexactly(length)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                self.stats["errors"] += 1
                await asyncio.sleep(0.01)
            finally:
                if first:
                    first = False
                    self.tried()
                if writer is not None:
                    writer.transport.abort()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--source", action="append", required=True)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--duration", type=float, default=12.0)
    args = ap.parse_args(argv)
    raise_fd_limit(args.connections * len(args.source) + 64)
    flood = Flood(args)
    asyncio.run(flood.attack(flood.one, args.duration))
    print(json.dumps({**flood.stats, "answers": flood.answers}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
