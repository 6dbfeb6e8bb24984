"""RTM_GETLINK questions over pyroute2's synchronous netlink socket (``IPRSocket``), its
own message classes encoding each question and decoding each answer.

pyroute2's ``IPRoute`` answers the same question through an asyncio event loop it creates
for the socket: 0.65 ms a link on the development machine, against 0.37 ms here, and 0.33
against 0.23 ms to open and close (the netdev sampler asks once per RDMA netdev per pass).
Imports pyroute2 (via :mod:`agent.netdev.netlink`) and the standard library only.
"""

from __future__ import annotations

from agent.netdev.netlink import (
    NLM_F_DUMP,
    NLM_F_REQUEST,
    NLMSG_DONE,
    RTM_GETLINK,
    IPRSocket,
    ifinfmsg,
    release,
)

#: bytes read per datagram: a link dump's datagrams are a few pages (pyroute2 reads 16 KiB)
RECV_BYTES = 65536


class LinkSocket:
    """A netlink route socket in ``netns`` (``None``: the caller's namespace; a name under
    ``/var/run/netns`` or a path otherwise, never created), bound to no multicast group: it
    receives only the answers to its own questions. One thread at a time."""

    def __init__(self, netns: str | None = None) -> None:
        if netns is None:
            self._sock = IPRSocket(groups=0)
        else:
            self._sock = IPRSocket(groups=0, netns=netns, flags=0)
        self._seq = 0

    def get_links(self) -> list[ifinfmsg]:
        """Every link of the namespace (one dump)."""
        return self._ask(NLM_F_REQUEST | NLM_F_DUMP, [])

    def link(self, command: str, *, ifname: str) -> list[ifinfmsg]:
        """``command`` "get": the link named ``ifname`` (raises pyroute2's ``NetlinkError``,
        ``code`` ENODEV, when there is none)."""
        if command != "get":
            raise ValueError(f"LinkSocket only gets links, not {command!r}")
        return self._ask(NLM_F_REQUEST, [("IFLA_IFNAME", ifname)])

    def close(self) -> None:
        self._sock.close()

    def _ask(self, flags: int, attrs: list[tuple[str, object]]) -> list[ifinfmsg]:
        self._seq += 1
        question = ifinfmsg()
        question["family"] = 0
        question["attrs"] = attrs
        self._sock.put(question, msg_type=RTM_GETLINK, msg_flags=flags, msg_seq=self._seq)
        release(question)
        answers: list[ifinfmsg] = []
        while True:
            for msg in self._sock.marshal.parse(self._sock.socket.recv(RECV_BYTES)):
                header = msg["header"]
                if header["sequence_number"] != self._seq:
                    release(msg)
                    continue  # an answer to an earlier question, left unread when it failed
                error = header.get("error")
                if error is not None:
                    release(msg)
                    # NetlinkError, decoded from the kernel's NLMSG_ERROR. Neither the message
                    # (pyroute2's parsed messages are reference cycles) nor this frame (which
                    # the traceback holds) keeps it: the error, its traceback and the frames
                    # are freed when the caller is done with it, not by the cycle collector
                    header["error"] = None
                    del msg, header
                    try:
                        raise error
                    finally:
                        del error
                if header["type"] == NLMSG_DONE:
                    release(msg)
                    return answers
                answers.append(msg)
                if not flags & NLM_F_DUMP:
                    return answers  # a get is answered by one message


__all__ = ["RECV_BYTES", "LinkSocket"]
