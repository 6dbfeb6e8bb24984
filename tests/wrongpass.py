"""A password-flooding client for tests: keep-alive connections from several source
addresses, each sending ``GET /metrics`` with a wrong password (a fresh one every request,
so nothing can be cached) as fast as the server answers, reconnecting when it closes.

    python tests/wrongpass.py --port P [--host 127.0.0.1] [--host6 ::1] --source 127.0.0.2
        [--source fd31:0:0:1::2 ...] [--connections 16] [--user prometheus] [--duration 12]

Runs ``--duration`` seconds or until SIGTERM. Prints ``ready`` once every connection has had
a first answer (or failed once), and a JSON summary at the end: for each source address the
requests sent and the answers by status code, plus ``errors`` (connections that failed or
were closed: a server may close some to make room for others).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import secrets
import sys
import time
from collections import Counter

from attackclient import Connections  # this script's folder (tests/): run as a script


class Flood(Connections):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args.source, args.connections)
        self.args = args
        self.statuses: dict[str, Counter[str]] = {s: Counter() for s in args.source}
        self.sent: Counter[str] = Counter()
        self.errors = 0

    def _request(self) -> bytes:
        token = base64.b64encode(f"{self.args.user}:{secrets.token_hex(8)}".encode()).decode()
        return (
            f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {token}\r\n\r\n"
        ).encode()

    async def one(self, source: str, _: int, deadline: float) -> None:
        first = True
        while time.monotonic() < deadline and not self.stopping:
            writer = None
            try:
                host = self.args.host6 if ":" in source else self.args.host
                reader, writer = await asyncio.open_connection(
                    host, self.args.port, local_addr=(source, 0)
                )
                while not self.stopping:
                    writer.write(self._request())
                    await writer.drain()
                    self.sent[source] += 1
                    head = await reader.readuntil(b"\r\n\r\n")
                    status = head.split(b" ", 2)[1].decode()
                    length = 0
                    for line in head.split(b"\r\n"):
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value)
                    await reader.readexactly(length)
                    self.statuses[source][status] += 1
                    if first:
                        first = False
                        self.tried()
                    if b"connection: close" in head.lower():
                        break
            except (OSError, EOFError, asyncio.IncompleteReadError, ValueError):
                self.errors += 1
                await asyncio.sleep(0.01)
            finally:
                if first:
                    first = False
                    self.tried()
                if writer is not None:
                    writer.transport.abort()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1", help="the server, for IPv4 sources")
    ap.add_argument("--host6", default="::1", help="the server, for IPv6 sources")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--source", action="append", required=True, help="repeatable")
    ap.add_argument("--connections", type=int, default=16, help="per source address")
    ap.add_argument("--user", default="prometheus")
    ap.add_argument("--duration", type=float, default=12.0, help="seconds")
    args = ap.parse_args(argv)
    flood = Flood(args)
    asyncio.run(flood.attack(flood.one, args.duration))
    summary = {s: dict(c) for s, c in flood.statuses.items()}
    print(
        json.dumps({"sent": dict(flood.sent), "statuses": summary, "errors": flood.errors}),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
