"""agent/kubernetes/cgroup.py: real /proc/<pid>/cgroup files and lines
(tests/fixtures/procfs-cgroup/
PROVENANCE.md, and the source named on each single line below) -> pod UID and container id."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.kubernetes.cgroup import (
    CgroupLine,
    PodContainer,
    parse_cgroup,
    parse_cgroup_path,
    pod_container,
)

PROCFS = Path(__file__).resolve().parents[1] / "fixtures" / "procfs-cgroup"

#: every fixture file and what it says (pid -> pod UID, container id, runtime)
FILES: dict[int, PodContainer | None] = {
    1001: PodContainer(
        "7fda01c4-0ece-403d-88b4-c371d66d132a",
        "e58a24d4a722c99712cff74ef69d93311089584eb32617b3890e0dcb996133f1",
        "containerd",
    ),
    1002: PodContainer(
        "042efd86-1f3b-4f2f-8736-f31c58e95bbc",
        "f33f47b0db740bb647cb3e7ac62d96c74966dbb99cbfaf4563bfd42d387e8b44",
        "crio",
    ),
    1003: PodContainer(
        "fd698699-eabf-4c23-92ef-cf0bbdb78261",
        "2cc65c162ca1388b6b8d5ccfb701d22fc96675ccf8b2f1590c490c2c4039547f",
        "docker",
    ),
    1004: PodContainer(
        "0125ec2f-b64a-4868-8f5b-94b56cbab864",
        "ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459",
        "containerd",
    ),
    1005: PodContainer(
        "7d4424e6-bb13-42f4-a47a-45a4828bf54d",
        "d0b3604b67ac7930dd34ba3a796627e3e4717d12309e90a4afe3f38b6816ac98",
        "docker",
    ),
    1006: PodContainer(
        "69c72bad-46fa-11e9-8937-000d3ab38724",
        "29fe36ad918457348a6429aa74283efc2beceb9d807722410e256d0968cd1d47",
        None,
    ),
    1007: PodContainer(
        "c101fead-5fa2-4525-97af-5894973b336e",
        "2b7a2f7fb72575bb50a46d68cceaf43a12a597184714cb33af2f6420f5314293",
        None,
    ),
    1008: PodContainer(
        "b96a7488-3ee1-4bdc-9c98-155cc887b417",
        "6ef14b5a76df7b5d24285e3a04ccbc6fd323620272b3787b5dc440fc1b75d294",
        "containerd",
    ),
    1009: PodContainer(  # a static pod: the kubelet's config hash stands for the UID
        "d8992f589d8dd12c4342376ccb459375",
        "ecbcea5cd29afb25ba519715e827cda9e66cd0a914207f49ce0a292a6aa84d66",
        "containerd",
    ),
    1010: PodContainer(
        "ef16c429-a6ae-4674-a08e-848717fd4555",
        "00601ecc8806271163e6f8e8456d1614817bc5e6d7fa19025fea6fb0b373e7bb",
        "crio",
    ),
    2215: None,  # the kubelet itself, in /system.slice
    21689: PodContainer(
        "a5c1f8d5-1919-434d-add7-4afaafdaef89",
        "5eed917563583925ffdbd40a64efb2aaffe58638e57add8becaf460fe74f5b1c",
        "crio",
    ),
    28899: PodContainer(
        "e4b97838-73cc-4b94-9f3a-88153d3c8e31",
        "c664156b4a3cd7658b484ba00f1cb35c037edd2a427931ed8dd9fe20f35f84a2",
        None,
    ),
}


def test_the_table_covers_every_fixture_file() -> None:
    on_disk = {int(p.name) for p in PROCFS.iterdir() if p.is_dir()}
    assert on_disk == set(FILES)


@pytest.mark.parametrize("pid", sorted(FILES))
def test_fixture_file(pid: int) -> None:
    assert pod_container((PROCFS / str(pid) / "cgroup").read_text()) == FILES[pid]


# Single lines or paths quoted in threads that show no whole file.
LINES = [
    pytest.param(  # open-telemetry/opentelemetry-java #4730: Guaranteed pod, containerd 1.6.8
        "11:devices:/system.slice/containerd.service/kubepods-pod87a18a64_b74a_454a_b10b_"
        "a4a36059d0a3.slice:cri-containerd:05c48c82caff3be3d7f1e896981dd410e81487538936914f32b6"
        "24d168de9db0",
        PodContainer(
            "87a18a64-b74a-454a-b10b-a4a36059d0a3",
            "05c48c82caff3be3d7f1e896981dd410e81487538936914f32b624d168de9db0",
            "containerd",
        ),
        id="otel-java-4730-containerd-v1-guaranteed",
    ),
    pytest.param(  # open-telemetry/opentelemetry-java pull request #4733: cri-docker v0.25.0
        "11:pids:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod82f40de6_1226_"
        "4577_ab35_2f378b9f5e49.slice/docker-ca0587256640e2964fb4656da0d99828966f90ba96a29a6508"
        "60e0ca63e8eced.scope",
        PodContainer(
            "82f40de6-1226-4577-ab35-2f378b9f5e49",
            "ca0587256640e2964fb4656da0d99828966f90ba96a29a650860e0ca63e8eced",
            "docker",
        ),
        id="otel-java-4733-cri-dockerd-v1",
    ),
    pytest.param(  # elastic/apm-agent-nodejs #3550: the name=systemd hierarchy, containerd
        "1:name=systemd:/system.slice/containerd.service/kubepods-burstable-podff49d0be_16b7_4a49"
        "_bb9e_8ec1f1f4e27f.slice:cri-containerd:0f99ad5f45163ed14ab8eaf92ed34bb4a631d007f8755a7"
        "d79be614bcb0df0ef",
        PodContainer(
            "ff49d0be-16b7-4a49-bb9e-8ec1f1f4e27f",
            "0f99ad5f45163ed14ab8eaf92ed34bb4a631d007f8755a7d79be614bcb0df0ef",
            "containerd",
        ),
        id="apm-nodejs-3550-name-systemd",
    ),
]


@pytest.mark.parametrize(("line", "expected"), LINES)
def test_single_line(line: str, expected: PodContainer) -> None:
    assert pod_container(line + "\n") == expected


PATHS = [
    pytest.param(  # containerd/nri pull request #227: a kind node's cgroup v2 path (absolutePath
        # less /sys/fs/cgroup), the kubelet's cgroup root at /kubelet
        "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods"
        "-besteffort-pod1e597579_417e_482f_bf65_5fe170c3aebd.slice/cri-containerd-a09bc17f5aa29b0"
        "dbdec9ede5f46cf1396d2405917ab02e6f1eb1019f388396e.scope",
        PodContainer(
            "1e597579-417e-482f-bf65-5fe170c3aebd",
            "a09bc17f5aa29b0dbdec9ede5f46cf1396d2405917ab02e6f1eb1019f388396e",
            "containerd",
        ),
        id="nri-227-kind-v2",
    ),
    pytest.param(  # nestybox/sysbox #618: CRI-O with the cgroupfs driver (a mount's root)
        "/kubepods/besteffort/pod1d572999-c9f3-45bd-b378-9df614214da6/crio-87554950a53dd2ed856512"
        "d201cec166fa6c5dbab20186489d6a0e8c13c20586",
        PodContainer(
            "1d572999-c9f3-45bd-b378-9df614214da6",
            "87554950a53dd2ed856512d201cec166fa6c5dbab20186489d6a0e8c13c20586",
            "crio",
        ),
        id="sysbox-618-crio-cgroupfs",
    ),
    pytest.param(  # containers/crun #729: the name=systemd mount's root of a docker pod
        "/kubepods/besteffort/pod85401dd3-38cd-47b6-a90a-e16c0e1c06e6/dbc9f149296cec5d12b78385eb"
        "5b2c0cfe20b476f117c15c76d981cff44053c1",
        PodContainer(
            "85401dd3-38cd-47b6-a90a-e16c0e1c06e6",
            "dbc9f149296cec5d12b78385eb5b2c0cfe20b476f117c15c76d981cff44053c1",
            None,
        ),
        id="crun-729-cgroupfs",
    ),
    pytest.param(  # the pod's own cgroup (a process outside any container's, e.g. CRI-O's
        # conmon): the pod, no container
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda5c1f8d5_1919_434d_add7_"
        "4afaafdaef89.slice",
        PodContainer("a5c1f8d5-1919-434d-add7-4afaafdaef89", None, None),
        id="pod-slice-only",
    ),
    pytest.param("/system.slice/containerd.service", None, id="host-service"),
    pytest.param("/", None, id="root"),
    pytest.param("/kubepods.slice/kubepods-burstable.slice", None, id="qos-slice"),
]


@pytest.mark.parametrize(("path", "expected"), PATHS)
def test_path(path: str, expected: PodContainer | None) -> None:
    assert parse_cgroup_path(path) == expected


def test_parse_cgroup_keeps_colons_in_the_path_and_splits_controllers() -> None:
    text = (PROCFS / "1004" / "cgroup").read_text()
    lines = parse_cgroup(text)
    assert len(lines) == 6
    assert lines[2] == CgroupLine(
        9,
        ("cpuacct", "cpu"),
        "/system.slice/containerd.service/kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_"
        "94b56cbab864.slice:cri-containerd:ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf80"
        "06bac016459",
    )
    v2 = parse_cgroup((PROCFS / "1001" / "cgroup").read_text())
    assert [(line.hierarchy, line.controllers) for line in v2] == [(0, ())]


def test_the_first_line_naming_a_container_wins() -> None:
    # 28899's rdma line stops at the node container; the other lines reach the pod's
    lines = (PROCFS / "28899" / "cgroup").read_text().splitlines()
    rdma_first = "\n".join([lines[1], lines[0]])
    assert pod_container(rdma_first) == FILES[28899]


@pytest.mark.parametrize(
    "text",
    ["garbage\n", "12:rdma\n", "x:cpu:/kubepods\n", "0::kubepods.slice\n"],
)
def test_malformed_files_raise(text: str) -> None:
    with pytest.raises(ValueError, match="not a cgroup line"):
        pod_container(text)


def test_empty_file_is_no_pod() -> None:
    assert pod_container("") is None
    assert pod_container("\n\n") is None


def test_not_a_uid_is_no_pod() -> None:
    assert parse_cgroup_path("/kubepods/burstable/podnotauid/" + "a" * 64) is None
    # a container component that is not a 64-hex id names the pod only
    assert parse_cgroup_path(
        "/kubepods/pod69c72bad-46fa-11e9-8937-000d3ab38724/not-a-container"
    ) == PodContainer("69c72bad-46fa-11e9-8937-000d3ab38724", None, None)
