"""agent/workload/sampler.py and exporter/metrics/workload.py: GPU processes' CPU placement, NCCL
settings and
the node's GPUDirect RDMA path.

There is no GPU here, so every NVML snapshot below is *simulated*: built in the test from
the real PCI structure of the DGX fixture (its GPU addresses, in PCI order, numbered as
NVML would), with the PIDs under test injected as the GPUs' compute processes. The
topology (NUMA nodes 0-79 / 80-159, nearest NICs) is the DGX fixture's. Two kinds of
process stand behind those PIDs:

* live processes the test starts (``sleep`` with a chosen environment, including a secret,
  and a CPU affinity set with ``os.sched_setaffinity``), read through a reader rooted at the
  real ``/proc``: the read path (status, environ), secrets, a PID that exits
  mid-scan. This machine has 2 CPUs, which the DGX map puts on NUMA node 0, so a live
  process on a node-1 GPU is a real cross-NUMA case;
* the synthetic ``tests/fixtures/procfs-workload/proc`` files (see its PROVENANCE.md) for
  placements this machine cannot have (CPUs 80-159, both nodes).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from agent.core.errors import NoData
from agent.core.runner import Runner, SamplerSpec
from agent.core.sysfs import Issues, ReadIssue, RecordingReader, SysfsReader
from agent.nvml.snapshot import ComputeProcess, NvmlGpu, NvmlSnapshot
from agent.pci.sampler import PciSampler, PciSnapshot
from agent.workload.findings import (
    HcaEntry,
    IbHcaSpec,
    findings,
    ib_disabled,
    parse_ib_hca,
    workload_findings,
)
from agent.workload.gpudirect import (
    parse_kernel_release,
    parse_modules,
    parse_nvidia_version,
    read_gpudirect,
)
from agent.workload.placement import cpus_outside
from agent.workload.process import (
    ALLOWED_NAMES,
    MAX_VALUE_LENGTH,
    REDACTED,
    parse_cpus_allowed,
    parse_nccl_environ,
    safe_value,
)
from agent.workload.records import (
    GpuDirect,
    GpuPlacement,
    NcclSetting,
    PodIdentity,
    WorkloadProcess,
    WorkloadSnapshot,
)
from agent.workload.sampler import WorkloadSampler
from exporter.metrics import workload
from exporter.metrics.exposition import render_text
from exporter.metrics.spec import Families
from tests.promharness import promtool_check_metrics

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
WORKLOAD = FIXTURES / "procfs-workload"
PROC = WORKLOAD / "proc"
DGX_SYS = FIXTURES / "dgx-h100" / "sys"

#: the fake secrets of the fixture environs, and the live one
SECRET_WORDS = (
    "AWS_SECRET_ACCESS_KEY",
    "fixture-secret",
    "hf_fixturesecret",
    "HF_TOKEN",
    "NCCL_IB_HCA_PASSWORD",
    "DATABASE_URL",
    "shh",
)
LIVE_SECRET = "shh-live-secret-value"

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


# -- fixtures and helpers ----------------------------------------------------------------


@pytest.fixture(scope="module")
def dgx_pci() -> PciSnapshot:
    """The DGX fixture's PCI snapshot: 8 GPUs, 12 RDMA devices, NUMA 0 = 0-79, 1 = 80-159."""
    return PciSampler(SysfsReader(DGX_SYS)).sample()


def simulated_nvml(pci: PciSnapshot, processes: Mapping[int, list[int]]) -> NvmlSnapshot:
    """A simulated NVML snapshot: one NvmlGpu per GPU of the real PCI structure ``pci``,
    indexed in PCI bus order, with ``processes[index]`` as its compute processes."""
    gpus = tuple(
        NvmlGpu(
            index=i,
            pci_bus_id=g.address,
            uuid=f"GPU-00000000-0000-0000-0000-00000000000{i}",
            compute_processes=tuple(ComputeProcess(pid, None) for pid in processes.get(i, [])),
        )
        for i, g in enumerate(pci.by_role("gpu"))
    )
    return NvmlSnapshot(gpus=gpus)


#: the fixture processes on the DGX GPUs (and 4106, listed by NVML but without /proc files)
FIXTURE_GPUS = {0: [4101], 1: [4106], 3: [4102], 4: [4103], 5: [4104], 6: [4105], 7: [4105]}


def sampler_for(
    proc: SysfsReader | Path,
    pci: PciSnapshot | None,
    nvml: NvmlSnapshot | None,
    *,
    sys_root: Path = DGX_SYS,
    pods: Callable[[], Mapping[int, PodIdentity]] | None = None,
) -> WorkloadSampler:
    reader = proc if isinstance(proc, SysfsReader) else SysfsReader(proc)
    return WorkloadSampler(reader, SysfsReader(sys_root), lambda: nvml, lambda: pci, pods)


def series(snap: WorkloadSnapshot) -> Series:
    out = Families()
    workload.render(snap, out)
    return {
        (spec.name, tuple(zip(spec.labels, labels, strict=True))): value
        for spec, samples in out.items()
        for labels, value in samples
    }


def named(s: Series, name: str) -> dict[tuple[str, ...], float]:
    return {tuple(v for _, v in labels): value for (n, labels), value in s.items() if n == name}


