"""Membership sources: peers file parsing, reload on change, last good list kept."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from agent.core.errors import ConfigError
from agent.probe.schedule.membership import (
    MembershipSource,
    PeersFile,
    StaticMembers,
    normalize_host,
    parse_peers,
)

GOOD = [
    ("", ()),
    ("# only a comment\n\n   \n", ()),
    ("node-b\nnode-a\n", ("node-a", "node-b")),
    ("node-a\nnode-a\nNODE-A\nnode-a.\n", ("node-a",)),
    ("node-a slots=8\nnode-b slots=8 max_slots=8\n", ("node-a", "node-b")),
    ("node-a:8\n", ("node-a",)),
    ("node-a  # rack 3\n\t node-b\t\n", ("node-a", "node-b")),
    ("10.0.0.7\n10.0.0.12\n", ("10.0.0.12", "10.0.0.7")),
    ("fe80::1\n[fe80::1]\nfe80:0:0::1\n", ("fe80::1",)),
    ("fe80::1%ib0 slots=8\n", ("fe80::1%ib0",)),
    ("2001:db8::1\n", ("2001:db8::1",)),
    ("gpu-node-001.cluster.local\n", ("gpu-node-001.cluster.local",)),
    ("node_a\r\nnode-b\r\n", ("node-b", "node_a")),
]


@pytest.mark.parametrize(("text", "hosts"), GOOD)
def test_parse_peers(text: str, hosts: tuple[str, ...]) -> None:
    assert parse_peers(text) == hosts


BAD = [
    ("node-a node-b\n", "line 1: unexpected 'node-b' after the host"),
    ("node-a\nnode-b slots\n", "line 2: unexpected 'slots' after the host"),
    ("node a=1=2 x\n", "line 1: unexpected 'x' after the host"),
    ("-node\n", "line 1: '-node' is not a valid host name"),
    ("node..a\n", "line 1: 'node..a' is not a valid host name"),
    ("10.0.0.256\n", "line 1: '10.0.0.256' is not a valid IPv4 address"),
    ("fe80::zz\n", "line 1: 'fe80::zz' is not a valid IP address"),
    ("[node-a]\n", "line 1: '[node-a]' is not a valid IP address"),
    ("node-a:eight\n", "line 1: 'node-a:eight' is not a valid IP address"),
    ("n\u00f6de\n", "line 1: 'n\u00f6de' is not a valid host name"),
    ("a" * 64 + "\n", f"line 1: '{'a' * 64}' is not a valid host name"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_parse_peers_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_peers(text)
    assert str(err.value) == message


def test_normalize_host_keeps_long_but_legal_names() -> None:
    name = ".".join(["a" * 63] * 3) + "." + "b" * 61  # 253 characters
    assert normalize_host(name.upper()) == name
    with pytest.raises(ValueError):
        normalize_host(name + "b")


def test_static_members_are_sorted_deduplicated_and_checked() -> None:
    source: MembershipSource = StaticMembers(["node-b", "node-a", " Node-B ", "::1"])
    assert source.members() == ("::1", "node-a", "node-b")
    with pytest.raises(ConfigError, match="probe peers: 'bad host' is not a valid host name"):
        StaticMembers(["node-a", "bad host"])


def write(path: Path, text: str, mtime_ns: int) -> None:
    """Write, then set an explicit mtime so changes never hide inside one clock tick."""
    path.write_text(text)
    os.utime(path, ns=(mtime_ns, mtime_ns))


T0 = 1_700_000_000_000_000_000
SECOND = 1_000_000_000


def test_peers_file_reloads_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "peers"
    write(path, "node-a\nnode-b\n", T0)
    source = PeersFile(str(path))
    assert source.members() == ("node-a", "node-b")
    write(path, "node-a\nnode-c\n", T0 + SECOND)
    assert source.members() == ("node-a", "node-c")
    assert (source.errors_total, source.healthy) == (0, True)


def test_peers_file_reloads_on_same_mtime_when_size_changes(tmp_path: Path) -> None:
    path = tmp_path / "peers"
    write(path, "node-a\n", T0)
    source = PeersFile(str(path))
    assert source.members() == ("node-a",)
    write(path, "node-a\nnode-bb\n", T0)
    assert source.members() == ("node-a", "node-bb")


def test_peers_file_replaced_by_rename_is_reloaded(tmp_path: Path) -> None:
    path = tmp_path / "peers"
    write(path, "node-a\n", T0)
    source = PeersFile(str(path))
    assert source.members() == ("node-a",)
    new = tmp_path / "peers.new"
    write(new, "node-b\n", T0)  # same size and mtime: only the inode differs
    new.replace(path)
    assert source.members() == ("node-b",)


def test_an_unchanged_file_is_not_parsed_again(tmp_path: Path) -> None:
    path = tmp_path / "peers"
    write(path, "node-a\n", T0)
    source = PeersFile(str(path))
    assert source.members() == ("node-a",)
    # same size, mtime and inode: a rewrite that stat cannot see is not re-read
    with open(path, "r+") as f:
        f.write("node-z\n")
    os.utime(path, ns=(T0, T0))
    assert source.members() == ("node-a",)


def test_a_malformed_file_keeps_the_last_good_list(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent.probe.schedule.membership")
    path = tmp_path / "peers"
    write(path, "node-a\nnode-b\n", T0)
    source = PeersFile(str(path))
    assert source.members() == ("node-a", "node-b")

    write(path, "node-a\nnode-b node-c\n", T0 + SECOND)
    for _ in range(3):
        assert source.members() == ("node-a", "node-b")
    assert (source.errors_total, source.healthy) == (1, False)

    write(path, "node-a\n???\n", T0 + 2 * SECOND)  # another bad version: counted, not logged
    assert source.members() == ("node-a", "node-b")
    assert source.errors_total == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"peers file {path}: line 2: unexpected 'node-c' after the host; "
        "keeping the last good list (2 members)"
    ]

    write(path, "node-c\n", T0 + 3 * SECOND)
    assert source.members() == ("node-c",)
    assert (source.errors_total, source.healthy) == (2, True)
    assert f"peers file {path} is good again: 1 members" in caplog.messages


def test_a_missing_or_unreadable_file_keeps_the_last_good_list(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "peers"
    write(path, "node-a\n", T0)
    source = PeersFile(str(path))
    assert source.members() == ("node-a",)
    path.unlink()
    for _ in range(3):
        assert source.members() == ("node-a",)
    assert source.errors_total == 1  # one spell of absence, counted once
    path.mkdir()  # now present but unreadable as a file
    assert source.members() == ("node-a",)
    assert source.errors_total == 1
    assert sum(r.levelno == logging.WARNING for r in caplog.records) == 1
    path.rmdir()
    write(path, "node-b\n", T0)
    assert source.members() == ("node-b",)
    assert source.healthy


def test_a_file_absent_from_the_start_gives_no_members(tmp_path: Path) -> None:
    source = PeersFile(str(tmp_path / "not-yet"))
    assert source.members() == ()
    assert (source.errors_total, source.healthy) == (1, False)


def test_a_binary_file_is_malformed(tmp_path: Path) -> None:
    path = tmp_path / "peers"
    path.write_bytes(b"node-a\n\xff\xfe\n")
    source = PeersFile(str(path))
    assert source.members() == ()
    assert source.errors_total == 1
