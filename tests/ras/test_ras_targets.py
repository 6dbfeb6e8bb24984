"""Which RAS endpoints the agent asks (agent/ras/targets.py), and this node's own addresses
(agent/ras/addresses.py) read from a real network namespace the test makes."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.config import RasEndpointFlag, parse_hostport, parse_ras_endpoint
from agent.core.sysfs import SysfsReader
from agent.kubernetes.podwatch import PodIndex, PodMeta
from agent.ras.addresses import NodeAddress, parse_fib_trie, parse_routes, read_node_addresses
from agent.ras.targets import Endpoint, LocalProcess, plan
from agent.workload.records import (
    GpuPlacement,
    NcclSetting,
    PodIdentity,
    WorkloadProcess,
    WorkloadSnapshot,
)


def proc(
    pid: int,
    gpu: int,
    *,
    env: dict[str, str] | None = None,
    rank: int | None = None,
    host_net: bool | None = True,
    pod: tuple[str, str] | None = None,
) -> WorkloadProcess:
    return WorkloadProcess(
        pid=pid,
        gpus=(GpuPlacement(gpu, f"0000:0{gpu}:00.0", f"GPU-{gpu}", 0),),
        allowed_cpus=(0, 1),
        pinned=False,
        nccl_env=None if env is None else tuple(sorted(NcclSetting(k, v) for k, v in env.items())),
        pod=PodIdentity(pod[0], pod[1], "trainer") if pod else None,
        ns_pid=pid - 1000 if pod else pid,
        launch_rank=rank,
        host_network=host_net,
    )


def snap(*procs: WorkloadProcess) -> WorkloadSnapshot:
    return WorkloadSnapshot(processes=procs, has_gpus=True)


def meta(
    name: str,
    *,
    host_network: bool = False,
    ip: str | None = "10.244.1.7",
    owner: str = "llama",
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> PodMeta:
    return PodMeta(
        uid=f"uid-{name}",
        namespace="ml",
        name=name,
        labels=tuple(sorted((labels or {}).items())),
        annotations=tuple(sorted((annotations or {}).items())),
        owner=owner,
        host_network=host_network,
        ip=ip,
    )


def states(eps: tuple[Endpoint, ...]) -> list[tuple[str, str, str, int]]:
    return [(e.label, e.job_name, e.state, len(e.processes)) for e in eps]


def test_bare_metal_rank0_node_asks_its_loopback() -> None:
    eps = plan(snap(*(proc(100 + r, r, env={}, rank=r) for r in range(4))), None)
    assert states(eps) == [("127.0.0.1:28028", "", "queried", 4)]
    assert eps[0].processes[0] == LocalProcess(100, 100, ((0, "0000:00:00.0"),))


def test_a_node_without_rank_0_leaves_it_to_the_other_node() -> None:
    eps = plan(snap(*(proc(100 + r, r, env={}, rank=4 + r) for r in range(4))), None)
    assert states(eps) == [("127.0.0.1:28028", "", "other_node", 4)]


def test_without_a_readable_rank_nobody_can_tell_unless_asked_to() -> None:
    procs = [proc(100 + r, r) for r in range(2)]  # environ unreadable
    assert states(plan(snap(*procs), None)) == [("127.0.0.1:28028", "", "no_leader", 2)]
    assert states(plan(snap(*procs), None, leader="always"))[0][2] == "queried"


def test_ras_disabled_and_custom_port() -> None:
    eps = plan(
        snap(
            proc(100, 0, env={"NCCL_RAS_ENABLE": "0"}, rank=0),
            proc(101, 1, env={"NCCL_RAS_ADDR": "localhost:29000"}, rank=0),
        ),
        None,
    )
    assert states(eps) == [("", "", "disabled", 1), ("127.0.0.1:29000", "", "queried", 1)]


def test_a_pod_network_job_is_reached_only_where_it_opted_in() -> None:
    index = PodIndex(
        [
            meta("a-0", ip="10.244.1.7"),
            meta("b-0", ip="10.244.1.8", owner="gpt"),
            meta(
                "c-0",
                ip="10.244.1.9",
                owner="bert",
                annotations={"fabricscope.io/nccl-ras-port": "28100"},
            ),
            meta("d-0", ip="10.244.1.10", owner="t5"),
        ]
    )
    eps = plan(
        snap(
            # default: RAS on the pod's own loopback
            proc(1100, 0, env={}, rank=0, host_net=False, pod=("ml", "a-0")),
            # listening on every address of the pod: its IP from the pod watch
            proc(
                1101,
                1,
                env={"NCCL_RAS_ADDR": "0.0.0.0:28028"},
                rank=0,
                host_net=False,
                pod=("ml", "b-0"),
            ),
            # the annotation (NCCL_RAS_ADDR set where the agent cannot read it)
            proc(1102, 2, rank=0, host_net=False, pod=("ml", "c-0")),
            # a name is never resolved
            proc(
                1103,
                3,
                env={"NCCL_RAS_ADDR": "trainer.local:28028"},
                rank=0,
                host_net=False,
                pod=("ml", "d-0"),
            ),
        ),
        index,
    )
    assert states(eps) == [
        ("", "llama", "not_reachable", 1),
        ("", "t5", "not_reachable", 1),
        ("10.244.1.8:28028", "gpt", "queried", 1),
        ("10.244.1.9:28100", "bert", "queried", 1),
    ]
    assert eps[2].processes[0].address == "10.244.1.8"


def test_host_network_pods_and_the_pod_leader_annotation() -> None:
    index = PodIndex(
        [meta("a-0", host_network=True, annotations={"fabricscope.io/nccl-ras-leader": "true"})]
    )
    eps = plan(snap(proc(1100, 0, host_net=None, pod=("ml", "a-0"))), index)
    assert states(eps) == [("127.0.0.1:28028", "llama", "queried", 1)]
    assert eps[0].processes[0].address is None  # the node's own addresses


def test_two_jobs_on_one_endpoint_are_not_asked() -> None:
    index = PodIndex([meta("a-0", host_network=True), meta("b-0", host_network=True, owner="x")])
    eps = plan(
        snap(
            proc(1100, 0, env={}, rank=0, pod=("ml", "a-0")),
            proc(1101, 1, env={}, rank=0, pod=("ml", "b-0")),
        ),
        index,
    )
    assert states(eps) == [("127.0.0.1:28028", "", "shared", 2)]


def test_a_static_endpoint_is_asked_whatever_the_rest_says() -> None:
    eps = plan(
        snap(proc(100, 0, env={}, rank=3)),
        None,
        static=[RasEndpointFlag("127.0.0.1", 28028, "train")],
    )
    assert states(eps) == [("127.0.0.1:28028", "train", "queried", 1)]
    eps = plan(None, None, static=[RasEndpointFlag("::1", 28028)])
    assert states(eps) == [("[::1]:28028", "", "queried", 0)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("localhost:28028", ("localhost", 28028)),
        ("10.0.0.1", ("10.0.0.1", 28028)),
        ("[fd00::1]:1234", ("fd00::1", 1234)),
        ("fd00::1", ("fd00::1", 28028)),
    ],
)
def test_parse_hostport(text: str, expected: tuple[str, int]) -> None:
    assert parse_hostport(text) == expected


@pytest.mark.parametrize("text", ["", ":1", "a:0", "a:70000", "a:+1", "a:1_0", "[::1", "x" * 400])
def test_parse_hostport_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_hostport(text)


def test_parse_ras_endpoint() -> None:
    assert parse_ras_endpoint("127.0.0.1:28028=train") == RasEndpointFlag(
        "127.0.0.1", 28028, "train"
    )
    with pytest.raises(ValueError, match="not a name"):
        parse_ras_endpoint("trainer:28028")
    with pytest.raises(ValueError, match="job name"):
        parse_ras_endpoint("127.0.0.1:28028=a b")


# -- this node's addresses ---------------------------------------------------------------


def test_parse_fib_trie_and_routes_of_this_machine() -> None:
    """This machine's own files: every LOCAL /32 is one of its addresses, and each is on a
    connected route."""
    fib = Path("/proc/1/net/fib_trie").read_text()
    local = parse_fib_trie(fib)
    assert "127.0.0.1" in local
    routes = parse_routes(Path("/proc/1/net/route").read_text())
    assert all(r[1].prefixlen >= 0 for r in routes)


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def node_netns(tmp_path: Path) -> Iterator[Path]:
    """A network namespace shaped like a Kubernetes GPU node's host network (needs root and
    ``ip``): eth0 with an
    IPv4 and a global IPv6 address, docker0 with 172.17.0.1, kube-ipvs0 holding a service
    VIP (/32, no connected route), cali* and lo. A procfs root whose ``1`` is a process
    sleeping in it."""
    ns = f"fsras-{secrets.token_hex(3)}"
    ip("netns", "add", ns)
    sleeper = None
    try:
        for i, dev in enumerate(("eth0", "docker0", "kube-ipvs0", "cali1234")):
            # this kernel has no dummy interfaces: veth pairs, the far ends unaddressed
            ip("-n", ns, "link", "add", dev, "type", "veth", "peer", "name", f"vethp{i}")
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", f"vethp{i}", "up")
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", ns, "addr", "add", "10.20.0.5/24", "dev", "eth0")
        ip("-n", ns, "addr", "add", "fd00:20::5/64", "dev", "eth0", "nodad")
        ip("-n", ns, "addr", "add", "172.17.0.1/16", "dev", "docker0")
        ip("-n", ns, "addr", "add", "10.96.0.1/32", "dev", "kube-ipvs0")
        ip("-n", ns, "addr", "add", "192.168.99.1/24", "dev", "cali1234")
        sleeper = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "60"])
        root = tmp_path / "proc"
        root.mkdir()
        for _ in range(100):  # the exec'd sleep is in the namespace once its netns link says so
            if os.readlink(f"/proc/{sleeper.pid}/ns/net") != os.readlink("/proc/self/ns/net"):
                break
            subprocess.run(["sleep", "0.05"], check=True)
        (root / "1").symlink_to(f"/proc/{sleeper.pid}")
        yield root
    finally:
        if sleeper is not None:
            sleeper.kill()
            sleeper.wait()
        ip("netns", "delete", ns)


def test_node_addresses_from_a_real_namespace(node_netns: Path) -> None:
    got = read_node_addresses(SysfsReader(node_netns))
    assert got == (NodeAddress("10.20.0.5", "eth0"), NodeAddress("fd00:20::5", "eth0"))


def test_no_net_files_is_no_address(tmp_path: Path) -> None:
    assert read_node_addresses(SysfsReader(tmp_path)) == ()


def test_a_jobs_unreachable_pods_add_up_in_one_series() -> None:
    from agent.ras.sampler import RasSnapshot
    from exporter.metrics import ras
    from exporter.metrics.spec import Families

    index = PodIndex([meta("a-0"), meta("a-1", ip="10.244.1.8")])
    eps = plan(
        snap(
            proc(1100, 0, env={}, rank=0, host_net=False, pod=("ml", "a-0")),
            proc(1101, 1, env={}, rank=1, host_net=False, pod=("ml", "a-1")),
        ),
        index,
    )
    assert len(eps) == 2  # one group per pod
    out = Families()
    ras.render(RasSnapshot(endpoints=eps), out)
    (samples,) = [v for s, v in out.items() if s is ras.ENDPOINT_PROCESSES]
    assert samples == [(("ml", "llama", "", "not_reachable"), 2.0)]


def test_only_the_processs_own_address_is_asked() -> None:
    """NCCL_RAS_ADDR is the job's to write: an address that is not the process's own (its
    pod's IP, or this node's in the host network) would point the agent anywhere."""
    index = PodIndex([meta("a-0", ip="10.244.1.7"), meta("b-0", ip="10.244.1.8", owner="gpt")])
    eps = plan(
        snap(
            # a pod naming the cluster's API service instead of its own IP
            proc(
                1100,
                0,
                env={"NCCL_RAS_ADDR": "10.96.0.1:443"},
                rank=0,
                host_net=False,
                pod=("ml", "a-0"),
            ),
            # a pod naming its own IP
            proc(
                1101,
                1,
                env={"NCCL_RAS_ADDR": "10.244.1.8:28028"},
                rank=0,
                host_net=False,
                pod=("ml", "b-0"),
            ),
            # bare metal: this node's address, and another node's
            proc(102, 2, env={"NCCL_RAS_ADDR": "10.20.0.5:29000"}, rank=0),
            proc(103, 3, env={"NCCL_RAS_ADDR": "10.20.0.6:29001"}, rank=0),
        ),
        index,
        node=frozenset({"10.20.0.5"}),
    )
    assert states(eps) == [
        ("", "", "not_reachable", 1),
        ("", "llama", "not_reachable", 1),
        ("10.20.0.5:29000", "", "queried", 1),
        ("10.244.1.8:28028", "gpt", "queried", 1),
    ]
