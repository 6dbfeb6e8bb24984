"""The NCCL log parser (agent/throughput/nccl.py) on real NCCL lines of 2.4 to 2.28
(tests/fixtures/nccl-logs, its README says where each file comes from), and on hostile
input: lines of 1 KB to 1 MB built to be slow, garbage, invalid UTF-8, identifiers that
are too long or not identifiers, and state that would grow without bound."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from agent.throughput.nccl import (
    MAX_LINE,
    Abort,
    Channel,
    CommDevice,
    IbDevices,
    InitComplete,
    NcclLine,
    NcclWarning,
    Version,
    bus_id_address,
    parse_nccl_line,
)
from agent.throughput.nccl_run import MAX_HCAS, MAX_PAIRS, MAX_PIDS, NcclRun

LOGS = Path(__file__).parents[1] / "fixtures" / "nccl-logs"


def run_of(name: str) -> NcclRun:
    run = NcclRun()
    for line in (LOGS / name).read_text(encoding="utf-8", errors="replace").splitlines():
        parsed = parse_nccl_line(line)
        if parsed is not None:
            run.feed(parsed, None)
    return run


# one real line per shape (its file in tests/fixtures/nccl-logs) -> exactly what it says
LINES: list[tuple[str, NcclLine | None]] = [
    # 2.4.7: the version without a prefix, NET/IB's list of one HCA, the old Ring lines
    ("NCCL version 2.4.7+cuda10.0", NcclLine(Version("2.4.7"))),
    (
        "master_node:20:289 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:192.168.11.1<0>",
        NcclLine(IbDevices(("mlx5_0",)), 20),
    ),
    (
        "master_node:11717:11986 [2] NCCL INFO Ring 00 : 6 -> 2 [receive] via NET/IB/0",
        NcclLine(Channel("NET/IB", False, 0), 11717),
    ),
    (
        "master_node:11718:11985 [3] NCCL INFO Ring 00 : 3[3] -> 1[1] via P2P/IPC",
        NcclLine(Channel("P2P/IPC", False), 11718),
    ),
    (  # GPU Direct RDMA disabled is said, not a list: not an IB device list
        "master_node:11717:11986 [2] NCCL INFO NET/IB : GPU Direct RDMA Disabled for GPU 2[2] "
        "/ HCA 0 (distance 3 >= 2)",
        None,
    ),
    # 2.7.6: bus ids in brackets, GDRDMA
    (
        "10-90-43-152:120890:121560 [0] NCCL INFO Channel 01 : 2[c7000] -> 0[87000] [receive] "
        "via NET/IB/5/GDRDMA",
        NcclLine(Channel("NET/IB", True, 5, (2, 0)), 120890),
    ),
    # 2.13.4: a list of four with [RO]
    (
        "4c217144f0b1:113168:113179 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB "
        "[2]mlx5_2:1/IB [3]mlx5_3:1/IB [RO]; OOB eth0:10.0.1.9<0>",
        NcclLine(IbDevices(("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3")), 113168),
    ),
    # 2.18.3: sockets and SHM
    (
        "ubuntu:9621:9692 [7] NCCL INFO Channel 14/0 : 15[7] -> 0[0] [send] via NET/Socket/0",
        NcclLine(Channel("NET/Socket", False, 0, (15, 0)), 9621),
    ),
    (
        "ubuntu:39964:40050 [6] NCCL INFO Channel 09 : 6[6] -> 7[7] via SHM/direct/direct",
        NcclLine(Channel("SHM", False, None, (6, 7)), 39964),
    ),
    # 2.18.x: the IB completion error of the 2.7-2.19 format (status 4, vendor err 81)
    (
        "H100-2:19989:20082 [1] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from "
        "peer fe80::966d:ae03:8b:df78%ib0<53249> with error 4, opcode 32564, len 32564, vendor "
        "err 81 (Send)",
        NcclLine(NcclWarning("ib_completion", "loc_prot_err", "81"), 19989),
    ),
    (
        "ng30903:3063025:3066048 [0] misc/socket.cc:49 NCCL WARN socketProgress: Connection "
        "closed by remote peer ng30903-ib.narval.calcul.quebec<51159>",
        NcclLine(NcclWarning("socket"), 3063025),
    ),
    (
        "ng30903:3063028:3066152 [3] include/alloc.h:178 NCCL WARN Cuda failure 'out of memory'",
        NcclLine(NcclWarning("cuda"), 3063028),
    ),
    # 2.19.3: RoCE list; a verbs call failing (the line as the title quotes it)
    (
        "dgxh100-4:460770:460842 [0] NCCL INFO NET/IB : Using [0]mlx5_10:1/RoCE "
        "[1]mlx5_11:1/RoCE [RO]; OOB enp220s0np0:11.1.128.136<0>",
        NcclLine(IbDevices(("mlx5_10", "mlx5_11")), 460770),
    ),
    (
        "misc/ibvwrap.cc:187 NCCL WARN Call to ibv_modify_qp failed with error Network is "
        "unreachable",
        NcclLine(NcclWarning("ibv_call")),
    ),
    (
        "instance-8g-96c-3:2744870:2745046 [0] NCCL INFO NET/IB : No device found.",
        NcclLine(IbDevices(()), 2744870),
    ),
    (  # the ring order listing is not a connection
        "instance-8g-96c-3:2744870:2745046 [0] NCCL INFO Channel 00/32 :    0",
        None,
    ),
    # 2.20.3: async event, and the status= format of the completion error
    (
        "ubuntu20-server-2:94639:94647 [0] transport/net_ib.cc:100 NCCL WARN NET/IB : mlx5_0:1 "
        "Got async event : local access violation work queue error",
        NcclLine(NcclWarning("ib_async_event"), 94639),
    ),
    (
        "ubuntu20-server-2:94639:94652 [0] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got "
        "completion from peer 192.168.1.2<57888> with status=5 opcode=1 len=0 vendor err 249 "
        "(Recv) localGid fe80::e61d:2dff:fef2:9c94 remoteGidsfe80::e61d:2dff:fef2:9fa0",
        NcclLine(NcclWarning("ib_completion", "wr_flush_err", "249"), 94639),
    ),
    # 2.21.5 with the HPC-X IB plugin: the older format again, without (Send)
    (
        "gh-3714u15:7038:7053 [0] ib_plugin.c:1007 NCCL WARN NET/IB : Got completion from peer "
        "10.1.32.3<54891> with error 5, opcode 0, len 0, vendor err 249",
        NcclLine(NcclWarning("ib_completion", "wr_flush_err", "249"), 7038),
    ),
    # 2.22.3: the version as an INFO line; CUMEM
    (
        "puente:21488:21488 [0] NCCL INFO NCCL version 2.22.3+cuda12.4",
        NcclLine(Version("2.22.3"), 21488),
    ),
    (
        "job-3bb823c0-6d27-4312-8094-1c5910bf9b51-worker-0:5663:5809 [0] NCCL INFO Channel "
        "04/0 : 0[0] -> 7[7] via P2P/CUMEM",
        NcclLine(Channel("P2P/CUMEM", False, None, (0, 7)), 5663),
    ),
    # 2.23.4: an abort
    (
        "dgx1v-loki-23:5890:6275 [0] NCCL INFO comm 0x7f00faaa5c00 rank 0 nranks 4 cudaDev 0 "
        "busId 6000 - Abort COMPLETE",
        NcclLine(Abort("0000:06:00.0"), 5890),
    ),
    # a 2.2x release with the IBext_v8 plugin: retry exceeded (status 12, vendor err 129)
    (
        "hostname-test:984:1257 [4] NCCL INFO Channel 06/0 : 36[4] -> 20[4] [send] via "
        "NET/IBext_v8/3",
        NcclLine(Channel("NET/IB", False, 3, (36, 20)), 984),
    ),
    (
        "hostname-test:984:1357 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from "
        "peer 172.36.143.59<44206> with status=12 opcode=129 len=65536 vendor err 129 (Recv) "
        "localGid ::ffff:29.87.88.182 remoteGids::ffff:29.87.4.221",
        NcclLine(NcclWarning("ib_completion", "retry_exc_err", "129"), 984),
    ),
    (
        "hostname-test:984:1257 [4] NCCL INFO comm 0x557fe785f7a0 rank 36 nranks 64 cudaDev 4 "
        "nvmlDev 4 busId 9b000 commId 0x5ae77eb5ea4ec1ee - Init COMPLETE",
        NcclLine(InitComplete("0000:9b:00.0"), 984),
    ),
    (  # sglang#4289 (2.21.5's form): the GPU of the process before its channels
        "node17-2:36754:36754 [6] NCCL INFO ncclCommInitRank comm 0xa624cf0 rank 6 nranks 8 "
        "cudaDev 6 nvmlDev 6 busId 90000 commId 0x551d06754c6bacf2 - Init START",
        NcclLine(CommDevice("0000:90:00.0", "0x551d06754c6bacf2", 6, "node17-2"), 36754),
    ),
    (  # 2.28.9 on the lent H100 (a VM: the GPU at 0000:00:06.0)
        "vm:483:483 [0] NCCL INFO comm 0xf0b0be0 rank 0 nranks 1 cudaDev 0 busId 60 - Destroy "
        "COMPLETE",
        NcclLine(CommDevice("0000:00:06.0"), 483),
    ),
    (
        "hw14:798:813 [3] NCCL INFO Channel 02/0 : 3[3] -> 4[4] via P2P/direct pointer",
        NcclLine(Channel("P2P/direct", False, None, (3, 4)), 798),
    ),
    (
        "<cluster_name>:919:1150 [0] NCCL INFO Channel 01/0 : 8[0] -> 15[7] via P2P/IPC/read",
        NcclLine(Channel("P2P/IPC", False, None, (8, 15)), 919),
    ),
    (
        "<cluster_name>:922:1158 [3] proxy.cc:1519 NCCL WARN [Proxy Service 11] Failed to "
        "execute operation Connect from rank 11, retcode 2",
        NcclLine(NcclWarning("proxy"), 922),
    ),
    # 2.28.9, recorded on the lent H100: the timestamped WARN prefix, an IB list of none
    (
        "vm:483:483 [0] NCCL INFO NET/IB : Using [RO]; OOB eth0:192.0.2.2<0>",
        NcclLine(IbDevices(()), 483),
    ),
    (
        "[2026-11-25 08:34:20] vm:558:558 [0] init.cc:904 NCCL WARN Duplicate GPU detected : "
        "rank 0 and rank 1 both on CUDA device 60",
        NcclLine(NcclWarning("other"), 558),
    ),
    # not NCCL's: PyTorch quoting NCCL, a training line, NCCL's return-code traces
    (
        "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
        "NCCLUtils.cpp:93, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version "
        "2.28.9",
        None,
    ),
    ("\t Train throughput/tokens_per_sec: 55803.1245", None),
    ("vm:558:558 [0] NCCL INFO init.cc:1582 -> 5", None),
]


@pytest.mark.parametrize(("line", "expected"), LINES)
def test_real_lines(line: str, expected: NcclLine | None) -> None:
    got = parse_nccl_line(line)
    assert (got.event, got.pid) == (expected.event, expected.pid) if expected else got is None
    if got is not None and got.pid is not None:  # the [cudaDev] of the prefix
        assert got.dev == int(line.split(" [", 1)[1].split("]", 1)[0])


def test_bus_ids_unpack_as_nccl_does() -> None:
    # NCCL's busIdToInt64 keeps the hex digits of "dddd:bb:dd.f": 0000:18:00.0 -> 0x18000
    assert bus_id_address(0x18000) == "0000:18:00.0"
    assert bus_id_address(0x9B000) == "0000:9b:00.0"
    assert bus_id_address(0x60) == "0000:00:06.0"
    assert bus_id_address(0x1C7001) == "0001:c7:00.1"  # a second PCI domain, function 1


def test_2_4_7_version_and_hca_list() -> None:
    run = run_of("nccl-2.4.7-nv_peer_memory-56.log")
    assert run.version == "2.4.7"
    assert run.lines == 2  # the NET/Socket "Using" of 2.4 is the bootstrap's, not counted


def test_2_4_ring_lines_ib_without_gdr() -> None:
    run = run_of("nccl-2.4-ring-nv_peer_memory-56.log")
    assert dict(run.channels) == {("P2P/IPC", False): 6, ("NET/IB", False): 4}
    assert not run.hca_channels  # no NET/IB list in this excerpt: index 0 names no HCA


def test_2_7_6_gdrdma_channels() -> None:
    run = run_of("nccl-2.7.6-nccl-707.log")
    assert dict(run.channels) == {("NET/IB", True): 12}


def test_2_18_3_sockets_and_shm() -> None:
    run = run_of("nccl-2.18.3-nccl-tests-166.log")
    assert run.version == "2.18.3"
    assert dict(run.channels) == {("NET/Socket", False): 6, ("SHM", False): 3}


def test_completion_errors_of_every_format() -> None:
    assert dict(run_of("nccl-2.4-nccl-tests-24.log").ib_errors) == {("loc_prot_err", "81"): 1}
    assert dict(run_of("nccl-2.18-nccl-928.log").ib_errors) == {("loc_prot_err", "81"): 3}
    r = run_of("nccl-2.20.3-nccl-1524.log")
    assert dict(r.warnings) == {"ib_async_event": 2, "ib_completion": 1}
    assert dict(r.ib_errors) == {("wr_flush_err", "249"): 1}
    assert dict(run_of("nccl-2.21.5-nccl-1737.log").ib_errors) == {("wr_flush_err", "249"): 2}
    assert dict(run_of("nccl-2.21.5-nccl-tests-252.log").ib_errors) == {("loc_prot_err", "81"): 1}


def test_ibext_v8_channels_map_to_the_listed_hcas() -> None:
    """The list was printed by pid 983; the channel lines of the other processes map their
    NET index through it (the last list seen): [3] is mlx5_bond_4."""
    run = run_of("nccl-2.2x-ibext_v8-nccl-1814.log")
    assert dict(run.channels) == {("NET/IB", False): 6}
    assert dict(run.hca_channels) == {
        "mlx5_bond_4": 2,
        "mlx5_bond_8": 1,
        "mlx5_bond_6": 1,
        "mlx5_bond_5": 1,
        "mlx5_bond_7": 1,
    }
    assert run.inits == 3
    assert dict(run.ib_errors) == {("retry_exc_err", "129"): 1, ("wr_flush_err", "249"): 1}


def test_roce_gdrdma_channels_and_p2p_ipc() -> None:
    run = run_of("nccl-2.2x-sglang-4289.log")
    assert dict(run.channels) == {("P2P/IPC", False): 4, ("NET/IB", True): 5}
    assert dict(run.hca_channels) == {"mlx5_2": 2, "mlx5_0": 3}


def test_recorded_h100_one_rank() -> None:
    """torch 2.11 + NCCL 2.28.9, world size 1 on a lent H100: no RDMA device, NET/Socket
    chosen, one communicator initialised; one GPU connects no channel."""
    run = run_of("nccl-2.28.9-h100-one-rank.log")
    assert run.version == "2.28.9"
    assert run.inits == 1 and run.aborts == 0
    assert not run.channels and not run.warnings


def test_recorded_h100_two_ranks_one_gpu() -> None:
    run = run_of("nccl-2.28.9-h100-two-ranks-one-gpu.log")
    assert run.version == "2.28.9"
    assert dict(run.warnings) == {"other": 2}  # Duplicate GPU detected, once per rank
    assert run.inits == 0


def test_per_process_lists_and_new_run() -> None:
    """Each rank lists the one HCA its NCCL_IB_HCA names: its NET/IB/0 is its own HCA."""
    run = NcclRun()
    for pid, dev in ((100, "mlx5_0"), (101, "mlx5_3")):
        run.feed(NcclLine(IbDevices((dev,)), pid), None)
    for pid in (100, 101, 101):
        run.feed(NcclLine(Channel("NET/IB", True, 0), pid), None)
    run.feed(NcclLine(NcclWarning("socket"), 100), None)
    run.feed(NcclLine(InitComplete(), 100), 1700000000.0)
    assert dict(run.hca_channels) == {"mlx5_0": 1, "mlx5_3": 2}
    assert run.last_init_ts == 1700000000.0
    run.new_run()
    assert not run.channels and not run.hca_channels and run.version is None
    assert dict(run.warnings) == {"socket": 1} and run.inits == 1  # counters carry on
    run.feed(NcclLine(Channel("NET/IB", True, 0), 100), None)
    assert not run.hca_channels  # the previous run's lists are forgotten


def test_channels_meet_their_gpu_after_init_complete() -> None:
    """nccl#1814 (IBext_v8): the channels come first, each process's Init COMPLETE with its
    busId after them (as every version before 2.17 prints it): the channels wait for it."""
    run = run_of("nccl-2.2x-ibext_v8-nccl-1814.log")
    assert dict(run.gpu_hca_channels) == {
        ("0000:9b:00.0", "mlx5_bond_4"): 2,  # pid 984 on cudaDev 4: NET/IBext_v8/3, twice
        ("0000:18:00.0", "mlx5_bond_8"): 1,  # pid 980 on cudaDev 0: NET/IBext_v8/7
    }
    assert sum(run.hca_channels.values()) == 6  # three more whose process named no GPU


def test_channels_after_init_start_and_one_process_per_gpu() -> None:
    """sglang#4289 (2.21.5's form): Init START names the GPU before the channels. Only pid
    36754 printed it and it set up no NET/IB channel: nothing is paired, nothing invented."""
    run = run_of("nccl-2.2x-sglang-4289.log")
    assert sum(run.hca_channels.values()) == 5 and not run.gpu_hca_channels


def test_one_process_driving_several_gpus_pairs_each_thread_with_its_gpu() -> None:
    """nccl-tests -g 2: one pid, two CUDA devices; the prefix's [dev] tells them apart."""
    lines = [
        "h:7:8 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_6:1/IB ; OOB ib0:10.0.0.1<0>",
        "h:7:8 [0] NCCL INFO comm 0x1 rank 0 nranks 4 cudaDev 0 nvmlDev 0 busId 18000 commId "
        "0x2 - Init START",
        "h:7:9 [1] NCCL INFO comm 0x3 rank 1 nranks 4 cudaDev 1 nvmlDev 1 busId 9b000 commId "
        "0x2 - Init START",
        "h:7:8 [0] NCCL INFO Channel 00/0 : 0[0] -> 2[0] [send] via NET/IB/0/GDRDMA",
        "h:7:9 [1] NCCL INFO Channel 00/0 : 1[1] -> 3[1] [send] via NET/IB/1/GDRDMA",
        "h:7:9 [1] NCCL INFO Channel 01/0 : 1[1] -> 3[1] [send] via NET/IB/1/GDRDMA",
    ]
    run = NcclRun()
    for line in lines:
        parsed = parse_nccl_line(line)
        assert parsed is not None
        run.feed(parsed, None)
    assert dict(run.gpu_hca_channels) == {
        ("0000:18:00.0", "mlx5_0"): 1,
        ("0000:9b:00.0", "mlx5_6"): 2,
    }
    run.new_run()
    assert not run.gpu_hca_channels
    run.feed(NcclLine(Channel("NET/IB", True, 0), 7, 0), None)
    assert not run.gpu_hca_channels  # the GPU of the previous run is forgotten too


