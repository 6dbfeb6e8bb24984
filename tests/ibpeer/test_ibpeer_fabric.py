"""The fabric map of the ibpeer sampler without a simulator: which uplinks a host reads
(agent/ibpeer/fabric.py, pure), and the sampler's schedule, replaying the tool answers
recorded on a simulated rail-optimised fat tree (tests/fixtures/ibpeer-sim-dgx: an 8-HCA
host under 8 leaves, 4 spines); hostile answers injected through the same tool seam."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

from agent.core.errors import NoData
from agent.core.sysfs import SysfsReader
from agent.core.tools import ToolError, ToolOutput
from agent.ibpeer.fabric import SwitchLink, SwitchTable, assigned_uplinks, readers
from agent.ibpeer.sampler import IbPeerSampler
from agent.infiniband.perfquery import parse_perfquery_ports, split_blocks
from tests.ibsim_fabric import write_host

RECORDING = Path(__file__).parent.parent / "fixtures" / "ibpeer-sim-dgx" / "recording.json"
DEVICES = ("mlx5_0", "mlx5_10", "mlx5_11", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9")

Hook = Callable[[tuple[str, ...], str], str]


class Replay:
    """Answers from the recording; ``hook(argv, answer)`` may rewrite an answer or raise.
    ``perfquery -l LID P1,P2`` is answered port by port from the recorded blocks, whatever
    the list (a pass before the tables are read asks for fewer ports)."""

    def __init__(self, hook: Hook | None = None) -> None:
        doc = json.loads(RECORDING.read_text())
        self.answers = {tuple(c["argv"]): c["stdout"] for c in doc["calls"]}
        self.blocks: dict[tuple[str, bool, int], str] = {}
        for argv, out in self.answers.items():
            if argv[0] == "perfquery":
                lid, extended = argv[-2], "-x" in argv
                for block in split_blocks(out):
                    port = int(block.split("port ", 1)[1].split(" ", 1)[0])
                    self.blocks[(lid, extended, port)] = block
        self.calls: Counter[str] = Counter()
        self.hook = hook

    def _perfquery(self, argv: tuple[str, ...]) -> str | None:
        lid, extended = argv[-2], "-x" in argv
        got = [self.blocks.get((lid, extended, int(p))) for p in argv[-1].split(",")]
        return None if None in got else "\n".join(b for b in got if b) + "\n"

    def __call__(
        self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None
    ) -> ToolOutput:
        key = tuple(argv)
        self.calls[argv[0] if argv[0] == "perfquery" else f"smpquery {argv[8]}"] += 1
        out = self._perfquery(key) if argv[0] == "perfquery" else self.answers.get(key)
        if out is None:
            raise ToolError("io", f"not recorded: {' '.join(argv)}")
        if self.hook is not None:
            out = self.hook(key, out)
        return ToolOutput(out, 0.0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def host(tmp_path: Path) -> Path:
    return write_host(tmp_path / "dgx", "dgx", DEVICES)


def sampler(host: Path, replay: Replay, clock: Clock, **kw: object) -> IbPeerSampler:
    return IbPeerSampler(SysfsReader(str(host / "sys")), tool=replay, clock=clock, **kw)  # type: ignore[arg-type]


# --- who reads which uplink (pure) ----------------------------------------------------------


def table(hosts: int, uplinks: int, guid: str = "0x0000000000200000") -> SwitchTable:
    links = [SwitchLink(k + 1, f"0x{0x100000 + k:016x}", "CA", 1) for k in range(hosts)]
    links += [
        SwitchLink(hosts + k + 1, f"0x{0x300000 + k:016x}", "switch", 1) for k in range(uplinks)
    ]
    return SwitchTable(guid, hosts + uplinks, tuple(links), 0.0)


@pytest.mark.parametrize(("hosts", "uplinks"), [(32, 32), (4, 4), (32, 16), (3, 7), (1, 5)])
def test_uplinks_are_dealt_evenly(hosts: int, uplinks: int) -> None:
    t = table(hosts, uplinks)
    by = readers(t)
    assert sorted(by) == [u.port for u in t.uplinks]
    load = Counter(by.values())
    assert max(load.values()) - min(load.values(), default=0) <= 1
    assert max(load.values()) == -(-uplinks // hosts)
    # every host computes the same: the table's order does not matter
    shuffled = SwitchTable(t.guid, t.num_ports, tuple(reversed(t.links)), 5.0)
    assert readers(shuffled) == by


def test_each_leaf_deals_differently() -> None:
    """The ranking is by (leaf, CA): the CA that reads first on one leaf does not on all."""
    firsts = {readers(table(8, 1, f"0x{0x200000 + i:016x}"))[9] for i in range(32)}
    assert len(firsts) > 1


def test_a_host_gets_its_share_and_no_more_than_its_limit() -> None:
    t = table(4, 8)
    by = readers(t)
    own = frozenset({by[5]})
    mine = assigned_uplinks(t, own, limit=8)
    assert [u.port for u in mine] == sorted(p for p, h in by.items() if h in own)
    assert len(mine) == 2
    assert len(assigned_uplinks(t, own, limit=1)) == 1
    assert assigned_uplinks(t, own, limit=0) == ()
    assert assigned_uplinks(t, frozenset({"0xdead"}), limit=8) == ()


# --- the schedule, on replayed answers ---------------------------------------------------------


def test_one_once_pass_maps_every_cable_and_the_hosts_share_of_uplinks(host: Path) -> None:
    replay = Replay()
    snap = sampler(host, replay, Clock(), tables_per_pass=64, spread=False).sample()
    assert snap.issues == ()
    assert len(snap.ports) == 8
    assert all(p.peer is not None and p.peer.node_type == "switch" for p in snap.ports)
    assert len({p.peer.guid for p in snap.ports if p.peer}) == 8  # rail-optimised: 8 leaves
    # 4 hosts' HCAs under each leaf and 4 uplinks: one each, both ends read
    assert len(snap.uplinks) == 8
    assert len({u.switch_guid for u in snap.uplinks}) == 8
    for u in snap.uplinks:
        assert u.peer_description and u.peer_description.startswith("spine")
        assert u.counters and u.peer_counters
    # one perfquery per switch: 8 leaves, 4 spines
    assert replay.calls["perfquery"] == 12


def test_passes_spread_the_work_and_reuse_what_they_know(host: Path) -> None:
    replay = Replay()
    clock = Clock()
    s = sampler(host, replay, clock, topology_interval=900.0)
    first = s.sample()
    assert first.topology_read and first.uplinks == ()  # neighbours first, no table yet
    assert replay.calls["smpquery nodeinfo"] == 8 and replay.calls["perfquery"] == 8
    tables = []
    for _ in range(8):  # one leaf's table a pass
        clock.now += 60
        replay.calls.clear()
        tables.append(s.sample())
    assert [len(t.uplinks) for t in tables] == list(range(1, 9))
    clock.now += 60
    replay.calls.clear()
    counters = s.sample()
    assert not counters.topology_read
    assert dict(replay.calls) == {"perfquery": 12}  # the counters only
    assert counters.tool_calls == 12
    # the topology interval: neighbours again, their description and LID not asked again
    clock.now += 900
    replay.calls.clear()
    again = s.sample()
    assert again.topology_read
    assert replay.calls["smpquery nodedesc"] == 0
    assert replay.calls["smpquery portinfo"] == 16  # each port's local and far PortInfo
    assert len(again.uplinks) == 8


def test_a_port_that_went_down_and_up_rereads_the_topology_at_once(host: Path) -> None:
    clock = Clock()
    replay = Replay()
    s = sampler(host, replay, clock, uplinks_max=0)  # no tables: counters-only passes
    assert s.sample().topology_read
    clock.now += 60
    assert not s.sample().topology_read
    (host / "sys/class/infiniband/mlx5_4/ports/1/counters/link_downed").write_text("1\n")
    clock.now += 60
    replay.calls.clear()
    assert s.sample().topology_read  # long before the 5 minutes
    assert replay.calls["smpquery nodeinfo"] == 8


def test_a_failed_counter_query_rereads_the_topology(host: Path) -> None:
    fail = {"on": True}

    def hook(argv: tuple[str, ...], out: str) -> str:
        if fail["on"] and argv[0] == "perfquery" and argv[2] == "mlx5_3":
            raise ToolError("io", "perfquery failed (255): ibwarn: mad_rpc failed")
        return out

    clock = Clock()
    s = sampler(host, Replay(hook), clock, uplinks_max=0)
    snap = s.sample()
    bad = next(p for p in snap.ports if p.device == "mlx5_3")
    assert bad.peer is not None and bad.peer_counters == ()
    assert [i.reason for i in snap.issues] == ["io"]
    fail["on"] = False
    clock.now += 60
    healed = s.sample()
    assert healed.topology_read  # a LID may have moved: who is where is read again
    assert next(p for p in healed.ports if p.device == "mlx5_3").peer_counters


def test_without_the_umad_device_there_is_no_data(host: Path) -> None:
    def hook(argv: tuple[str, ...], out: str) -> str:
        raise ToolError(
            "io", "smpquery failed (255): ibwarn: [7] mad_rpc_open_port: can't open UMAD port"
        )

    with pytest.raises(NoData, match="cannot open the umad device"):
        sampler(host, Replay(hook), Clock()).sample()


def test_without_the_tools_there_is_no_data(host: Path) -> None:
    s = IbPeerSampler(SysfsReader(str(host / "sys")), prefix=("/nonexistent/wrapper",))
    with pytest.raises(NoData, match="/nonexistent/wrapper not on PATH"):
        s.sample()


# --- hostile answers -----------------------------------------------------------------------


def _perf_hook(rewrite: Callable[[str], str]) -> Hook:
    def hook(argv: tuple[str, ...], out: str) -> str:
        return rewrite(out) if argv[0] == "perfquery" else out

    return hook


@pytest.mark.parametrize(
    ("name", "rewrite"),
    [
        ("garbage", lambda out: "\x00\xff not a perfquery answer\n" * 100),
        ("a port twice", lambda out: out + out),
        (
            "ports not asked",
            lambda out: out.replace(
                "PortSelect:......................1\n", "PortSelect:......................200\n"
            ),
        ),
        (
            "a huge value",
            lambda out: out.replace(
                "SymbolErrorCounter:..............0", "SymbolErrorCounter:.............." + "9" * 40
            ),
        ),
        ("too many blocks", lambda out: "# Port counters: x\nPortSelect:....1\n" * 300),
        ("empty", lambda out: ""),
    ],
)
def test_a_hostile_counter_answer_costs_that_switch_only(
    host: Path, name: str, rewrite: Callable[[str], str]
) -> None:
    snap = sampler(
        host, Replay(_perf_hook(rewrite)), Clock(), tables_per_pass=64, spread=False
    ).sample()
    assert len(snap.ports) == 8 and all(p.peer is not None for p in snap.ports)
    assert snap.issues, name
    assert {i.reason for i in snap.issues} <= {"parse"}


def test_a_switch_claiming_thousands_of_ports_is_read_as_an_iba_switch(host: Path) -> None:
    """NodeInfo NumPorts is 8 bits on the wire: a tool printing more printed garbage."""

    def hook(argv: tuple[str, ...], out: str) -> str:
        if argv[7:9] == ("-D", "nodeinfo") and argv[9].count(",") == 1:
            return out.replace(
                "NumPorts:........................8", "NumPorts:........................60000"
            )
        return out

    snap = sampler(host, Replay(hook), Clock(), tables_per_pass=1, spread=False).sample()
    assert {i.reason for i in snap.issues} == {"parse"}
    assert "NumPorts 60000 is not an 8-bit value" in snap.issues[0].detail
    assert len(snap.ports) == 8 and [p.peer for p in snap.ports].count(None) == 8


def test_split_blocks_and_ports() -> None:
    text = (
        "noise\n# a\nPortSelect:...1\nSymbolErrorCounter:...3\n"
        "# b\nPortSelect:...2\nSymbolErrorCounter:...4\n"
    )
    assert [b.splitlines()[0] for b in split_blocks(text)] == ["# a", "# b"]
    got = parse_perfquery_ports(text, extended=False)
    assert sorted(got) == [1, 2]
    with pytest.raises(ValueError, match="more than 2 blocks"):
        split_blocks(text + "# c\n", limit=2)
    with pytest.raises(ValueError, match="answered twice"):
        parse_perfquery_ports(
            text + "# c\nPortSelect:...2\nSymbolErrorCounter:...5\n", extended=False
        )
    with pytest.raises(ValueError, match="no perfquery block"):
        parse_perfquery_ports("nothing here\n", extended=False)


def test_fields_of_no_known_counter_are_capped_per_answer_and_per_node(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every perfquery block names 20 invented fields of its own: 16 are kept per answer, and
    over the node's ports at most NODE_UNKNOWN_FIELDS (lowered here: 8 ports of 32 fields
    only just reach the real 256), first ports first; the rest are counted per port."""
    from agent.ibpeer import sampler as ibpeer_sampler
    from agent.infiniband.perfquery import PERFQUERY_NAMES
    from exporter.metrics import ibpeer as ibpeer_metrics
    from exporter.metrics.spec import Families

    monkeypatch.setattr(ibpeer_sampler, "NODE_UNKNOWN_FIELDS", 100)

    def invent(argv: tuple[str, ...], out: str) -> str:
        if argv[0] != "perfquery":
            return out
        tag = "X" if "-x" in argv else "B"
        blocks = []
        for block in split_blocks(out):
            port = int(block.split("port ", 1)[1].split(" ", 1)[0])
            extra = "".join(f"\nZ{tag}{argv[-2]}p{port}n{i}:....{i}" for i in range(20))
            blocks.append(block.rstrip("\n") + extra)
        return "\n".join(blocks) + "\n"

    known = frozenset(PERFQUERY_NAMES.values())
    s = sampler(host, Replay(invent), Clock(), tables_per_pass=64, spread=False, extended=True)
    snap = s.sample()
    kept = [sum(c.name not in known for c in p.peer_counters) for p in snap.ports]
    assert kept == [32, 32, 32, 4, 0, 0, 0, 0]
    assert [p.fields_dropped for p in snap.ports] == [8, 8, 8, 36, 40, 40, 40, 40]
    assert [p.fields_dropped_total for p in snap.ports] == [p.fields_dropped for p in snap.ports]
    # an uplink end's unknown fields are no series: none kept, none counted
    assert snap.uplinks and all(
        c.name in known for u in snap.uplinks for c in (*u.counters, *u.peer_counters)
    )
    again = s.sample()
    assert [p.fields_dropped_total for p in again.ports] == [16, 16, 16, 72, 80, 80, 80, 80]
    out = Families("default")
    ibpeer_metrics.render(again, out)
    dropped = next(rows for spec, rows in out.items() if spec is ibpeer_metrics.FIELDS_DROPPED)
    assert sorted(v for _, v in dropped) == [16, 16, 16, 72, 80, 80, 80, 80]
    assert not any(spec is ibpeer_metrics.PEER_GENERIC for spec, _ in out.items())  # full only