def rendered(snap: WorkloadSnapshot) -> bytes:
    out = Families()
    workload.render(snap, out)
    return render_text(out)


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        for word in SECRET_WORDS:
            assert word not in text


# -- NCCL_IB_HCA -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "device", "port", "selected"),
    [
        ("mlx5", "mlx5_0", 1, True),  # prefix: every mlx5 device
        ("mlx5_1", "mlx5_1", 1, True),
        ("mlx5_1", "mlx5_10", 1, True),  # the prefix trap: mlx5_1 also names mlx5_10/11
        ("=mlx5_1", "mlx5_10", 1, False),  # exact
        ("=mlx5_1", "mlx5_1", 1, True),
        ("=mlx5_0:1,mlx5_1:1", "mlx5_1", 1, True),  # NCCL's own documented example
        ("=mlx5_0:1", "mlx5_0", 2, False),  # port suffix
        ("mlx5_0:", "mlx5_0", 3, True),  # empty port: any
        ("mlx5_0:x", "mlx5_0", 1, False),  # atoi("x") = 0: no port 0
        ("mlx5_0:1:0:0", "mlx5_0", 1, True),  # rail and plane fields ignored
        ("^mlx5_1", "mlx5_10", 1, False),  # exclusion by prefix
        ("^mlx5_1", "mlx5_2", 1, True),
        ("^=mlx5_1,mlx5_4", "mlx5_10", 1, True),  # exact exclusion spares mlx5_10
        ("^=mlx5_1,mlx5_4", "mlx5_4", 1, False),
        ("=^mlx5_0", "mlx5_0", 1, False),  # "=" then "^": "^mlx5_0" is a name
        ("", "mlx5_0", 1, True),  # empty list: everything
        (",,mlx5_2,", "mlx5_2", 1, True),  # empty entries skipped
        (":1", "mlx5_7", 1, True),  # an entry without a name is skipped: empty list
        ("^", "mlx5_0", 1, False),  # excluding the empty list excludes everything
    ],
)
def test_ib_hca_selection(value: str, device: str, port: int, selected: bool) -> None:
    assert parse_ib_hca(value).selects(device, port) is selected


@pytest.mark.parametrize(
    ("value", "spec"),
    [
        ("mlx5_0", IbHcaSpec(False, False, (HcaEntry("mlx5_0"),))),
        (
            "^=mlx5_0:1,mlx5_1",
            IbHcaSpec(True, True, (HcaEntry("mlx5_0", 1), HcaEntry("mlx5_1", None))),
        ),
        ("=mlx5_3:2,,", IbHcaSpec(False, True, (HcaEntry("mlx5_3", 2),))),
        ("mlx5_0: 1", IbHcaSpec(False, False, (HcaEntry("mlx5_0", 1),))),  # atoi skips blanks
        ("^", IbHcaSpec(True, False, ())),
    ],
)
def test_parse_ib_hca(value: str, spec: IbHcaSpec) -> None:
    assert parse_ib_hca(value) == spec


# -- environ -----------------------------------------------------------------------------


def test_environ_keeps_only_allowlisted_names_and_never_the_rest() -> None:
    raw = b"".join(
        e + b"\0"
        for e in (
            b"AWS_SECRET_ACCESS_KEY=shh",
            b"NCCL_IB_HCA==mlx5_0:1,mlx5_1:1",
            b"NCCL_IB_HCA_PASSWORD=shh",  # shares a prefix with an allowlisted name
            b"NCCL_DEBUG=",  # set, empty
            b"NCCL_IB_HCA=mlx5_9",  # second entry: getenv takes the first
            b"HF_TOKEN=\xff\xfeshh",  # not UTF-8: skipped without being decoded
            b"NCCL_SOCKET_IFNAME=eth0;$(curl evil)",  # unsafe characters
            b"NCCL_TOPO_FILE=" + b"a" * (MAX_VALUE_LENGTH + 1),  # too long
            b"NCCL_NET=\xc3\xa9",  # not ASCII
            b"NCCL_ALGO",  # no "=": not a definition
            b"=shh",
        )
    )
    got = parse_nccl_environ(raw)
    assert got == (
        NcclSetting("NCCL_DEBUG", ""),
        NcclSetting("NCCL_IB_HCA", "=mlx5_0:1,mlx5_1:1"),
        NcclSetting("NCCL_NET", REDACTED),
        NcclSetting("NCCL_SOCKET_IFNAME", REDACTED),
        NcclSetting("NCCL_TOPO_FILE", REDACTED),
    )
    assert_no_secret(repr(got))
    assert parse_nccl_environ(b"") == ()
    assert parse_nccl_environ(b"\0\0\0") == ()


@pytest.mark.parametrize(
    ("raw", "exported"),
    [
        (b"=mlx5_0:1,mlx5_1:1", "=mlx5_0:1,mlx5_1:1"),
        (b"^docker,lo", "^docker,lo"),
        (b"allreduce:tree;broadcast:ring", "allreduce:tree;broadcast:ring"),
        (
            b"/var/run/nvidia-topologyd/virtualTopology.xml",
            "/var/run/nvidia-topologyd/virtualTopology.xml",
        ),
        (b"AWS Libfabric", "AWS Libfabric"),
        (b"a" * MAX_VALUE_LENGTH, "a" * MAX_VALUE_LENGTH),
        (b"a" * (MAX_VALUE_LENGTH + 1), REDACTED),
        (b"x'y", REDACTED),
        (b'x"y', REDACTED),
        (b"$HOME", REDACTED),
        (b"a\nb", REDACTED),
        (b"a\\b", REDACTED),
        (b"caf\xc3\xa9", REDACTED),
    ],
)
def test_safe_value(raw: bytes, exported: str) -> None:
    assert safe_value(raw) == exported


