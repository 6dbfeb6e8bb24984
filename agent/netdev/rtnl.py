"""RTM_GETLINK questions over a plain netlink route socket, written and read by
:mod:`agent.netdev.linkmsg`.

pyroute2's ``IPRoute`` answers the same question through an asyncio event loop it creates for
the socket and decodes every attribute of each answer: 0.65 ms a link on the development
machine; its synchronous ``IPRSocket`` with its message classes 0.55 ms; this socket with the
answers read for the six attributes the sampler uses, about 0.06 ms (the netdev sampler asks
once per RDMA netdev per pass). Imports :mod:`agent.netdev.netlink` (pyroute2's ``setns`` and
``NetlinkError``) and the standard library only.
"""

from __future__ import annotations

from agent.netdev import linkmsg
from agent.netdev.netlink import NetlinkError, made_in, route_socket

#: bytes read per datagram: a link dump's datagrams are a few pages (pyroute2 reads 16 KiB)
RECV_BYTES = 65536


class LinkSocket:
    """A netlink route socket in ``netns`` (``None``: the caller's namespace; a name under
    ``/var/run/netns`` or a path otherwise, never created), bound to no multicast group: it
    receives only the answers to its own questions. One thread at a time."""

    def __init__(self, netns: str | None = None) -> None:
        self._sock = made_in(netns, route_socket)
        self._seq = 0

    def get_links(self) -> list[dict[str, object]]:
        """Every link of the namespace (one dump)."""
        return self._ask(None)

    def link(self, command: str, *, ifname: str) -> list[dict[str, object]]:
        """``command`` "get": the link named ``ifname`` (raises pyroute2's ``NetlinkError``,
        ``code`` ENODEV, when there is none). Each link as :func:`agent.netdev.linkmsg.answers`
        reads it. Raises ValueError on an answer that does not parse."""
        if command != "get":
            raise ValueError(f"LinkSocket only gets links, not {command!r}")
        return self._ask(ifname)

    def close(self) -> None:
        self._sock.close()

    def _ask(self, ifname: str | None) -> list[dict[str, object]]:
        self._seq += 1
        self._sock.send(linkmsg.question(self._seq, ifname))
        links: list[dict[str, object]] = []
        while True:
            for answer in linkmsg.answers(self._sock.recv(RECV_BYTES)):
                if answer.seq != self._seq:
                    continue  # an answer to an earlier question, left unread when it failed
                if answer.kind == "error":
                    if answer.error:
                        raise NetlinkError(answer.error)
                    continue  # an acknowledgement
                if answer.kind == "done":
                    return links
                if answer.link is not None:
                    links.append(answer.link)
                    if ifname is not None:
                        return links  # a get is answered by one message


__all__ = ["RECV_BYTES", "LinkSocket"]
