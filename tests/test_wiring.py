"""The composition: samplers that join other samplers' latest data (attribution, workload,
the probe's view of pod-allocated GPUs), the order of a --once pass, and the flags that
turn Kubernetes features on. The NVML snapshots here start from the real H200 x2
recording (tests/fixtures/nvml) with compute processes EDITED in, as marked."""

from __future__ import annotations

import dataclasses
from functools import partial
from pathlib import Path

import pytest

from agent.config import AgentConfig, ProbeSettings, Sampling
from agent.core.isolation import ChildSpec, IsolatedSampler
from agent.core.runner import SamplerStatus
from agent.core.sysfs import SysfsReader
from agent.kubernetes.allocation import GpuAllocation
from agent.kubernetes.attribution import AttributionSnapshot, ContainerCpus, GpuAttribution
from agent.nvml.record import ReplayNvml, load
from agent.nvml.sampler import NvmlSampler
from agent.nvml.snapshot import ComputeProcess, NvmlSnapshot
from agent.samplers import DEPENDENT, Latest, build_specs, probe_allocation
from agent.workload.records import PodIdentity
from agent.workload.sampler import pod_identities
from exporter.app import AgentApp
from tests.agentrun import fabricscope

RECORDING = Path(__file__).resolve().parent / "fixtures" / "nvml" / "h200x2.recording.json"


def h200_with_processes(procs: dict[int, tuple[int, ...]]) -> NvmlSnapshot:
    """The recorded node, its GPUs' compute-process lists EDITED to ``procs``."""
    sampler = NvmlSampler(lambda: ReplayNvml(load(RECORDING)), watch_xid=False)
    try:
        snap = sampler.sample()
    finally:
        sampler.close()
    gpus = tuple(
        dataclasses.replace(
            g, compute_processes=tuple(ComputeProcess(p, None) for p in procs.get(g.index, ()))
        )
        for g in snap.gpus
    )
    return dataclasses.replace(snap, gpus=gpus)


def attributed(*entries: tuple[int, str, str], cpus: tuple[int, ...] = ()) -> AttributionSnapshot:
    gpus = tuple(
        GpuAttribution("ml", pod, ctr, f"GPU-{gpu}", gpu, None, "podresources")
        for gpu, pod, ctr in entries
    )
    return AttributionSnapshot(
        gpus=gpus, cpus=tuple(ContainerCpus("ml", p, c, cpus) for _, p, c in entries if cpus)
    )


def test_a_process_on_one_containers_gpus_gets_that_pod() -> None:
    nvml = h200_with_processes({0: (100,), 1: (100, 200)})
    pods = attributed((0, "train-0", "worker"), (1, "train-0", "worker"), cpus=(4, 5))
    assert pod_identities(nvml, pods) == {
        100: PodIdentity("ml", "train-0", "worker", (4, 5)),
        200: PodIdentity("ml", "train-0", "worker", (4, 5)),
    }


def test_ambiguous_or_unattributed_processes_get_no_pod() -> None:
    nvml = h200_with_processes({0: (100,), 1: (100, 300)})
    # GPU 0 and GPU 1 belong to different pods: process 100 spans both, 300 is on GPU 1 only
    pods = attributed((0, "a", "w"), (1, "b", "w"))
    assert pod_identities(nvml, pods) == {300: PodIdentity("ml", "b", "w", None)}
    assert pod_identities(nvml, None) == {} and pod_identities(None, pods) == {}
    # a GPU the kubelet did not allocate: its process is nobody's
    assert pod_identities(h200_with_processes({1: (7,)}), attributed((0, "a", "w"))) == {}