def test_allowlist_is_nccl_names_only() -> None:
    assert all(n.startswith("NCCL_") for n in ALLOWED_NAMES)
    assert {"NCCL_IB_DISABLE", "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "NCCL_NET"} <= ALLOWED_NAMES
    assert "NCCL_DEBUG_FILE" not in ALLOWED_NAMES  # paths of the job's own files: not config


# -- status, modules, driver ------------------------------------------------------------


def test_parse_cpus_allowed() -> None:
    text = (PROC / "4103" / "status").read_text()
    assert parse_cpus_allowed(text) == (0, 1, 2, 3, 80, 81, 82, 83)
    assert parse_cpus_allowed("Name:\tx\nCpus_allowed_list:\t0-1\n") == (0, 1)
    with pytest.raises(ValueError, match="no Cpus_allowed_list"):
        parse_cpus_allowed("Name:\tx\nCpus_allowed:\t3\n")
    with pytest.raises(ValueError, match="empty"):
        parse_cpus_allowed("Cpus_allowed_list:\t\n")
    with pytest.raises(ValueError, match="cpulist"):
        parse_cpus_allowed("Cpus_allowed_list:\t0-x\n")


def test_parse_modules() -> None:
    text = (PROC / "modules").read_text()
    assert "nvidia_peermem" in parse_modules(text)
    assert "ib_uverbs" in parse_modules(text)
    loading = "nvidia_peermem 16384 0 - Loading 0x0000000000000000\nnvidia 1 1 - Live 0x0\n"
    assert parse_modules(loading) == frozenset({"nvidia"})
    assert parse_modules("old_kernel 16384 0\n") == frozenset({"old_kernel"})
    assert parse_modules("") == frozenset()


def test_parse_nvidia_version_and_kernel_release() -> None:
    g = WORKLOAD / "gpudirect"
    assert parse_nvidia_version((g / "open-dmabuf/proc/driver/nvidia/version").read_text())
    assert not parse_nvidia_version((g / "absent/proc/driver/nvidia/version").read_text())
    with pytest.raises(ValueError, match="NVRM"):
        parse_nvidia_version("something else\n")
    assert parse_kernel_release("5.15.0-161-generic\n") == (5, 15)
    assert parse_kernel_release("6.18.44-fc-v769") == (6, 18)
    with pytest.raises(ValueError, match="kernel"):
        parse_kernel_release("unknown")


@pytest.mark.parametrize(
    ("allowed", "local", "ratio"),
    [
        ((0, 1, 2, 3), range(80), 0.0),
        ((80, 81), range(80), 1.0),
        ((0, 1, 80, 81), range(80), 0.5),
        (range(160), range(80, 160), 0.5),
        ((5,), (), 1.0),
        ((), range(80), None),
    ],
)
def test_cpus_outside(allowed: tuple[int, ...], local: range, ratio: float | None) -> None:
    assert cpus_outside(allowed, local) == ratio


# -- GPUDirect ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "expected", "available"),
    [
        ("peermem", GpuDirect(True, "nvidia_peermem", "proprietary", (6, 8)), True),
        ("absent", GpuDirect(False, None, "proprietary", (6, 8)), False),
        ("open-dmabuf", GpuDirect(False, None, "open", (5, 15)), True),
        ("nv-peer-mem", GpuDirect(True, "nv_peer_mem", "proprietary", None), True),
        ("coming", GpuDirect(False, None, "proprietary", (6, 8)), False),
    ],
)
def test_gpudirect_fixture_trees(case: str, expected: GpuDirect, available: bool) -> None:
    root = WORKLOAD / "gpudirect" / case
    proc, sys_ = Issues(SysfsReader(root / "proc")), Issues(SysfsReader(root / "sys"))
    got = read_gpudirect(proc, sys_)
    assert got == expected
    assert got.available is available
    assert proc.items == [] and sys_.items == []


def test_gpudirect_unknown_states() -> None:
    assert GpuDirect(None, None, "proprietary", (6, 8)).available is None
    assert GpuDirect(False, None, None, (6, 8)).available is None  # version unreadable
    assert GpuDirect(False, None, "open", None).available is None  # kernel unknown
    assert GpuDirect(False, None, "open", (5, 11)).available is False
    assert GpuDirect(False, None, "absent", (6, 8)).available is False
    assert GpuDirect(True, "nvidia_peermem", None, None).available is True


