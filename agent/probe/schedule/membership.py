"""Membership sources: which nodes take part in cross-node probes.

A source answers one question, :meth:`MembershipSource.members`: the sorted, de-duplicated
host names (or IP literals) of the current members. The schedule pairs them up; this module
does not know about pairing.

- :class:`StaticMembers`: a fixed list (tests, ``--probe.peers`` on the command line).
- :class:`PeersFile`: a hostfile, re-read when it changes (a Kubernetes source comes later).

Peers file format, one host per line, as in Slurm / MPI / DeepSpeed hostfiles::

    # comment                 ignored, as is everything after '#' on any line
    node-a01 slots=8          key=value suffixes (slots, max_slots, ...) ignored
    node-a02:8                MPICH "host:count" ignored after the colon
    10.0.0.7
    fe80::1%ib0               IPv6 literal, optionally in brackets: [fe80::1]

Hosts are compared case-insensitively (lower-cased) and IP literals in canonical form, so
``Node-A01`` and ``node-a01``, or ``::0:1`` and ``::1``, are the same member. Any other
token on a line makes the whole file malformed: the source keeps its last good list.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import threading
from collections.abc import Iterable
from typing import Protocol

from agent.core.errors import ConfigError

log = logging.getLogger(__name__)

_LABEL = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$")
_SUFFIX = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S*$")
_MPICH = re.compile(r"^([^:\s]+):[0-9]+$")


class MembershipSource(Protocol):
    """Where the probe learns the current members. Must not raise."""

    def members(self) -> tuple[str, ...]:
        """The current members: sorted, de-duplicated, normalised host names."""
        ...


def normalize_host(token: str) -> str:
    """One host token -> its canonical form; ValueError saying why if it is not a host.

    Accepts an IPv4 or IPv6 literal (IPv6 optionally in brackets, with a ``%zone``) or an
    RFC 1123 host name (underscores tolerated); returns IP literals in canonical form and
    names lower-cased.
    """
    text = token[1:-1] if token.startswith("[") and token.endswith("]") else token
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    if token != text or ":" in text:
        raise ValueError(f"{token!r} is not a valid IP address")
    name = text.lower().removesuffix(".")
    labels = name.split(".")
    if not name or len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise ValueError(f"{token!r} is not a valid host name")
    if all(label.isdigit() for label in labels):
        raise ValueError(f"{token!r} is not a valid IPv4 address")
    return name


def parse_peers(text: str) -> tuple[str, ...]:
    """A peers file's text -> sorted, de-duplicated hosts. ValueError naming the line."""
    hosts: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        tokens = raw.split("#", 1)[0].split()
        if not tokens:
            continue
        head, rest = tokens[0], tokens[1:]
        bad = [t for t in rest if not _SUFFIX.match(t)]
        if bad:
            raise ValueError(f"line {number}: unexpected {bad[0]!r} after the host")
        mpich = _MPICH.match(head)
        if mpich:
            head = mpich.group(1)
        try:
            hosts.add(normalize_host(head))
        except ValueError as exc:
            raise ValueError(f"line {number}: {exc}") from None
    return tuple(sorted(hosts))


class StaticMembers:
    """A fixed membership. ConfigError if any host is invalid."""

    def __init__(self, hosts: Iterable[str]) -> None:
        try:
            self._members = tuple(sorted({normalize_host(h.strip()) for h in hosts}))
        except ValueError as exc:
            raise ConfigError(f"probe peers: {exc}") from None

    def members(self) -> tuple[str, ...]:
        return self._members


_FileKey = tuple[int, int, int, int]


class PeersFile:
    """A hostfile, re-read whenever its mtime, size or inode changes.

    A missing, unreadable or malformed version keeps the last good list (empty before the
    first good read), counts one error per bad version in :attr:`errors_total` and logs one
    warning until the file is good again. ``members()`` never raises.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._members: tuple[str, ...] = ()
        self._key: _FileKey | None = None
        self._errors_total = 0
        self._failing = False
        self._ever_good = False

    @property
    def errors_total(self) -> int:
        """Bad versions of the file seen so far (missing, unreadable or malformed)."""
        with self._lock:
            return self._errors_total

    @property
    def healthy(self) -> bool:
        """True when the latest version of the file was read and parsed."""
        with self._lock:
            return self._ever_good and not self._failing

    def members(self) -> tuple[str, ...]:
        with self._lock:
            self._refresh()
            return self._members

    def _refresh(self) -> None:
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                key = (st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)
                if key == self._key:
                    return
                data = f.read()
        except OSError as exc:
            self._fail(exc.strerror or type(exc).__name__, None)
            return
        try:
            hosts = parse_peers(data.decode("utf-8"))
        except UnicodeDecodeError:
            self._fail("not UTF-8 text", key)
            return
        except ValueError as exc:
            self._fail(str(exc), key)
            return
        self._key = key
        if self._failing:
            log.info("peers file %s is good again: %d members", self.path, len(hosts))
        elif not self._ever_good or hosts != self._members:
            log.info("peers file %s: %d members", self.path, len(hosts))
        self._failing = False
        self._ever_good = True
        self._members = hosts

    def _fail(self, why: str, key: _FileKey | None) -> None:
        """Count one bad version: each malformed version (``key``) once, and an unreadable
        file (``key`` None) once per spell; warn on the way into failing, not after."""
        if key is None and self._failing and self._key is None:
            return
        self._key = key
        self._errors_total += 1
        level = logging.DEBUG if self._failing else logging.WARNING
        log.log(
            level,
            "peers file %s: %s; keeping the last good list (%d members)",
            self.path,
            why,
            len(self._members),
        )
        self._failing = True
