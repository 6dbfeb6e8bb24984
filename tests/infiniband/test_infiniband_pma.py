"""The infiniband sampler's PMA step (agent/infiniband/pma.py) with perfquery stood in for by
scripts that print real answers (tests/fixtures/ibpeer, values planted where said) or
hostile ones: huge, malformed, slow, about the wrong port or attribute, failing. Whatever
perfquery does, the pass ends within its budget, the sysfs counters are exported, a 64-bit
counter is never handed back to its narrow twin, and the port says why (the simulator's own
perfquery is in tests/test_infiniband_pma_sim.py)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from agent.core.sysfs import SysfsReader
from agent.infiniband.findings import findings
from agent.infiniband.pma import CAPS_RECHECK_SECONDS, PmaReader
from agent.infiniband.records import IbPort, InfinibandSnapshot
from agent.infiniband.sampler import InfinibandSampler
from exporter.metrics import infiniband as ib_metrics
from exporter.metrics.spec import Families
from tests.ib_port_tree import write_ib_port
from tests.infiniband import pma_standin

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "ibpeer"
P = "fabricscope_infiniband_port_"
U32 = 2**32 - 1
#: a kernel whose counters/ table is the extended one (64-bit data, unicast files)
EXTENDED_SYSFS = {
    "port_xmit_data": 1000,
    "port_rcv_data": 1000,
    "port_xmit_packets": 10,
    "port_rcv_packets": 10,
    "unicast_xmit_packets": 10,
    "unicast_rcv_packets": 10,
    "symbol_error": 65535,
    "link_downed": 0,
    "port_rcv_errors": 0,
    "port_xmit_wait": U32,
}


def port_tree(root: Path, dev: str, counters: dict[str, int], *, lid: int = 2) -> Path:
    """An ACTIVE InfiniBand port 1 of ``dev`` with these ``counters/`` files."""
    return write_ib_port(root, dev, counters, lid=lid)


def fake_perfquery(tmp: Path, body: str, name: str = "perfquery-standin") -> Path:
    """A command prefix that stands in for perfquery: a shell script given perfquery's argv
    (``perfquery -C DEV -P PORT -t MS [-x|-r] LID PORT [MASK]``) after its own name."""
    script = tmp / name
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def answer(name: str, **planted: int) -> str:
    """A real perfquery answer from the fixtures with ``planted`` field values set."""
    lines = []
    for line in (FIX / name).read_text().splitlines():
        field = line.split(":", 1)[0]
        value = planted.get(field)
        lines.append(line if value is None else f"{field}:{'.' * (33 - len(field))}{value}")
    return "\n".join(lines) + "\n"


def sampler(root: Path, prefix: Path | None, **kwargs: object) -> InfinibandSampler:
    pma = PmaReader(
        SysfsReader(root),
        mode=str(kwargs.pop("mode", "on")),
        prefix=(str(prefix),) if prefix else (),
        tool_timeout=float(kwargs.pop("tool_timeout", 5.0)),  # type: ignore[arg-type]
        **kwargs,  # type: ignore[arg-type]
    )
    return InfinibandSampler(SysfsReader(root), pma=pma)


def port(snap: InfinibandSnapshot, dev: str = "mlx5_0") -> IbPort:
    return next(p for d in snap.devices if d.name == dev for p in d.ports)


def counters(p: IbPort) -> dict[str, tuple[int, int | None]]:
    return {c.name: (c.value, c.width) for c in p.counters if c.source == "counters"}


def rendered(
    snap: InfinibandSnapshot, detail: str = "default"
) -> dict[tuple[str, tuple[str, ...]], float]:
    out = Families(detail)  # type: ignore[arg-type]
    ib_metrics.render(snap, out)
    return {(s.name, labels): v for s, samples in out.items() for labels, v in samples}


# -- 64-bit where the PMA keeps them ---------------------------------------------------------


def test_64bit_error_counters_replace_their_stuck_sysfs_twins_and_never_fall_back(
    tmp_path: Path,
) -> None:
    """A PMA advertising the additional extended counters (CapMask2 0x2, the rhel75 answer
    with PortXmitWait and SymbolErrorCounter planted past their PortCounters widths): the
    64-bit values are exported under the usual names while sysfs sits at 2^32-1 and 2^16-1;
    when perfquery then fails, those counters are absent, never their stuck twins."""
    port_tree(tmp_path / "sys", "mlx5_0", EXTENDED_SYSFS)
    good = answer(
        "perfquery-x-ext-errors-rhel75.txt", PortXmitWait=5_000_000_000, SymbolErrorCounter=70_000
    )
    (tmp_path / "answer").write_text(good)
    tool = fake_perfquery(
        tmp_path,
        f"[ -e {tmp_path}/broken ] && {{ echo 'ibwarn: mad_rpc failed' >&2; exit 1; }}\n"
        f"cat {tmp_path}/answer\n",
    )
    s = sampler(tmp_path / "sys", tool)
    first = s.sample()
    got = counters(port(first))
    assert got["port_xmit_wait"] == (5_000_000_000, 64)
    assert got["symbol_error"] == (70_000, 64)
    assert port(first).counter_source is not None
    assert (port(first).counter_source.source, port(first).counter_source.reason) == (
        "perfquery_extended",
        "",
    )
    series = rendered(first)
    assert series[(P + "transmit_wait_total", ("mlx5_0", "1"))] == 5_000_000_000
    assert series[(P + "pma_source_info", ("mlx5_0", "1", "perfquery_extended", ""))] == 1
    assert not any(k[0] == P + "pma_saturated" for k in series)  # nothing is stuck: 64-bit
    assert findings(first) == []
    assert first.tool_calls == 1 and first.issues == ()

    (tmp_path / "broken").touch()
    failing = s.sample()
    got = counters(port(failing))
    # every counter the 64-bit answer stood in for is absent now, never its narrow sysfs
    # twin (2^32-1, 2^16-1); the data counters the kernel reads 64-bit itself stay
    assert not {"port_xmit_wait", "symbol_error", "link_downed", "port_rcv_errors"} & set(got)
    assert got["port_xmit_data"] == (4000, 64) and got["unicast_xmit_packets"] == (10, 64)
    assert port(failing).counter_source is not None
    assert port(failing).counter_source.reason == "failed"
    (issue,) = failing.issues
    assert issue.path == "mlx5_0/1: perfquery -x" and issue.reason == "io"
    assert "ibwarn: mad_rpc failed" in issue.detail and "\n" not in issue.detail

    (tmp_path / "broken").unlink()
    backoff = s.sample()  # the second failure in a row would skip one pass; one failure: none
    assert backoff.tool_calls == 1
    assert counters(port(backoff))["port_xmit_wait"] == (5_000_000_000, 64)


def test_a_pma_offering_nothing_more_costs_one_call_an_hour(tmp_path: Path) -> None:
    """The simulator's answer (CapMask 0x1300, no CapMask2) beside a kernel already reading
    64-bit data counters: one perfquery to learn that, then none until the hourly look."""
    root = port_tree(tmp_path / "sys", "mlx5_0", EXTENDED_SYSFS)
    (tmp_path / "answer").write_text((FIX / "sim/perfquery-x-peer.txt").read_text())
    tool = fake_perfquery(tmp_path, f"cat {tmp_path}/answer\n")
    now = [1000.0]
    pma = PmaReader(SysfsReader(root), mode="on", prefix=(str(tool),), clock=lambda: now[0])
    s = InfinibandSampler(SysfsReader(root), pma=pma)
    calls = []
    for _ in range(4):
        snap = s.sample()
        calls.append(snap.tool_calls)
        src = port(snap).counter_source
        assert src is not None and (src.source, src.reason) == ("sysfs", "not_advertised")
        now[0] += 15
    assert calls == [1, 0, 0, 0]
    now[0] += CAPS_RECHECK_SECONDS
    assert s.sample().tool_calls == 1
    # the narrow sysfs counters stay what they are: stuck, and said so
    assert port(snap).counter_source is not None
    assert counters(port(snap))["port_xmit_wait"] == (U32, 32)


# -- hostile answers -------------------------------------------------------------------------

SIM_X = FIX / "sim/perfquery-x-peer.txt"
HOSTILE = {
    "huge": "head -c 300000 /dev/zero | tr '\\0' 'A'\n",
    "binary": "head -c 4000 /dev/urandom\n",
    "empty": "true\n",
    "no counters": "echo '# Port extended counters: Lid 2 port 1 (CapMask: 0x1200)'\n"
    "echo 'PortSelect:......1'\n",
    "wrong port": f"sed 's/^PortSelect:.*/PortSelect:......2/' {SIM_X}\n",
    "wrong attribute": f"cat {FIX}/sim/perfquery-peer.txt\n",
    "past 64 bits": f"sed 's/^PortXmitData:.*/PortXmitData:....99999999999999999999999/' {SIM_X}\n",
    "negative": f"sed 's/^PortXmitData:.*/PortXmitData:....-5/' {SIM_X}\n",
    "exit 1": "echo 'ibwarn: [7] mad_rpc_open_port: client_register failed' >&2\nexit 1\n",
    "killed": "kill -9 $$\n",
    "long line": "printf 'PortSelect:%08000d\\n' 1\n",
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_perfquery_costs_its_port_one_issue_and_nothing_else(
    case: str, tmp_path: Path
) -> None:
    root = port_tree(
        tmp_path / "sys", "mlx5_0", {"port_xmit_data": U32, "port_rcv_data": 5, "symbol_error": 3}
    )
    tool = fake_perfquery(tmp_path, HOSTILE[case])
    snap = sampler(root, tool).sample()
    p = port(snap)
    assert counters(p)["port_xmit_data"] == (U32 * 4, 32)  # the sysfs value, as it is
    assert counters(p)["symbol_error"] == (3, 16)
    assert p.counter_source is not None and (p.counter_source.source, p.counter_source.reason) == (
        "sysfs",
        "failed",
    )
    (issue,) = snap.issues
    assert issue.path == "mlx5_0/1: perfquery -x"
    assert issue.reason in ("io", "parse")
    assert (
        0 < len(issue.detail) <= 240
        and "\n" not in issue.detail
        and "Traceback" not in issue.detail
    )
    assert rendered(snap)[(P + "pma_source_info", ("mlx5_0", "1", "sysfs", "failed"))] == 1


def test_a_hung_perfquery_is_killed_and_ends_the_step_for_the_pass(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    for dev in ("mlx5_0", "mlx5_1"):
        port_tree(root, dev, {"port_xmit_data": 7, "symbol_error": 0})
    marker = f"59.{os.getpid()}"  # sleep's own argument: how its process is found again
    tool = fake_perfquery(tmp_path, f"exec sleep {marker}\n")
    s = sampler(root, tool, tool_timeout=1.0)
    t0 = time.monotonic()
    snap = s.sample()
    took = time.monotonic() - t0
    assert took < 20, took  # 1 s timeout; generous for a loaded CI machine
    assert snap.tool_calls == 1  # the second port was not tried after the first hung
    reasons = {d.name: port(snap, d.name).counter_source.reason for d in snap.devices}  # type: ignore[union-attr]
    assert reasons == {"mlx5_0": "timeout", "mlx5_1": "timeout"}
    assert [(i.path, i.reason) for i in snap.issues] == [("mlx5_0/1: perfquery -x", "io")]
    assert counters(port(snap, "mlx5_1"))["port_xmit_data"] == (28, 32)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _running(marker):
        time.sleep(0.05)
    assert not _running(marker), "the hung tool's process group outlived its timeout"
    # the port that hung backs off; the other is tried
    assert s.sample().tool_calls == 1


def _running(marker: str) -> bool:
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "cmdline").read_bytes().split(b"\0")[1:2] == [marker.encode()]:
                return True
        except OSError:
            continue
    return False


def test_failures_back_off_0_1_3_7_passes_and_recover(tmp_path: Path) -> None:
    root = port_tree(tmp_path / "sys", "mlx5_0", {"port_xmit_data": 7})
    tool = fake_perfquery(
        tmp_path, f"[ -e {tmp_path}/ok ] && cat {FIX}/sim/perfquery-x-peer.txt && exit 0\nexit 1\n"
    )
    s = sampler(root, tool)
    calls = [s.sample().tool_calls for _ in range(12)]
    # fail, fail (skip 1), fail (skip 3), fail (skip 7) ...
    assert calls == [1, 1, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0]
    (tmp_path / "ok").touch()
    while s.sample().tool_calls == 0:
        pass
    snap = s.sample()
    assert (
        port(snap).counter_source is not None
        and port(snap).counter_source.reason == "not_advertised"
    )


# -- when perfquery is not run ----------------------------------------------------------------


def test_why_not_is_said_per_port(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    port_tree(root, "mlx5_0", {"symbol_error": 1})
    port_tree(root, "mlx5_1", {"symbol_error": 1}, lid=0)  # ACTIVE, no LID yet
    tool = fake_perfquery(tmp_path, f"cat {FIX}/sim/perfquery-x-peer.txt\n")

    def reasons(s: InfinibandSampler) -> dict[str, str]:
        snap = s.sample()
        return {d.name: port(snap, d.name).counter_source.reason for d in snap.devices}  # type: ignore[union-attr]

    assert reasons(sampler(root, tool, mode="off")) == {"mlx5_0": "off", "mlx5_1": "off"}
    assert reasons(sampler(root, tmp_path / "no-such-tool")) == {
        "mlx5_0": "no_tool",
        "mlx5_1": "no_lid",
    }
    # auto: only where class/infiniband_mad names the port's umad device and it opens
    assert reasons(sampler(root, tool, mode="auto")) == {"mlx5_0": "no_umad", "mlx5_1": "no_lid"}
    mad = root / "class/infiniband_mad/umad0"
    mad.mkdir(parents=True)
    (mad / "ibdev").write_text("mlx5_0\n")
    (mad / "port").write_text("1\n")
    dev = tmp_path / "dev"
    assert reasons(sampler(root, tool, mode="auto", dev_root=str(dev))) == {
        "mlx5_0": "no_umad",
        "mlx5_1": "no_lid",
    }
    (dev / "infiniband").mkdir(parents=True)
    (dev / "infiniband/umad0").touch()
    got = reasons(sampler(root, tool, mode="auto", dev_root=str(dev)))
    assert got == {"mlx5_0": "not_advertised", "mlx5_1": "no_lid"}


def test_roce_ports_are_left_alone(tmp_path: Path) -> None:
    root = port_tree(tmp_path / "sys", "mlx5_0", {"symbol_error": 1})
    (root / "class/infiniband/mlx5_0/ports/1/link_layer").write_text("Ethernet\n")
    tool = fake_perfquery(tmp_path, "exit 1\n")
    snap = sampler(root, tool).sample()
    assert port(snap).counter_source is None and snap.tool_calls == 0
    assert not any(k[0] == P + "pma_source_info" for k in rendered(snap))


# -- reset mode, where the answer says it was not cleared --------------------------------------


def test_a_clear_the_counter_does_not_show_is_not_counted(tmp_path: Path) -> None:
    """perfquery -r answers, but the kernel's file still reads the value before: the agent
    does not add what it did not clear (that would count it twice) and says so."""
    root = port_tree(
        tmp_path / "sys",
        "mlx5_0",
        {"symbol_error": 60000, "port_xmit_data": 7, "unicast_xmit_packets": 1},
    )
    basic = answer("sim/perfquery-peer.txt", SymbolErrorCounter=60000)
    tool = fake_perfquery(
        tmp_path,
        'case " $* " in *" -x "*) cat '
        + str(FIX / "sim/perfquery-x-peer.txt")
        + " ;; *) cat "
        + f"{tmp_path}/basic ;; esac\n",
    )
    (tmp_path / "basic").write_text(basic.replace("Lid 1 port 1", "Lid 2 port 1"))
    s = sampler(root, tool, reset=True)
    snap = s.sample()
    p = port(snap)
    assert counters(p)["symbol_error"] == (60000, 16)  # not 60000 + 60000 later
    src = p.counter_source
    assert src is not None and (src.source, src.resets_total) == ("sysfs_reset", 1)
    (issue,) = snap.issues
    assert issue.reason == "unsupported" and "symbol_error did not clear" in issue.detail
    again = s.sample()
    assert counters(port(again))["symbol_error"] == (60000, 16)


def test_reset_needs_perfquery() -> None:
    from agent.config import InfinibandSettings

    with pytest.raises(ValueError, match=r"needs --infiniband\.perfquery"):
        InfinibandSettings(perfquery="off", reset_saturated=True)


def test_snapshots_never_ask_a_pma(tmp_path: Path) -> None:
    """A capture is of files and a replay has no PMA to ask: the flags are refused there, and
    a replay exports every port's counters from the captured files (reason off)."""
    from tests.agentrun import fabricscope

    root = port_tree(tmp_path / "sys", "mlx5_0", {"symbol_error": 3})
    shot = tmp_path / "node.tar.gz"
    took = fabricscope(["snapshot", f"--path.sysfs={root}", "-o", str(shot), "--no-sampler.nvml"])
    assert took.returncode == 0, took.stderr
    refused = fabricscope(["agent", "--once", f"--snapshot={shot}", "--infiniband.perfquery=on"])
    assert refused.returncode != 0
    assert "--infiniband.perfquery has no effect with --snapshot" in refused.stderr
    replay = fabricscope(["agent", "--once", f"--snapshot={shot}"])
    assert replay.returncode == 0, replay.stderr
    assert (
        'fabricscope_infiniband_port_pma_source_info{device="mlx5_0",port="1",reason="off",'
        'source="sysfs"} 1.0' in replay.stdout
    )


def test_the_pma_standin_never_shows_a_reader_of_counters_a_file_mid_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent reads every file ``counters/`` lists: a stand-in's temporary file there is
    listed, renamed away, then read as a counter that vanished (a sampler read error; one CI
    run of tests/test_rolling_restart.py saw FabricscopeSamplerReadErrors turn pending)."""
    root = port_tree(tmp_path / "sys", "mlx5_0", {"symbol_error": 3})
    directory = pma_standin.counters_dir(root, "mlx5_0", 1)
    seen: list[list[str]] = []
    real_replace = os.replace

    def replace(src: object, dst: object) -> None:
        seen.append(sorted(os.listdir(directory)))  # what a reader lists mid-write
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(pma_standin.os, "replace", replace)
    pma_standin.add(root, "mlx5_0", 1, "symbol_error", 2)
    assert seen == [["symbol_error"]]
    assert (directory / "symbol_error").read_text() == "5\n"