def test_gpu_pairing_state_is_bounded() -> None:
    """Processes that never name their GPU, and pairs beyond the bound, cost nothing more."""
    run = NcclRun()
    run.feed(NcclLine(IbDevices(tuple(f"mlx5_{i}" for i in range(MAX_HCAS))), 1), None)
    for pid in range(10 * MAX_PIDS):  # channels of processes that never init
        run.feed(NcclLine(Channel("NET/IB", True, pid % MAX_HCAS), pid, 0), None)
    assert len(run._pending) == MAX_PIDS
    for pid in range(4 * MAX_PIDS):  # then thousands of GPUs (a forged log)
        run.feed(NcclLine(InitComplete(bus_id_address(pid << 12)), pid, 0), None)
    assert len(run._gpus) == MAX_PIDS
    assert len(run.gpu_hca_channels) <= MAX_PAIRS


# --- hostile input --------------------------------------------------------------------------

SIZES = (1 << 10, 64 << 10, 1 << 20)
ATTACKS = {
    "channel_digits": lambda n: "h:1:1 [0] NCCL INFO Channel " + "0" * n,
    "channel_arrows": lambda n: "h:1:1 [0] NCCL INFO Channel 00 : " + "1[1] -> " * (n // 8),
    "via_long": lambda n: "h:1:1 [0] NCCL INFO Channel 00 : 0 -> 1 via NET/" + "IB/" * (n // 3),
    "ib_list": lambda n: "h:1:1 [0] NCCL INFO NET/IB : Using " + "[0]mlx5_0:1/IB " * (n // 15),
    "ib_list_numbered": lambda n: (
        "h:1:1 [0] NCCL INFO NET/IB : Using "
        + "".join(f"[{i}]mlx5_{i}:1/IB " for i in range(n // 16))
    ),
    "completion_peer": lambda n: (
        "h:1:1 [0] x.cc:1 NCCL WARN NET/IB : Got completion from peer " + "a" * n
    ),
    "completion_digits": lambda n: "NCCL WARN Got completion with error " + "9" * n,
    "markers": lambda n: "NCCL " * (n // 5),
    "prefix_colons": lambda n: ":1" * (n // 2) + " [0] NCCL INFO NCCL version 2.18.3",
    "version_digits": lambda n: "NCCL version " + "2." * (n // 2),
    "marker_at_the_end": lambda n: "x" * n + " NCCL INFO NCCL version 2.18.3",
    "bus_id_digits": lambda n: "h:1:1 [0] NCCL INFO comm 0x1 cudaDev 0 busId " + "f" * n,
    "bus_id_repeats": lambda n: "h:1:1 [0] NCCL INFO" + " cudaDev 0 busId 1" * (n // 18),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_hostile_lines_cost_bounded_time(name: str) -> None:
    """Every line, 1 KiB to 1 MiB, parses in bounded time: the window is MAX_LINE characters
    and RE2 is linear in it, so a 1 MiB line costs no more than a 64 KiB one (the slicing
    and the substring search aside), and none costs more than a few milliseconds."""
    costs = []
    for n in SIZES:
        line = ATTACKS[name](n)
        best = min(_time(line) for _ in range(3))
        costs.append(best)
        assert best < 0.05, f"{name} at {n} B: {best * 1e3:.1f} ms"
    assert costs[-1] < max(costs[1] * 4, 0.002), f"{name}: {costs}"


def _time(line: str) -> float:
    t0 = time.perf_counter()
    parse_nccl_line(line)
    return time.perf_counter() - t0


def test_a_marker_beyond_the_window_is_not_read() -> None:
    line = "x" * MAX_LINE + " NCCL INFO NCCL version 2.18.3"
    assert parse_nccl_line(line) is None


def test_identifiers_are_bounded_or_dropped() -> None:
    long_name = "m" * 65
    assert parse_nccl_line(f"h:1:1 [0] NCCL INFO NET/IB : Using [0]{long_name}:1/IB") == (
        NcclLine(IbDevices(()), 1, 0)
    )
    ansi = "h:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0\x1b[31m:1/IB [1]mlx5_1:1/IB"
    assert parse_nccl_line(ansi) == NcclLine(IbDevices(()), 1, 0)  # the list breaks at [0]
    out_of_order = "h:1:1 [0] NCCL INFO NET/IB : Using [3]mlx5_0:1/IB"
    assert parse_nccl_line(out_of_order) == NcclLine(IbDevices(()), 1, 0)
    v = parse_nccl_line("NCCL version 2.18.3$(reboot)")
    assert v is None or v == NcclLine(Version("2.18.3"))
    assert parse_nccl_line("NCCL version 123.4.5") is None  # not a version NCCL prints
    big = parse_nccl_line(
        "NCCL WARN Got completion with error 999, opcode 1, len 0, vendor err 99999"
    )
    assert big == NcclLine(NcclWarning("ib_completion", "other", "other"))


def test_garbage_and_invalid_utf8_never_raise() -> None:
    rng = random.Random(25)
    pieces = ["NCCL ", "INFO ", "WARN ", "Channel ", " -> ", " via ", "NET/", "IB/", "[0]", ":1/IB"]
    for _ in range(2000):
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(200)))
        text = raw.decode("utf-8", errors="replace")
        line = "".join(rng.choice(pieces) for _ in range(rng.randrange(8))) + text
        parsed = parse_nccl_line(line)
        assert parsed is None or isinstance(parsed, NcclLine)
    # the tailer's replacement characters inside an otherwise real line
    bad = b"h:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_\xff0:1/IB".decode("utf-8", "replace")
    assert parse_nccl_line(bad) == NcclLine(IbDevices(()), 1, 0)


def test_run_state_is_bounded() -> None:
    run = NcclRun()
    for pid in range(MAX_PIDS * 4):
        run.feed(NcclLine(IbDevices((f"hca{pid}",)), pid), None)
        run.feed(NcclLine(Channel("NET/IB", True, 0), pid), None)
    assert len(run._lists) == MAX_PIDS
    # names past the cap are counted under one overflow name: none is lost
    assert len(run.hca_channels) == MAX_HCAS + 1
    assert run.hca_channels["other"] == MAX_PIDS * 4 - MAX_HCAS
    assert run.channels[("NET/IB", True)] == MAX_PIDS * 4