@pytest.mark.parametrize(("case", "finding"), [("absent", True), ("peermem", False)])
def test_gpudirect_finding_needs_gpus_and_rdma_nics(
    dgx_pci: PciSnapshot, case: str, finding: bool
) -> None:
    root = WORKLOAD / "gpudirect" / case
    nvml = simulated_nvml(dgx_pci, {})
    snap = sampler_for(root / "proc", dgx_pci, nvml, sys_root=root / "sys").sample()
    assert snap.processes == ()
    kinds = [f.kind for f in findings(snap)]
    assert kinds == (["gpudirect_rdma_unavailable"] if finding else [])
    s = series(snap)
    assert named(s, "fabricscope_gpudirect_rdma_available") == {(): 0.0 if finding else 1.0}
    assert named(s, "fabricscope_gpudirect_rdma_peermem_loaded") == {(): 0.0 if finding else 1.0}


# -- the fixture processes ---------------------------------------------------------------


@pytest.fixture(scope="module")
def fixture_snapshot(dgx_pci: PciSnapshot) -> WorkloadSnapshot:
    return sampler_for(PROC, dgx_pci, simulated_nvml(dgx_pci, FIXTURE_GPUS)).sample()


def test_fixture_processes_placements(fixture_snapshot: WorkloadSnapshot) -> None:
    snap = fixture_snapshot
    by_pid = {p.pid: p for p in snap.processes}
    assert sorted(by_pid) == [4101, 4102, 4103, 4104, 4105]
    assert snap.issues == (ReadIssue("4106/status", "vanished", "No such file or directory"),)
    placements = {
        (p.pid, g.gpu): (
            g.pci_bus_id,
            g.numa_node,
            g.nearest_rdma_devices,
            g.nic_numa_nodes,
            g.cpu_gpu_numa_mismatch,
            g.cpu_nic_numa_mismatch,
        )
        for p in snap.processes
        for g in p.gpus
    }
    assert placements == {
        (4101, 0): ("0000:19:00.0", 0, ("mlx5_0", "mlx5_1", "mlx5_2"), (0,), 0.0, 0.0),
        # GPU 3's nearest NIC sits on the other node (the DGX fault): CPUs 80-83 are off the
        # GPU's node but on the NIC's
        (4102, 3): ("0000:5d:00.0", 0, ("mlx5_5",), (1,), 1.0, 0.0),
        (4103, 4): ("0000:9b:00.0", 1, ("mlx5_6", "mlx5_7", "mlx5_8"), (1,), 0.5, 0.5),
        (4104, 5): ("0000:bb:00.0", 1, ("mlx5_9",), (1,), 0.5, 0.5),
        (4105, 6): ("0000:cb:00.0", 1, ("mlx5_10",), (1,), 0.0, 0.0),
        (4105, 7): ("0000:db:00.0", 1, ("mlx5_11",), (1,), 0.0, 0.0),
    }
    assert {p.pid: p.pinned for p in snap.processes} == {
        4101: True,
        4102: True,
        4103: True,
        4104: False,
        4105: True,
    }
    assert by_pid[4101].nccl_env == (
        NcclSetting("NCCL_DEBUG", "INFO"),
        NcclSetting("NCCL_IB_HCA", "=mlx5_0:1"),
        NcclSetting("NCCL_SOCKET_IFNAME", "ens38np0"),
        NcclSetting("NCCL_TOPO_FILE", REDACTED),
    )
    assert snap.gpudirect == GpuDirect(True, "nvidia_peermem", "proprietary", (6, 8))
    assert [d.name for d in snap.rdma_devices] == [f"mlx5_{i}" for i in range(12)]


def test_fixture_findings(fixture_snapshot: WorkloadSnapshot) -> None:
    got = [(w.kind, w.pid, w.gpus) for w in workload_findings(fixture_snapshot)]
    assert sorted(got) == [
        ("nccl_ib_disabled", 4104, (5,)),
        ("nccl_ib_hca_no_match", 4105, (6, 7)),
        ("nccl_ib_hca_wrong_numa", 4102, (3,)),
        ("process_cpus_off_gpu_numa", 4102, (3,)),
        ("process_cpus_off_gpu_numa", 4103, (4,)),
    ]
    details = {(f.kind, f.subject): f.detail for f in findings(fixture_snapshot)}
    assert set(details) == {
        ("nccl_ib_disabled", "pid 4104"),
        ("nccl_ib_hca_no_match", "pid 4105"),
        ("nccl_ib_hca_wrong_numa", "pid 4102"),
        ("process_cpus_off_gpu_numa", "pid 4102"),
        ("process_cpus_off_gpu_numa", "pid 4103"),
    }
    assert details[("process_cpus_off_gpu_numa", "pid 4102")] == (
        "process 4102 uses GPU 3 (0000:5d:00.0) on NUMA node 0 but may run only on CPUs 80-83, "
        "none on the NUMA node of GPU 3 (0000:5d:00.0)."
    )
    assert details[("process_cpus_off_gpu_numa", "pid 4103")] == (
        "process 4103 uses GPU 4 (0000:9b:00.0) on NUMA node 1 but is pinned to CPUs "
        "0-3,80-83, 50% of them (0-3) off NUMA node 1."
    )
    assert "mlx5_5 (NUMA node 1)" in details[("nccl_ib_hca_wrong_numa", "pid 4102")]
    assert "NCCL_IB_DISABLE=1" in details[("nccl_ib_disabled", "pid 4104")]
    assert "NCCL_IB_HCA=mlx_0" in details[("nccl_ib_hca_no_match", "pid 4105")]
    assert_no_secret(*details.values())


