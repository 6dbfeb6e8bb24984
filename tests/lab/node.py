"""One lab node: a copy of the DGX fixture tree whose counters a scenario advances step by
step, with what the agent reads besides sysfs.

What each source is, and what is real:

* **sysfs** (``<root>/sys``): the DGX H100 tree built by ``tests/fixtures/dgx-h100/
  build_fixture.py`` from its real captures, *without* its five injected faults (each
  scenario plants its own). Every step rewrites the InfiniBand/RoCE counter files, port
  state and PCIe link widths, exactly the files the kernel would change. The RoCE congestion
  hw_counters (``np_cnp_sent``, ``rp_cnp_handled``, ``np_ecn_marked_roce_packets``, real
  mlx5 names) are added: the fixture's hw_counters come from an InfiniBand port that has
  none.
* **procfs** (``<root>/proc``): one process per GPU in the kernel's formats, from
  ``tests/fixtures/procfs-workload/build_fixture.py``'s templates; GPUDirect as its
  ``peermem`` case.
* **NVML**: the real 2x H200 recording (``tests/fixtures/nvml``) widened to the node's eight
  GPUs (GPU *g* answers what recorded GPU *g* mod 2 answered), with the DGX tree's PCI
  addresses, a UUID per node and GPU, the name an H100 SXM reports, the job's compute
  process on every GPU, and NVLink error counters the scenario advances. Replayed through
  :class:`agent.nvml.record.ReplayNvml`, so the real NVML sampler runs.
* **netlink / ethtool**: a file tree cannot hold them, so :class:`LabKernel` answers the
  netdev sampler's two kernel calls (link dump, ``ETHTOOL_GSTATS``) with dicts shaped as
  pyroute2 returns them and mlx5's statistic names (kernel ``counters.rst``); the sampler's
  own parsing and rendering run.
* **probe**: an NCCL probe cannot run without GPUs; :func:`LabNode.probe_snapshot` gives the
  probe sampler's snapshot built from worker records (``agent.probe.measure.records``) with
  nccl-tests-like bandwidths for H100 NVLink (intra-node all_reduce) and a 400G rail
  (node-pair sendrecv), lowered where the scenario's cause sits.
* **pod-resources**: the kubelet's gRPC API, served by a real gRPC server on a unix socket
  per node (:mod:`tests.lab.kubelet`).
* **throughput**: the job's Composer log lines, written by the container runtime's rules:
  CRI format (``<RFC 3339 time> stdout F <line>``, stamped with the simulated clock) in
  ``<root>/pods/<namespace>_<pod>_<uid>/trainer/0.log``, the kubelet's ``/var/log/pods``
  layout (``--path.pod-logs``). The agent finds the log as it does on a node: through the
  pods attribution says hold the node's GPUs; the job's name comes from the pod's API object
  (:func:`tests.lab.kubelet.pod_object`: a StatefulSet ``llm`` owns pods ``llm-<n>``), so
  the series carry namespace, pod, container and ``job_name="llm"`` as on a real cluster.
  At the run's start each of the pod's eight ranks prints NCCL's ``NCCL_DEBUG=INFO`` init
  lines (:func:`write_nccl_init`, NCCL 2.22.3's formats from tests/fixtures/nccl-logs);
  ``nccl_socket_fallback`` restarts every container at the fault (``1.log``, the kubelet's
  name for a restarted container's log) into a run that connects over sockets.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import math
import os
import random
import re
import shutil
import sys
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType

from agent.netdev.linkmsg import STATS64_NAMES
from agent.nvml.record import FORMAT, JsonValue
from agent.probe.measure.records import MiB, ProbeError, ProbeRecord
from agent.probe.run.results import ProbeRun, ProbeSnapshot
from tests.lab.kubelet import Lister
from tests.lab.scenarios import (
    CONTAINER,
    GOOD_TOKENS_PER_SECOND,
    NAMESPACE,
    RAILS,
    Scenario,
    node_name,
    pod_name,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
NVML_RECORDING = FIXTURES / "nvml" / "h200x2.recording.json"
GPU_BUS_IDS = ("19", "3b", "4c", "5d", "9b", "bb", "cb", "db")
GPU_NAME = "NVIDIA H100 80GB HBM3"
NVLINKS = 18
STORAGE_NICS = ("mlx5_1", "mlx5_2", "mlx5_7", "mlx5_8")
RAIL_BYTES_PER_SECOND = 50e9  # 400 Gb/s
STORAGE_BYTES_PER_SECOND = 12.5e9
#: the share of a rail a healthy step of the job keeps busy
RAIL_LOAD = 0.55
MTU = 4096
U32 = (1 << 32) - 1
#: the PFC priority RoCE traffic uses
PRIO = 3
#: node-pair sendrecv busbw of one GPU pair over a healthy 400G rail, by size (bytes/s)
PAIR_BUSBW = {1 * MiB: 14.0e9, 16 * MiB: 38.5e9, 64 * MiB: 45.2e9}
#: intra-node all_reduce busbw over 8 H100s on NVLink, by size (bytes/s)
INTRA_BUSBW = {1 * MiB: 61.0e9, 16 * MiB: 236.0e9, 64 * MiB: 352.0e9}
PROBE_EVERY_STEPS = 5


def _load_module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@cache
def dgx_builder() -> ModuleType:
    return _load_module(FIXTURES / "dgx-h100" / "build_fixture.py", "lab_dgx_build_fixture")


@cache
def procfs_builder() -> ModuleType:
    return _load_module(
        FIXTURES / "procfs-workload" / "build_fixture.py", "lab_procfs_build_fixture"
    )


def healthy_tree(cache_dir: Path) -> Path:
    """The fault-free DGX tree, built once into ``cache_dir``."""
    out = cache_dir / "dgx-healthy" / "sys"
    if not out.exists():
        dgx_builder().build(out, faults=False)
    return out


def pod_uid(node: str) -> str:
    """The UID of the job's pod on ``node``."""
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}.pod.fabricscope.lab"))