def test_a_spine_is_read_by_the_reader_of_each_leafs_lowest_uplink_to_it() -> None:
    from agent.ibpeer.fabric import SwitchLink, SwitchTable, first_to_each
    from agent.ibpeer.records import Uplink
    from agent.ibpeer.spines import targets

    leaf = "0x0000000000000001"
    s1, s2 = "0x00000000000000a1", "0x00000000000000a2"
    table = SwitchTable(
        leaf,
        8,
        (
            SwitchLink(5, s1, "switch", 3),
            SwitchLink(6, s1, "switch", 4),
            SwitchLink(7, s2, "switch", 3),
            SwitchLink(1, "0x00000000000000c1", "CA", 1),
        ),
        0.0,
    )
    assert first_to_each(table) == {s1: 5, s2: 7}

    def up(port: int, spine: str) -> Uplink:
        return Uplink(leaf, "lf", 1, port, spine, 3, "sp", 2, ("mlx5_0", 1))

    # this node reads ports 6 (s1's second cable) and 7 (s2's first): it reads s2 only
    assert targets([up(6, s1), up(7, s2)], {leaf: table}) == {s2: (("mlx5_0", 1), 7)}
    assert targets([up(5, s1)], {leaf: table}) == {s1: (("mlx5_0", 1), 5)}
    assert targets([up(5, s1)], {}) == {}  # the leaf's table not read yet