def test_fixture_series(fixture_snapshot: WorkloadSnapshot) -> None:
    s = series(fixture_snapshot)
    assert named(s, "fabricscope_workload_cpu_gpu_numa_mismatch_ratio") == {
        ("0", "", "", ""): 0.0,
        ("3", "", "", ""): 1.0,
        ("4", "", "", ""): 0.5,
        ("5", "", "", ""): 0.5,
        ("6", "", "", ""): 0.0,
        ("7", "", "", ""): 0.0,
    }
    assert named(s, "fabricscope_workload_cpu_nic_numa_mismatch_ratio") == {
        ("0", "", "", ""): 0.0,
        ("3", "", "", ""): 0.0,
        ("4", "", "", ""): 0.5,
        ("5", "", "", ""): 0.5,
        ("6", "", "", ""): 0.0,
        ("7", "", "", ""): 0.0,
    }
    env = named(s, "fabricscope_workload_nccl_env_info")
    assert env == {
        ("0", "", "", "", "NCCL_DEBUG", "INFO"): 1.0,
        ("0", "", "", "", "NCCL_IB_HCA", "=mlx5_0:1"): 1.0,
        ("0", "", "", "", "NCCL_SOCKET_IFNAME", "ens38np0"): 1.0,
        ("0", "", "", "", "NCCL_TOPO_FILE", REDACTED): 1.0,
        ("3", "", "", "", "NCCL_IB_HCA", "mlx5_5"): 1.0,
        ("3", "", "", "", "NCCL_NET_GDR_LEVEL", "PIX"): 1.0,
        ("4", "", "", "", "NCCL_CROSS_NIC", "0"): 1.0,
        ("4", "", "", "", "NCCL_IB_HCA", "^=mlx5_6,mlx5_7,mlx5_8,mlx5_9,mlx5_10,mlx5_11"): 1.0,
        ("5", "", "", "", "NCCL_IB_DISABLE", "1"): 1.0,
        ("5", "", "", "", "NCCL_SOCKET_IFNAME", "^docker,lo"): 1.0,
        ("6", "", "", "", "NCCL_ALGO", "Ring,Tree"): 1.0,
        ("6", "", "", "", "NCCL_IB_HCA", "mlx_0"): 1.0,
        ("7", "", "", "", "NCCL_ALGO", "Ring,Tree"): 1.0,
        ("7", "", "", "", "NCCL_IB_HCA", "mlx_0"): 1.0,
    }
    counts = named(s, "fabricscope_workload_finding_processes")
    assert len(counts) == 6 * 4  # every kind for every (GPU, container) with a process
    assert {k: v for k, v in counts.items() if v} == {
        ("nccl_ib_disabled", "5", "", "", ""): 1.0,
        ("nccl_ib_hca_no_match", "6", "", "", ""): 1.0,
        ("nccl_ib_hca_no_match", "7", "", "", ""): 1.0,
        ("nccl_ib_hca_wrong_numa", "3", "", "", ""): 1.0,
        ("process_cpus_off_gpu_numa", "3", "", "", ""): 1.0,
        ("process_cpus_off_gpu_numa", "4", "", "", ""): 1.0,
    }
    assert named(s, "fabricscope_gpudirect_rdma_available") == {(): 1.0}
    text = rendered(fixture_snapshot)
    assert_no_secret(text.decode())
    if shutil.which("promtool") or Path("/usr/bin/promtool").exists():
        promtool_check_metrics(text)
    else:  # pragma: no cover - the CI image has promtool
        pytest.fail("promtool is not installed")


def test_no_secret_in_fixture_snapshot(fixture_snapshot: WorkloadSnapshot) -> None:
    assert_no_secret(repr(fixture_snapshot))


def test_pod_identity_labels_and_kubelet_cpus(dgx_pci: PciSnapshot) -> None:
    pods = {
        4101: PodIdentity("train", "job-a-0", "worker", cpu_ids=(0, 1, 2, 3)),
        4102: PodIdentity("train", "job-a-1", "worker", cpu_ids=(80, 81, 82, 83)),
        4105: PodIdentity("infer", "svc-0", "server"),
    }
    nvml = simulated_nvml(dgx_pci, FIXTURE_GPUS)
    snap = sampler_for(PROC, dgx_pci, nvml, pods=lambda: pods).sample()
    by_pid = {p.pid: p for p in snap.processes}
    assert by_pid[4101].gpus[0].container_cpu_gpu_numa_mismatch == 0.0
    assert by_pid[4102].gpus[0].container_cpu_gpu_numa_mismatch == 1.0
    assert by_pid[4105].gpus[0].container_cpu_gpu_numa_mismatch is None  # no cpu_ids
    detail = next(
        f.detail
        for f in findings(snap)
        if (f.kind, f.subject) == ("process_cpus_off_gpu_numa", "pid 4102")
    )
    assert detail.startswith("process 4102 (train/job-a-1/worker) uses GPU 3")
    assert detail.endswith(
        "; the container's CPUs from kubelet (80-83) are also off the GPU's NUMA node."
    )
    ratio = named(series(snap), "fabricscope_workload_cpu_gpu_numa_mismatch_ratio")
    assert ratio[("0", "train", "job-a-0", "worker")] == 0.0
    assert ratio[("3", "train", "job-a-1", "worker")] == 1.0
    assert ratio[("6", "infer", "svc-0", "server")] == 0.0
    assert ratio[("4", "", "", "")] == 0.5  # not attributed: empty pod labels