def gpu_uuid(node: str, gpu: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}.gpu{gpu}.fabricscope.lab"))


@dataclass
class Port:
    """One RDMA port's counters as the files hold them (PMA words for data)."""

    device: str
    netdev: str
    rail: bool
    counters: dict[str, int] = field(default_factory=dict)
    hw: dict[str, int] = field(default_factory=dict)
    ethtool: dict[str, int] = field(default_factory=dict)
    stats64: dict[str, int] = field(default_factory=dict)
    up: bool = True
    carrier_changes: int = 2


class LabKernel:
    """The netlink and ethtool answers of one node's netdevs (see the module doc)."""

    def __init__(self, node: LabNode) -> None:
        self._node = node

    def open_rtnl(self, netns: str | None) -> LabRtnl:
        return LabRtnl(self._node)

    def open_ethtool(self, netns: str | None) -> LabEthtool:
        return LabEthtool(self._node)


class LabRtnl:
    def __init__(self, node: LabNode) -> None:
        self._node = node

    def get_links(self) -> list[dict[str, object]]:
        return [self._msg(p) for p in self._node.ports.values()]

    def link(self, command: str, *, ifname: str) -> list[dict[str, object]]:
        return [self._msg(p) for p in self._node.ports.values() if p.netdev == ifname]

    def _msg(self, p: Port) -> dict[str, object]:
        return {
            "index": self._node.ifindex(p.netdev),
            "IFLA_IFNAME": p.netdev,
            "IFLA_OPERSTATE": "UP" if p.up else "DOWN",
            "IFLA_CARRIER": 1 if p.up else 0,
            "IFLA_CARRIER_CHANGES": p.carrier_changes,
            "IFLA_MTU": 9000,
            "IFLA_STATS64": dict(p.stats64),
        }

    def close(self) -> None:
        return None


class LabEthtool:
    def __init__(self, node: LabNode) -> None:
        self._node = node

    def statistics(self, ifname: str, include: re.Pattern[str]) -> list[tuple[str, int]]:
        for p in self._node.ports.values():
            if p.netdev == ifname:
                return sorted((k, v) for k, v in p.ethtool.items() if include.fullmatch(k))
        raise OSError(19, "No such device")

    def close(self) -> None:
        return None


ETHTOOL_NAMES = (
    f"rx_prio{PRIO}_pause",
    f"tx_prio{PRIO}_pause",
    f"rx_prio{PRIO}_pause_duration",
    f"tx_prio{PRIO}_pause_duration",
    f"rx_prio{PRIO}_pause_transition",
    f"rx_prio{PRIO}_discards",
    f"rx_prio{PRIO}_marked",
    "tx_pause_storm_warning_events",
    "tx_pause_storm_error_events",
    "rx_discards_phy",
    "tx_discards_phy",
    "rx_out_of_buffer",
    "rx_crc_errors_phy",
    "rx_symbol_err_phy",
    "link_down_events_phy",
    "rx_bytes_phy",
    "tx_bytes_phy",
    "rx_vport_rdma_unicast_bytes",
    "tx_vport_rdma_unicast_bytes",
    "rx_vport_rdma_unicast_packets",
    "tx_vport_rdma_unicast_packets",
    # a few statistics the default filter drops, as a real mlx5 reports them too
    "rx_csum_complete",
    "tx_tso_packets",
)
STATS64 = STATS64_NAMES[:10]  # rx_packets ... collisions: the ones a lab node moves
ROCE_HW = ("np_cnp_sent", "rp_cnp_handled", "np_ecn_marked_roce_packets")
ADVANCED = (
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
    "unicast_xmit_packets",
    "unicast_rcv_packets",
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "port_rcv_errors",
    "port_xmit_discards",
    "port_xmit_wait",
    "local_link_integrity_errors",
)
#: PMA counter widths (bits) where the hardware saturates instead of wrapping
WIDTHS = {
    "symbol_error": 16,
    "link_downed": 8,
    "link_error_recovery": 8,
    "port_rcv_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_wait": 32,
    "local_link_integrity_errors": 4,
}