def test_the_probe_learns_the_gpus_pods_hold_failing_closed() -> None:
    """The probe's view of pod-held GPUs (agent.samplers.probe_allocation): known from the
    latest attribution pass; unknown before its first pass and after a failed one; known and
    empty where no pod can hold a GPU (attribution found no kubelet and no node name, or is
    off on a node without one)."""
    pods = attributed((1, "train-0", "worker"))
    status: dict[str, SamplerStatus] = {}
    snaps: dict[str, AttributionSnapshot] = {}
    latest = Latest()
    latest.bind(snaps.get, status.get)
    on = partial(probe_allocation, True, "node-a", latest)
    assert on() == GpuAllocation(unknown="no_attribution")  # the runner has not run it yet
    status["attribution"] = SamplerStatus(
        "attribution", attempts_total=1, success=True, hardware_present=True, snapshot=pods
    )
    snaps["attribution"] = pods
    assert on() == GpuAllocation(frozenset({1}))
    del snaps["attribution"]  # the latest pass failed or timed out
    status["attribution"] = SamplerStatus("attribution", attempts_total=2, success=False)
    assert on() == GpuAllocation(unknown="no_attribution")
    # NoData: neither a kubelet socket nor a node name: bare metal
    status["attribution"] = SamplerStatus("attribution", attempts_total=3, success=True)
    assert on() == GpuAllocation()
    # attribution off: known only where this is no Kubernetes node
    assert probe_allocation(False, None, latest) == GpuAllocation()
    assert probe_allocation(False, "node-a", latest) == GpuAllocation(unknown="no_attribution")


def test_latest_is_typed_and_absent_until_bound() -> None:
    latest = Latest()
    nvml = latest.of("nvml", NvmlSnapshot)
    assert nvml() is None
    snap = h200_with_processes({})
    latest.bind(lambda name: snap if name == "nvml" else None)
    assert nvml() is snap
    assert latest.of("nvml", AttributionSnapshot)() is None  # wrong type: absent, not a lie


def test_once_runs_joining_samplers_after_the_data_they_join(dgx_sys_root: Path) -> None:
    """The workload sampler sees the PCI pass of the same --once run (its findings need the
    topology): without ordering it would find no PCI snapshot and report no RDMA NIC."""
    config = AgentConfig(sampling=Sampling(frozenset({"pci", "workload", "infiniband"})))
    latest = Latest()
    app = AgentApp(build_specs(config, SysfsReader(dgx_sys_root), latest=latest), latest)
    body = app.run_once().decode()
    assert 'fabricscope_sampler_hardware_present{sampler="workload"} 1.0' in body
    # throughput needs attribution; ras needs workload's processes
    assert DEPENDENT == ("attribution", "workload", "throughput", "ras")


def test_kubernetes_probe_membership_excludes_the_peers_file() -> None:
    with pytest.raises(ValueError, match="two membership sources"):
        ProbeSettings(
            enabled=True,
            peers_file="/x",
            kubernetes_selector="app=fabricscope",
            listen_address="10.0.0.1",
            secret_file="/s",
        )
    with pytest.raises(ValueError, match=r"needs --probe\.listen-address"):
        ProbeSettings(enabled=True, kubernetes_selector="app=fabricscope")


def test_attribution_without_socket_or_node_name_is_quietly_absent(tmp_path: Path) -> None:
    proc = fabricscope(
        [
            "agent",
            "--once",
            f"--path.sysfs={tmp_path}",
            f"--path.procfs={tmp_path}",
            f"--kubelet.pod-resources-socket={tmp_path}/no.sock",
            "--kubernetes.node-name=",
        ]
    )
    assert proc.returncode == 0, proc.stderr
    assert 'fabricscope_sampler_success{sampler="attribution"} 1.0' in proc.stdout
    assert 'fabricscope_sampler_hardware_present{sampler="attribution"} 0.0' in proc.stdout
    assert "Traceback" not in proc.stderr


def test_nvml_rotation_settings_reach_the_sampler(tmp_path: Path) -> None:
    from agent.config import NvmlSettings
    from agent.samplers import build_samplers

    config = AgentConfig(
        sampling=Sampling(frozenset({"nvml"}), 15.0, 4.0), nvml=NvmlSettings(6, 36, isolate=False)
    )
    (sampler,) = build_samplers(config, SysfsReader(tmp_path), watch_xid=False)
    assert isinstance(sampler, NvmlSampler)
    assert (sampler.link_error_rotation, sampler.slow_error_rotation) == (6, 36)
    # isolated (the default): the same settings travel to the child, with the timeout
    config = dataclasses.replace(config, nvml=NvmlSettings(6, 36))
    (isolated,) = build_samplers(config, SysfsReader(tmp_path), watch_xid=False)
    assert isinstance(isolated, IsolatedSampler)
    assert isolated.timeout_seconds == 4.0
    assert isolated.spec == ChildSpec(
        "agent.nvml.sampler:child_sampler",
        {"watch_xid": False, "link_error_rotation": 6, "slow_error_rotation": 36},
    )
    with pytest.raises(ValueError, match="rotations must be >= 1"):
        NvmlSettings(0, 36)