def test_pod_mapping_failure_costs_only_pod_labels(
    dgx_pci: PciSnapshot, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> Mapping[int, PodIdentity]:
        raise ConnectionError("kubelet socket gone")

    sampler = sampler_for(PROC, dgx_pci, simulated_nvml(dgx_pci, FIXTURE_GPUS), pods=broken)
    with caplog.at_level(logging.INFO, logger="agent.workload.sampler"):
        first = sampler.sample()
        second = sampler.sample()
    for snap in (first, second):
        assert len(snap.processes) == 5
        assert all(p.pod is None for p in snap.processes)
        assert ReadIssue("pods", "io", "ConnectionError") in snap.issues
    assert caplog.text.count("pod mapping failed") == 1  # a state change, logged once


# -- live processes ----------------------------------------------------------------------


@pytest.fixture
def spawn() -> Iterator[Callable[[dict[str, str], set[int]], subprocess.Popen[bytes]]]:
    """Starts ``sleep`` with exactly ``env`` and pins it to ``cpus``; kills them all after."""
    started: list[subprocess.Popen[bytes]] = []
    sleep = shutil.which("sleep")
    assert sleep is not None

    def start(env: dict[str, str], cpus: set[int]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sleep, "60"], env=env)  # returns after exec succeeded
        started.append(proc)
        os.sched_setaffinity(proc.pid, cpus)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()


def _host_cpus() -> set[int]:
    return set(os.sched_getaffinity(0))