class LabNode:
    """Node ``index`` of ``scenario`` under ``root``."""

    def __init__(self, scenario: Scenario, index: int, root: Path, cache_dir: Path) -> None:
        self.scenario = scenario
        self.index = index
        self.name = node_name(index)
        self.pod = pod_name(index)
        self.root = root
        self.sys = root / "sys"
        self.proc = root / "proc"
        self.pod_logs = root / "pods"
        self.pod_uid = pod_uid(self.name)
        self.socket = root / "kubelet.sock"
        self.rng = random.Random(f"{scenario.name}/{self.name}")
        self._written: dict[str, str] = {}
        cause = scenario.cause
        self.cause = cause if cause is not None and cause.node == self.name else None
        shutil.copytree(healthy_tree(cache_dir), self.sys, symlinks=True)
        #: the job's container restarts (nccl_socket_fallback: its next run is a new log)
        self.restarts = 0
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.ports = self._read_ports()
        self._ifindex = {p.netdev: 10 + i for i, p in enumerate(self.ports.values())}
        self.nvlink_errors: dict[tuple[int, int, int], int] = {}
        self.recorded = json.loads(NVML_RECORDING.read_text())
        self.probes: tuple[ProbeRun, ...] = ()
        self.probe_runs: dict[tuple[str, str], int] = {}
        self.tokens_per_second = 0.0
        #: live mode: the job's tokens/s are multiplied by this (a rail held down slows it)
        self.job_slowdown = 1.0
        self.t0: float | None = None  # wall time of the run's start (set by the cluster)
        self.batch = 0
        self.lister: Lister | None = None  # its kubelet's answer, once the cluster serves it
        #: RDMA devices whose link is held DOWN from the next step on (live mode's faults)
        self.held_down: set[str] = {d for n, d in scenario.down if n == self.name}
        #: live mode's "up but slower" faults: RDMA devices whose link retrained at 1X NDR,
        #: and RDMA devices whose NIC's PCIe link retrained at 8 GT/s, from the next step on
        self.rate_dropped: set[str] = set()
        self.pcie_slowed: set[str] = set()
        #: replace files atomically (live mode, where agents read while the lab writes)
        self.atomic_writes = False
        self._write_static()
        self._write_procfs(wrong_numa=False)

    # -- setup -----------------------------------------------------------------------------

    def _read_ports(self) -> dict[str, Port]:
        rails = dict(RAILS)
        ports: dict[str, Port] = {}
        for dev_dir in sorted((self.sys / "class/infiniband").iterdir()):
            p1 = dev_dir / "ports/1"
            netdev = (p1 / "gid_attrs/ndevs/0").read_text().strip()
            port = Port(dev_dir.name, netdev, dev_dir.name in rails)
            for name in ADVANCED:
                port.counters[name] = int((p1 / "counters" / name).read_text())
            # the fixture's counters come from another host's idle port: start from zero errors
            for name in WIDTHS:
                port.counters[name] = 0
            headroom = self.scenario.xmit_wait_headroom
            if headroom is not None and headroom[0] == dev_dir.name:
                port.counters["port_xmit_wait"] = (1 << WIDTHS["port_xmit_wait"]) - 1 - headroom[1]
            port.hw = {name: 0 for name in ROCE_HW}
            port.ethtool = {name: 0 for name in ETHTOOL_NAMES}
            port.stats64 = {name: 0 for name in STATS64}
            ports[dev_dir.name] = port
        return ports

    def ifindex(self, netdev: str) -> int:
        return self._ifindex[netdev]

    def _write_static(self) -> None:
        for port in self.ports.values():
            net = self.sys / "class/net" / port.netdev
            (net / "ifindex").write_text(f"{self._ifindex[port.netdev]}\n")
            speed = 400000 if port.rail else 100000
            (net / "speed").write_text(f"{speed}\n")
        # GPUDirect RDMA: nvidia_peermem loaded (the procfs-workload fixture's peermem case)
        for rel in ("module/nvidia/initstate", "module/nvidia_peermem/initstate"):
            path = self.sys / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("live\n")
        (self.sys / "module/nvidia_peermem/refcnt").write_text("0\n")

    def pids(self) -> list[int]:
        return [5000 + self.index * 100 + g for g in range(8)]

    def gpu_cpus(self, gpu: int, *, wrong_numa: bool) -> list[int]:
        """The 10 CPUs the process of ``gpu`` is pinned to: on its GPU's NUMA node, or on the
        other one."""
        numa = gpu // 4
        if wrong_numa:
            numa = 1 - numa
        start = numa * 80 + (gpu % 4) * 10
        return list(range(start, start + 10))

    def _write_procfs(self, *, wrong_numa: bool) -> None:
        b = procfs_builder()
        files = {
            "modules": b.modules(b.LSMOD),
            "driver/nvidia/version": b.VERSION_PROPRIETARY,
            "sys/kernel/osrelease": "6.8.0-52-generic\n",
        }
        for gpu, pid in enumerate(self.pids()):
            cpus = self.gpu_cpus(gpu, wrong_numa=wrong_numa)
            nodes = sorted({c // 80 for c in cpus})
            files[f"{pid}/status"] = b.STATUS.format(
                name="python3",
                pid=pid,
                ppid=self.pids()[0] - 1,
                mask=b.mask(cpus, b.NR_CPUS),
                cpus=b.cpulist(cpus),
                mems=b.mask(nodes, 1024),
                mems_list=b.cpulist(nodes),
            )
            rail = RAILS[gpu][0]
            env = [
                "PATH=/usr/local/bin:/usr/bin:/bin",
                f"NCCL_IB_HCA=={rail}:1",
                "NCCL_IB_GID_INDEX=3",
                f"NCCL_IB_TC={PRIO * 32}",
                "NCCL_DEBUG=WARN",
                f"RANK={self.index * 8 + gpu}",
                "HF_TOKEN=hf_labsecretdonotexport",
            ]
            files[f"{pid}/environ"] = "".join(e + "\0" for e in env)
        for rel, text in files.items():
            path = self.proc / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    def cpu_ids(self, *, wrong_numa: bool) -> list[int]:
        return sorted(c for g in range(8) for c in self.gpu_cpus(g, wrong_numa=wrong_numa))

    # -- one step --------------------------------------------------------------------------

    def advance(self, step: int, t: float, dt: float, fault_age: float | None) -> None:
        """Move the node from ``t - dt`` to ``t`` (seconds since the run began).
        ``fault_age``: seconds since the scenario's cause began, None before it."""
        sc = self.scenario
        kind = sc.cause.kind if sc.cause is not None and fault_age is not None else None
        here = self.cause is not None and fault_age is not None
        job = (sc.throughput_ratio if fault_age is not None else 1.0) * self.job_slowdown
        wave = 1.0 + 0.04 * math.sin(2 * math.pi * t / 900.0)
        rng = self.rng
        link_down_now = False
        if here and kind == "ib_link_errors":
            assert fault_age is not None
            # the link drops twice: 10 and 20 minutes after the fault starts
            link_down_now = any(m * 60 <= fault_age < m * 60 + dt for m in (10, 20))
        for port in self.ports.values():
            c = port.counters
            on_cause = here and self.cause is not None and port.device == self.cause.device
            share = RAIL_LOAD * job * wave * rng.uniform(0.97, 1.03) if port.rail else 0.03
            rate = RAIL_BYTES_PER_SECOND if port.rail else STORAGE_BYTES_PER_SECOND
            if on_cause and kind == "pcie_width_degraded":
                share = min(share, 0.48)  # PCIe Gen5 x8: ~26 GB/s usable
            if (on_cause and kind == "pcie_speed_degraded") or port.device in self.pcie_slowed:
                share = min(share, 0.30)  # PCIe Gen3 x16: ~15 GB/s usable
            if (on_cause and kind == "ib_rate_drop") or port.device in self.rate_dropped:
                share = RAIL_LOAD * wave * rng.uniform(0.97, 1.03) / 4  # a quarter of before
            held = port.device in self.held_down
            down = (on_cause and link_down_now) or held
            if held and port.up:  # the link just went down: the PMA counts it once
                self._add(c, "link_downed", 1)
                self._add(c, "link_error_recovery", 1)
                port.ethtool["link_down_events_phy"] += 1
                port.carrier_changes += 1
            bytes_ = 0.0 if down else share * rate * dt
            rx_bytes = bytes_ * rng.uniform(0.98, 1.02)
            self._add(c, "port_xmit_data", bytes_ / 4)
            self._add(c, "port_rcv_data", rx_bytes / 4)
            for d, b_ in (("xmit", bytes_), ("rcv", rx_bytes)):
                self._add(c, f"port_{d}_packets", b_ / MTU)
                self._add(c, f"unicast_{d}_packets", b_ / MTU)
            # healthy links: a few symbol errors an hour, on some ports
            if port.rail and rng.random() < 2.0 * dt / 3600.0 * (0.5 + port_bias(port)):
                self._add(c, "symbol_error", 1)
            for noisy in sc.noisy:  # a marginal link: a steady rate, counted (Poisson-like)
                if (noisy.node, noisy.device) == (self.name, port.device):
                    mean = noisy.per_second * dt
                    self._add(c, "symbol_error", max(0.0, rng.gauss(mean, math.sqrt(mean))))
            wait_rate = 1.5e3 * share / RAIL_LOAD
            cnp_np = cnp_rp = 20.0 * share / RAIL_LOAD
            pause_tx = pause_rx = 0.0
            if kind == "ib_link_errors" and port.rail:
                wait_rate = 2.0e4  # the job's other rails wait on the slow one
            if on_cause and kind == "ib_link_errors":
                symbols = rng.uniform(8, 13) * dt / 60.0
                self._add(c, "symbol_error", symbols)
                self._add(c, "port_rcv_errors", symbols / 3)
                self._add(c, "port_xmit_discards", rng.uniform(0.5, 1.5) * dt / 60.0)
                port.ethtool["rx_symbol_err_phy"] += int(symbols * 40)
                port.ethtool["rx_crc_errors_phy"] += int(symbols / 2)
                wait_rate = 4.0e5
                if down:
                    self._add(c, "link_downed", 1)
                    self._add(c, "link_error_recovery", 3)
                    self._add(c, "local_link_integrity_errors", 1)
                    port.ethtool["link_down_events_phy"] += 1
                    port.carrier_changes += 2
            if kind == "roce_incast" and port.rail and sc.cause is not None:
                if on_cause:  # the hot spot: receiver of the incast
                    cnp_np = 1.5e5 * rng.uniform(0.9, 1.1)
                    pause_tx = 3.0e4 * rng.uniform(0.9, 1.1)
                    wait_rate = 6.0e3
                    port.ethtool["rx_out_of_buffer"] += int(200 * dt * rng.uniform(0.8, 1.2))
                    port.hw["np_ecn_marked_roce_packets"] += int(2.0e5 * dt)
                    port.ethtool[f"rx_prio{PRIO}_marked"] += int(2.0e5 * dt)
                elif port.device == sc.cause.device:  # the senders on that rail
                    cnp_rp = 5.0e4 * rng.uniform(0.9, 1.1)
                    pause_rx = 1.0e4 * rng.uniform(0.9, 1.1)
                    wait_rate = 6.0e5 * rng.uniform(0.9, 1.1)
            if held:  # no link: the PMA neither sends nor waits (PortXmitWait stands still)
                wait_rate = 0.0
            self._add(c, "port_xmit_wait", wait_rate * dt * rng.uniform(0.8, 1.2))
            port.hw["np_cnp_sent"] += int(cnp_np * dt)
            port.hw["rp_cnp_handled"] += int(cnp_rp * dt)
            port.hw["np_ecn_marked_roce_packets"] += int(cnp_np * dt * 1.2)
            e = port.ethtool
            e[f"tx_prio{PRIO}_pause"] += int(pause_tx * dt)
            e[f"rx_prio{PRIO}_pause"] += int(pause_rx * dt)
            # pause duration in microseconds: a pause quantum at 400G is ~ 0.16 us x 65535 / 8
            e[f"tx_prio{PRIO}_pause_duration"] += int(pause_tx * dt * 6.0)
            e[f"rx_prio{PRIO}_pause_duration"] += int(pause_rx * dt * 6.0)
            e[f"rx_prio{PRIO}_pause_transition"] += int(pause_rx * dt / 4)
            e["rx_bytes_phy"] += int(rx_bytes)
            e["tx_bytes_phy"] += int(bytes_)
            e["rx_vport_rdma_unicast_bytes"] += int(rx_bytes * 0.99)
            e["tx_vport_rdma_unicast_bytes"] += int(bytes_ * 0.99)
            e["rx_vport_rdma_unicast_packets"] += int(rx_bytes / MTU)
            e["tx_vport_rdma_unicast_packets"] += int(bytes_ / MTU)
            e["rx_csum_complete"] += int(300 * dt)
            e["tx_tso_packets"] += int(40 * dt)
            s = port.stats64
            s["rx_packets"] += int(300 * dt)
            s["tx_packets"] += int(280 * dt)
            s["rx_bytes"] += int(300 * dt * 180)
            s["tx_bytes"] += int(280 * dt * 160)
            s["multicast"] += int(2 * dt)
            port.up = not down
        self._write_counters()
        if here and kind == "pcie_width_degraded":
            self._set_nic_width(8)
        slowed = set(self.pcie_slowed)
        dropped = set(self.rate_dropped)
        if here and self.cause is not None and self.cause.device is not None:
            if kind == "pcie_speed_degraded":
                slowed.add(self.cause.device)
            if kind == "ib_rate_drop":
                dropped.add(self.cause.device)
        for device in sorted(slowed):
            self._set_nic_speed(device, "8.0 GT/s PCIe")
        for device in sorted(dropped):  # the link retrained at one lane; it stays ACTIVE
            self._write(f"class/infiniband/{device}/ports/1/rate", "100 Gb/sec (1X NDR)\n")
        if here and kind == "nvlink_errors":
            self._advance_nvlink(dt)
        if here and kind == "wrong_numa" and fault_age is not None and fault_age < dt:
            self._write_procfs(wrong_numa=True)
        self._advance_probes(step, t, fault_age)
        self._advance_job(step, t, job, fault_age)

    @staticmethod
    def _add(c: dict[str, int], name: str, by: float) -> None:
        width = WIDTHS.get(name)
        value = c[name] + round(by)
        c[name] = min(value, (1 << width) - 1) if width else value

    def _write(self, rel: str, text: str) -> None:
        """Write one sysfs file, only when its content changes (as the kernel shows it);
        with ``atomic_writes`` (live mode: an agent may read it meanwhile) through a new
        file (outside the tree, where no sampler lists it) renamed over it, so a reader
        never sees it empty."""
        if self._written.get(rel) != text:
            path = f"{self.sys}/{rel}"
            if self.atomic_writes:
                tmp = f"{self.root}/.lab-new"
                with open(tmp, "w") as f:
                    f.write(text)
                os.replace(tmp, path)
            else:
                with open(path, "w") as f:
                    f.write(text)
            self._written[rel] = text

    def _write_counters(self) -> None:
        for port in self.ports.values():
            p1 = f"class/infiniband/{port.device}/ports/1"
            for name, value in port.counters.items():
                self._write(f"{p1}/counters/{name}", f"{value}\n")
            for name, value in port.hw.items():
                self._write(f"{p1}/hw_counters/{name}", f"{value}\n")
            self._write(f"{p1}/state", "4: ACTIVE\n" if port.up else "1: DOWN\n")
            self._write(f"{p1}/phys_state", "5: LinkUp\n" if port.up else "2: Polling\n")
            self._write(f"class/net/{port.netdev}/operstate", "up\n" if port.up else "down\n")

    def _set_nic_width(self, width: int) -> None:
        """The NIC of the cause and the switch port above it report the link at ``width``."""
        assert self.cause is not None and self.cause.pci_bus_id is not None
        nic = (self.sys / "bus/pci/devices" / self.cause.pci_bus_id).resolve()
        for dev in (nic, nic.parent):
            (dev / "current_link_width").write_text(f"{width}\n")

    def _set_nic_speed(self, device: str, speed: str) -> None:
        """The NIC of RDMA ``device`` and the switch port above it report its link at
        ``speed`` (written once, through :meth:`_write`)."""
        nic = (self.sys / "class/infiniband" / device / "device").resolve()
        for dev in (nic, nic.parent):
            self._write(
                str(dev.relative_to(self.sys.resolve()) / "current_link_speed"), f"{speed}\n"
            )

    def _advance_nvlink(self, dt: float) -> None:
        assert self.cause is not None and self.cause.gpu is not None
        gpu = int(self.cause.gpu)
        rng = self.rng
        for link in range(0, 6):
            for counter, per_min in ((0, 40.0), (1, 0.1), (2, 110.0)):
                n = per_min * dt / 60.0 * rng.uniform(0.6, 1.4)
                if counter == 1:
                    n = 1.0 if rng.random() < n else 0.0
                key = (gpu, link, counter)
                self.nvlink_errors[key] = self.nvlink_errors.get(key, 0) + round(n)

    # -- NVML ------------------------------------------------------------------------------

    def nvml_recording(self) -> dict[str, JsonValue]:
        """This node's NVML answers now (see the module doc)."""
        rec = self.recorded["calls"]
        calls: dict[str, JsonValue] = {}
        per_gpu: dict[int, dict[str, JsonValue]] = {0: {}, 1: {}}
        for key, answer in rec.items():
            name, _, rest = key.partition("(")
            args = rest.rstrip(")").split(",") if rest.rstrip(")") else []
            if name.startswith("nvmlDevice") and name != "nvmlDeviceGetCount" and args:
                per_gpu[int(args[0])][name + "(" + ",".join(args[1:])] = answer
            else:
                calls[key] = answer
        calls["nvmlDeviceGetCount()"] = {"value": 8}
        for gpu in range(8):
            for tail, answer in per_gpu[gpu % 2].items():
                name, _, rest = tail.partition("(")
                key = f"{name}({gpu}" + (f",{rest})" if rest else ")")
                calls[key] = answer
            calls[f"nvmlDeviceGetPciInfo({gpu})"] = {"value": f"00000000:{GPU_BUS_IDS[gpu]}:00.0"}
            calls[f"nvmlDeviceGetUUID({gpu})"] = {"value": gpu_uuid(self.name, gpu)}
            calls[f"nvmlDeviceGetName({gpu})"] = {"value": GPU_NAME}
            calls[f"nvmlDeviceGetSerial({gpu})"] = {"value": f"16538240{self.index:02d}{gpu:03d}"}
            calls[f"nvmlDeviceGetComputeRunningProcesses({gpu})"] = {
                "value": [[self.pids()[gpu], 71 << 30]]
            }
            for link in range(NVLINKS):
                for counter in range(3):
                    n = self.nvlink_errors.get((gpu, link, counter), 0)
                    calls[f"nvmlDeviceGetNvLinkErrorCounter({gpu},{link},{counter})"] = {"value": n}
        return {"format": FORMAT, "calls": calls, "events": []}

    # -- probes ----------------------------------------------------------------------------

    def _pair_factor(self, peer: int, gpu: int, fault_age: float | None) -> float:
        """How much of the healthy node-pair busbw GPU ``gpu`` of this node gets to ``peer``."""
        sc = self.scenario
        if sc.cause is None or fault_age is None or sc.cause.gpu is None:
            return 1.0
        cause_node = int(sc.cause.node.split("-")[1])
        if cause_node not in (self.index, peer) or int(sc.cause.gpu) != gpu:
            return 1.0
        return {
            "ib_link_errors": 0.42,
            "roce_incast": 0.7,
            "pcie_width_degraded": 0.55,
            "ib_rate_drop": 0.25,
            "pcie_speed_degraded": 0.32,
        }.get(sc.cause.kind, 1.0)

    def _advance_probes(self, step: int, t: float, fault_age: float | None) -> None:
        if step % PROBE_EVERY_STEPS != self.index % PROBE_EVERY_STEPS and self.probes:
            return
        rng = self.rng
        runs: list[ProbeRun] = []
        sc = self.scenario
        intra = 1.0
        if self.cause is not None and fault_age is not None and self.cause.kind == "nvlink_errors":
            intra = 0.88
        runs.append(self._run("all_reduce", ("", "", ""), t, intra, None))
        for peer in range(sc.nodes):
            if peer == self.index:
                continue
            for gpu in range(8):
                f = self._pair_factor(peer, gpu, fault_age)
                failure = None
                if f < 0.5 and rng.random() < 0.2:
                    failure = "timeout"
                runs.append(
                    self._run("sendrecv", (node_name(peer), str(gpu), str(gpu)), t, f, failure)
                )
        self.probes = tuple(runs)

    def _run(
        self,
        kind: str,
        pair: tuple[str, str, str],
        t: float,
        factor: float,
        failure: str | None,
    ) -> ProbeRun:
        """One probe run: ``pair`` is (peer, gpu, peer_gpu), all empty for intra-node."""
        peer, gpu, peer_gpu = pair
        table, world = (INTRA_BUSBW, 8) if kind == "all_reduce" else (PAIR_BUSBW, 2)
        rng = self.rng
        records = []
        for size, busbw in table.items():
            if failure is not None:
                records.append(
                    ProbeRecord(
                        kind,
                        "nccl",
                        world,
                        size,
                        20,
                        5,
                        None,
                        None,
                        None,
                        None,
                        ProbeError(failure, "no result within 60 s"),
                        peer=peer,
                    )
                )
                continue
            bw = busbw * factor * rng.uniform(0.97, 1.03)
            algbw = bw / (2 * (world - 1) / world) if kind == "all_reduce" else bw
            records.append(
                ProbeRecord(
                    kind,
                    "nccl",
                    world,
                    size,
                    20,
                    5,
                    size / algbw,
                    algbw,
                    bw,
                    True,
                    None,
                    peer=peer,
                )
            )
        key = (kind, failure or "ok")
        self.probe_runs[key] = self.probe_runs.get(key, 0) + 1
        return ProbeRun(kind, peer, gpu, peer_gpu, t, 6.5, failure, tuple(records))

    def probe_snapshot(self, wall: float) -> ProbeSnapshot:
        runs = tuple(
            ProbeRun(
                r.collective,
                r.peer,
                r.gpu,
                r.peer_gpu,
                wall,
                r.duration_seconds,
                r.reason,
                r.records,
            )
            for r in self.probes
        )
        totals = tuple((k, r, n) for (k, r), n in sorted(self.probe_runs.items()))
        return ProbeSnapshot(
            runs=runs,
            runs_total=totals,
            gpu_seconds_total=6.5 * sum(self.probe_runs.values()),
            members=self.scenario.nodes,
        )

    # -- the job ---------------------------------------------------------------------------

    def _advance_job(self, step: int, t: float, ratio: float, fault_age: float | None) -> None:
        wall = self.t0 + t if self.t0 is not None else t
        sc = self.scenario
        kind = sc.cause.kind if sc.cause is not None else None
        restart = (
            kind in ("nccl_socket_fallback", "nccl_hca_off_numa")
            and fault_age is not None
            and self.restarts == 0
        )
        if restart:  # the job's next run: every container restarts into a new log
            self.restarts = 1
        if self.batch == 0 or restart:
            write_nccl_init(
                self,
                wall,
                sockets=restart and kind == "nccl_socket_fallback",
                off_numa=restart and kind == "nccl_hca_off_numa",
            )
        self.batch += 1
        self.tokens_per_second = GOOD_TOKENS_PER_SECOND * ratio * self.rng.uniform(0.997, 1.003)
        if self.scenario.job_format == "deepspeed":
            write_deepspeed_lines(self.log_path, self.batch, self.tokens_per_second, wall)
        else:
            write_throughput_lines(self.log_path, self.batch, self.tokens_per_second, wall)

    @property
    def log_path(self) -> Path:
        """The trainer container's current log, where the kubelet puts it."""
        pod_dir = f"{NAMESPACE}_{self.pod}_{self.pod_uid}"
        return self.pod_logs / pod_dir / CONTAINER / f"{self.restarts}.log"


def port_bias(port: Port) -> float:
    """A fixed per-port share of healthy symbol errors (some links are noisier)."""
    return (sum(map(ord, port.device)) % 5) / 5.0


def cri_time(wall: float) -> str:
    """A CRI log timestamp (RFC 3339, nanoseconds, UTC) for ``wall`` (unix seconds)."""
    dt = datetime.datetime.fromtimestamp(wall, datetime.UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond:06d}000Z"


def write_throughput_lines(path: Path, batch: int, tokens_per_second: float, wall: float) -> None:
    """Append one Composer console-logger block to the container's log as the container
    runtime writes it (CRI: time, stream, ``F`` for a full line, the line)."""
    stamp = cri_time(wall)
    lines = (
        f"[batch={batch}/100000]:",
        f"\t Train time/batch: {batch}",
        f"\t Train throughput/tokens_per_sec: {tokens_per_second:.4f}",
        f"\t Train throughput/device/tokens_per_sec: {tokens_per_second / 32:.4f}",
    )
    with path.open("a") as f:
        f.write("".join(f"{stamp} stdout F {line}\n" for line in lines))


#: samples/s of the DeepSpeed job at full speed: the scale of the real timer lines in
#: tests/fixtures/throughput-logs/deepspeed (291-329 samples/s)
GOOD_SAMPLES_PER_SECOND = 303.1183


def write_deepspeed_lines(path: Path, batch: int, tokens_per_second: float, wall: float) -> None:
    """Append one line of DeepSpeed's throughput timer (``timer.py``, the format of the real
    lines in tests/fixtures/throughput-logs/deepspeed), its samples/s at the job's share of
    full speed, as the container runtime writes it."""
    samples = GOOD_SAMPLES_PER_SECOND * tokens_per_second / GOOD_TOKENS_PER_SECOND
    stamp = cri_time(wall)
    logged = datetime.datetime.fromtimestamp(wall, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S,%f")[
        :-3
    ]
    line = (
        f"[{logged}] [INFO] [timer.py:260:stop] epoch=0/micro_step={batch}/global_step={batch}, "
        f"RunningAvgSamplesPerSec={samples:.4f}, CurrSamplesPerSec={samples:.4f}, "
        "MemAllocated=17.54GB, MaxMemAllocated=66.97GB"
    )
    with path.open("a") as f:
        f.write(f"{stamp} stdout F {line}\n")


#: channels each rank connects per peer direction (a 4-node ring of 8-GPU nodes)
NCCL_CHANNELS = 4
NCCL_VERSION = "2.22.3+cuda12.4"


def write_nccl_init(node: LabNode, wall: float, *, sockets: bool, off_numa: bool = False) -> None:
    """Append what NCCL prints at a run's start with ``NCCL_DEBUG=INFO`` to the container's
    log, in the line formats of NCCL 2.22.3 (tests/fixtures/nccl-logs: nccl-tests#231,
    nccl#1538, sglang#4289): for each of the node's eight ranks (its process's pid in the
    prefix) the version, the NET/IB list (one HCA: the rank's own rail, as the pods'
    ``NCCL_IB_HCA==<rail>:1`` says), the chosen network, its channel connections (P2P/CUMEM
    to the next local GPU; to the neighbouring nodes on its rail ``via NET/IB/0/GDRDMA``) and
    ``Init COMPLETE``. ``sockets``: the run found no RDMA device in the pod (``NET/IB : No
    device found.``) and NCCL connects the nodes over ``NET/Socket/0`` instead. ``off_numa``:
    each rank's NCCL_IB_HCA names the rail of the GPU four places on, on the other socket."""
    stamp = cri_time(wall)
    world = node.scenario.nodes * 8
    lines = []
    for g, pid in enumerate(node.pids()):
        rank = node.index * 8 + g
        rail = RAILS[(g + 4) % 8 if off_numa else g][0]
        head = f"{node.pod}:{pid}:{pid + 40} [{g}] NCCL INFO "
        lines.append(f"{node.pod}:{pid}:{pid} [{g}] NCCL INFO NCCL version {NCCL_VERSION}")
        if sockets:
            lines += [
                head + "NET/IB : No device found.",
                head + f"NET/Socket : Using [0]eth0:10.244.{node.index}.{10 + g}<0>",
                head + "Using network Socket",
            ]
            via = "NET/Socket/0"
        else:
            lines += [
                head + f"NET/IB : Using [0]{rail}:1/RoCE [RO]; OOB eth0:10.244.{node.index}."
                f"{10 + g}<0>",
                head + "Using network IB",
            ]
            via = "NET/IB/0/GDRDMA"
        comm = f"0x{0x5000000 + rank * 0x1000:x}"
        bus = GPU_BUS_IDS[g]
        lines.append(
            head + f"ncclCommInitRank comm {comm} rank {rank} nranks {world} cudaDev {g} "
            f"nvmlDev {g} busId {bus}000 commId 0x551d06754c6bacf2 - Init START"
        )
        prev = (rank - 8) % world
        nxt = (rank + 8) % world
        for c in range(NCCL_CHANNELS):
            if g < 7:
                lines.append(
                    head + f"Channel {c:02d}/0 : {rank}[{g}] -> {rank + 1}[{g + 1}] via P2P/CUMEM"
                )
            lines.append(
                head + f"Channel {c:02d}/0 : {prev}[{g}] -> {rank}[{g}] [receive] via {via}"
            )
            lines.append(head + f"Channel {c:02d}/0 : {rank}[{g}] -> {nxt}[{g}] [send] via {via}")
        lines.append(
            head + f"ncclCommInitRank comm {comm} rank {rank} nranks {world} cudaDev {g} "
            f"nvmlDev {g} busId {bus}000 commId 0x551d06754c6bacf2 - Init COMPLETE"
        )
    node.log_path.parent.mkdir(parents=True, exist_ok=True)
    with node.log_path.open("a") as f:
        f.write("".join(f"{stamp} stdout F {line}\n" for line in lines))


def throughput_flags(nodes: Iterable[LabNode]) -> dict[str, list[str]]:
    """Per node, the agent flags that read its pods' logs: the kubelet's log directory.
    Which pods' logs, and their job name, come from attribution and the pod's API object,
    as in a DaemonSet (the default ``--throughput.pods=gpu``)."""
    return {n.name: [f"--path.pod-logs={n.pod_logs}"] for n in nodes}