def test_live_processes_read_through_real_proc(
    dgx_pci: PciSnapshot,
    spawn: Callable[[dict[str, str], set[int]], subprocess.Popen[bytes]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    cpus = sorted(_host_cpus())
    pinned_cpu = cpus[-1]
    a = spawn(
        {
            "PATH": "/usr/bin:/bin",
            "NCCL_IB_HCA": "=mlx5_6:1",
            "NCCL_DEBUG": "WARN",
            "NCCL_SOCKET_IFNAME": "eth0`reboot`",
            "AWS_SECRET_ACCESS_KEY": LIVE_SECRET,
        },
        {pinned_cpu},
    )
    b = spawn({"PATH": "/usr/bin:/bin", "AWS_SECRET_ACCESS_KEY": LIVE_SECRET}, set(cpus))
    # a drives GPU 4 (NUMA node 1: CPUs 80-159), b GPU 0 (NUMA node 0: CPUs 0-79)
    gone = spawn({"PATH": "/usr/bin:/bin", "AWS_SECRET_ACCESS_KEY": LIVE_SECRET}, set(cpus))
    gone.kill()
    gone.wait()  # its issue goes through the runner's log too
    nvml = simulated_nvml(dgx_pci, {4: [a.pid], 0: [b.pid, gone.pid]})
    runner = Runner([SamplerSpec(sampler_for(Path("/proc"), dgx_pci, nvml), 60, 10)])
    with caplog.at_level(logging.DEBUG):
        status = runner.run_once()["workload"]
        assert isinstance(status.snapshot, WorkloadSnapshot)
        snap = status.snapshot
        text = rendered(snap).decode()
        found = [w.finding for w in workload_findings(snap)]
    by_pid = {p.pid: p for p in snap.processes}
    assert set(by_pid) == {a.pid, b.pid}
    assert f"cannot use {gone.pid}/status (vanished" in caplog.text
    pa, pb = by_pid[a.pid], by_pid[b.pid]
    # the read path: what the kernel says, and what was set
    assert pa.allowed_cpus == tuple(sorted(os.sched_getaffinity(a.pid))) == (pinned_cpu,)
    assert pb.allowed_cpus == tuple(cpus)
    assert pa.nccl_env == (
        NcclSetting("NCCL_DEBUG", "WARN"),
        NcclSetting("NCCL_IB_HCA", "=mlx5_6:1"),
        NcclSetting("NCCL_SOCKET_IFNAME", REDACTED),
    )
    assert pb.nccl_env == ()
    # the judgement, on the DGX map: a's only CPU is on node 0, its GPU on node 1
    assert [(g.gpu, g.numa_node, g.cpu_gpu_numa_mismatch) for g in pa.gpus] == [(4, 1, 1.0)]
    assert [(g.gpu, g.numa_node, g.cpu_gpu_numa_mismatch) for g in pb.gpus] == [(0, 0, 0.0)]
    # mlx5_6 is on node 1 with GPU 4: no HCA finding (the node-level GPUDirect finding
    # depends on this machine's modules, so only per-process findings are compared)
    assert [(f.kind, f.subject) for f in found] == [("process_cpus_off_gpu_numa", f"pid {a.pid}")]
    assert 'value="=mlx5_6:1",variable="NCCL_IB_HCA"' in text
    # the secret: never in the snapshot, the metrics, the findings or the log
    for where in (repr(snap), text, repr(found), caplog.text):
        assert LIVE_SECRET not in where
        assert "AWS_SECRET_ACCESS_KEY" not in where
        assert "reboot" not in where


class _ExitsBeforeEnviron(SysfsReader):
    """The real /proc, except that the process ``victim`` is killed and reaped just before
    its environ is read: a process exiting mid-scan, by the kernel's own rules."""

    def __init__(self, victim: subprocess.Popen[bytes]) -> None:
        super().__init__("/proc")
        self.victim = victim

    def read_bytes(self, rel: str) -> bytes:
        if rel == f"{self.victim.pid}/environ":
            self.victim.kill()
            self.victim.wait()
        return super().read_bytes(rel)


def test_process_exiting_mid_scan_costs_only_itself(
    dgx_pci: PciSnapshot,
    spawn: Callable[[dict[str, str], set[int]], subprocess.Popen[bytes]],
) -> None:
    env = {"PATH": "/usr/bin:/bin", "NCCL_DEBUG": "INFO"}
    gone = spawn(env, _host_cpus())
    gone.kill()
    gone.wait()  # exited before the scan: no /proc/<pid> at all
    victim = spawn(env, _host_cpus())
    survivor = spawn(env, _host_cpus())
    nvml = simulated_nvml(dgx_pci, {0: [gone.pid, victim.pid], 1: [survivor.pid]})
    snap = sampler_for(_ExitsBeforeEnviron(victim), dgx_pci, nvml).sample()
    assert [p.pid for p in snap.processes] == [survivor.pid]
    assert snap.processes[0].nccl_env == (NcclSetting("NCCL_DEBUG", "INFO"),)
    assert sorted((i.path, i.reason) for i in snap.issues) == sorted(
        [(f"{gone.pid}/status", "vanished"), (f"{victim.pid}/environ", "vanished")]
    )


class _EnvironDenied(SysfsReader):
    """A procfs reader on which every environ read fails as it does for an agent without
    CAP_SYS_PTRACE reading another user's process (EACCES)."""

    def read_bytes(self, rel: str) -> bytes:
        if rel.endswith("/environ"):
            raise PermissionError(errno.EACCES, "Permission denied", rel)
        return super().read_bytes(rel)


def test_environ_permission_denied_is_an_issue_not_a_crash(dgx_pci: PciSnapshot) -> None:
    nvml = simulated_nvml(dgx_pci, FIXTURE_GPUS)
    snap = sampler_for(_EnvironDenied(PROC), dgx_pci, nvml).sample()
    assert len(snap.processes) == 5
    assert all(p.nccl_env is None for p in snap.processes)
    denied = sorted((i for i in snap.issues if i.reason == "permission"), key=lambda i: i.path)
    assert denied == [
        ReadIssue(f"{pid}/environ", "permission", "Permission denied")
        for pid in (4101, 4102, 4103, 4104, 4105)
    ]
    # CPU judgements stand; NCCL ones cannot be made
    assert sorted({f.kind for f in findings(snap)}) == ["process_cpus_off_gpu_numa"]
    assert named(series(snap), "fabricscope_workload_nccl_env_info") == {}


# -- sampler contract --------------------------------------------------------------------


def test_no_gpu_process_and_no_rdma_nic_is_nodata(dgx_pci: PciSnapshot) -> None:
    with pytest.raises(NoData):
        sampler_for(PROC, None, None).sample()
    no_nics = PciSnapshot(devices=dgx_pci.by_role("gpu"), numa_nodes=dgx_pci.numa_nodes)
    with pytest.raises(NoData):
        sampler_for(PROC, no_nics, simulated_nvml(no_nics, {})).sample()
    # RDMA NICs but no GPU process: the node's GPUDirect state alone
    snap = sampler_for(PROC, dgx_pci, simulated_nvml(dgx_pci, {})).sample()
    assert snap.processes == () and snap.gpudirect.available is True


def test_gpu_process_without_pci_snapshot_has_no_numa_judgement(dgx_pci: PciSnapshot) -> None:
    nvml = simulated_nvml(dgx_pci, {0: [4101]})
    snap = sampler_for(PROC, None, nvml).sample()
    (proc,) = snap.processes
    assert proc.pinned is None
    assert [(g.gpu, g.numa_node, g.cpu_gpu_numa_mismatch) for g in proc.gpus] == [(0, None, None)]
    assert findings(snap) == []
    assert named(series(snap), "fabricscope_workload_cpu_gpu_numa_mismatch_ratio") == {}


def test_recording_reader_is_refused() -> None:
    with pytest.raises(ValueError, match="secrets"):
        WorkloadSampler(RecordingReader(PROC), SysfsReader(DGX_SYS), lambda: None, lambda: None)


def test_fixture_tree_regenerates(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(WORKLOAD / "build_fixture.py"), str(tmp_path)], check=True)
    built = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    committed = {
        p.relative_to(WORKLOAD): p.read_bytes()
        for p in WORKLOAD.rglob("*")
        if p.is_file()
        and p.name not in ("build_fixture.py", "PROVENANCE.md")
        and "__pycache__" not in p.parts
    }
    assert built == committed


# -- pure judgements ---------------------------------------------------------------------


def _process(
    env: dict[str, str],
    *,
    pid: int = 1,
    gpus: tuple[GpuPlacement, ...] = (),
    allowed_cpus: tuple[int, ...] = (0,),
    pinned: bool = True,
) -> WorkloadProcess:
    settings = tuple(sorted(NcclSetting(k, v) for k, v in env.items()))
    return WorkloadProcess(pid, gpus, allowed_cpus, pinned, settings)


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"NCCL_IB_DISABLE": "1"}, "NCCL_IB_DISABLE=1"),
        ({"NCCL_IB_DISABLE": "0x1"}, "NCCL_IB_DISABLE=0x1"),  # strtoll base 0
        ({"NCCL_IB_DISABLE": "0"}, None),
        ({"NCCL_IB_DISABLE": "yes"}, None),  # NCCL keeps its default for an unparsable value
        ({"NCCL_IB_DISABLE": REDACTED}, None),
        ({"NCCL_NET": "Socket"}, "NCCL_NET=Socket"),
        ({"NCCL_NET": "socket"}, "NCCL_NET=socket"),  # strcasecmp
        ({"NCCL_NET": "IB"}, None),
        ({}, None),
    ],
)
def test_ib_disabled(env: dict[str, str], why: str | None) -> None:
    assert ib_disabled(_process(env)) == why


def test_one_process_on_gpus_of_both_nodes(dgx_pci: PciSnapshot) -> None:
    """A process driving GPU 0 (node 0) and GPU 4 (node 1) pinned to node 0: GPU 4 has no
    CPU of its node, GPU 0 is fine; the same process unpinned is no finding."""
    gpus = (
        GpuPlacement(0, "0000:19:00.0", None, 0, cpu_gpu_numa_mismatch=0.0),
        GpuPlacement(4, "0000:9b:00.0", None, 1, cpu_gpu_numa_mismatch=1.0),
    )
    pinned = _process({}, pid=7, gpus=gpus, allowed_cpus=tuple(range(80)), pinned=True)
    snap = WorkloadSnapshot(processes=(pinned,), numa_nodes=dgx_pci.numa_nodes)
    assert [(w.kind, w.pid, w.gpus) for w in workload_findings(snap)] == [
        ("process_cpus_off_gpu_numa", 7, (4,))
    ]
    unpinned = _process({}, pid=7, gpus=gpus, allowed_cpus=tuple(range(160)), pinned=False)
    snap = WorkloadSnapshot(processes=(unpinned,), numa_nodes=dgx_pci.numa_nodes)
    assert workload_findings(snap) == []


def test_gpudirect_finding_text(dgx_pci: PciSnapshot) -> None:
    root = WORKLOAD / "gpudirect" / "absent"
    nvml = simulated_nvml(dgx_pci, {})
    snap = sampler_for(root / "proc", dgx_pci, nvml, sys_root=root / "sys").sample()
    (f,) = findings(snap)
    assert (f.kind, f.subject) == ("gpudirect_rdma_unavailable", "node")
    assert f.detail == (
        "the node has GPUs and 12 RDMA devices but neither nvidia_peermem nor nv_peer_mem is "
        "loaded and the proprietary NVIDIA kernel module offers no DMA-BUF path: NCCL stages "
        "RDMA traffic through host memory (modprobe nvidia_peermem)."
    )
    # without RDMA NICs there is nothing to stage: no finding
    no_nics = PciSnapshot(devices=dgx_pci.by_role("gpu"), numa_nodes=dgx_pci.numa_nodes)
    nvml = simulated_nvml(no_nics, {0: [4101]})
    snap = sampler_for(PROC, no_nics, nvml, sys_root=root / "sys").sample()
    assert snap.gpudirect.available is False
    assert [x.kind for x in findings(snap)] == []


def test_a_job_beside_the_agent_is_on_its_loopback_whatever_init_runs_in(tmp_path: Path) -> None:
    """On the lent GPU machines the shell that starts the agent and the job runs in a network
    namespace of its own, not init's: the job beside the agent is on the agent's loopback
    (its RAS service answered there), so the agent's own namespace counts as well as init's.
    Real processes: "init" sleeps in a fresh namespace, the job in the test's own."""
    import time

    from agent.core.sysfs import SysfsReader
    from agent.workload.process import loopback_netns, read_netns

    ns = f"fs-wl-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    init = job = None
    try:
        init = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "30"])
        job = subprocess.Popen(["sleep", "30"])
        mine = os.readlink("/proc/self/ns/net")
        for _ in range(100):  # the exec'd sleep is in the namespace once its link says so
            if os.readlink(f"/proc/{init.pid}/ns/net") != mine:
                break
            time.sleep(0.05)
        root = tmp_path / "proc"
        root.mkdir()
        (root / "1").symlink_to(f"/proc/{init.pid}")
        (root / "self").symlink_to(f"/proc/{os.getpid()}")
        (root / "4242").symlink_to(f"/proc/{job.pid}")
        proc = SysfsReader(root)
        seen = loopback_netns(proc)
        assert seen == {os.readlink(f"/proc/{init.pid}/ns/net"), mine}
        assert read_netns(proc, 4242) in seen
        # a fixture tree without self: init's alone
        (root / "self").unlink()
        assert loopback_netns(SysfsReader(root)) == {os.readlink(f"/proc/{init.pid}/ns/net")}
    finally:
        for p in (init, job):
            if p is not None:
                p.kill()
                p.wait()
        subprocess.run(["ip", "netns", "delete", ns], check=False)
