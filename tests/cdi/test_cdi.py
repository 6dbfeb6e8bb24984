"""agent/cdi: CDI specs parsed (pure) and read from a directory bounded and within it, and
the NVIDIA driver's procfs minors, against the recorded and transcribed fixtures
(tests/fixtures/cdi-dra, tests/fixtures/nvidia-procfs: their PROVENANCE.md say what is real)
and hostile directories (huge, malformed, symlinks out of the root, FIFOs, alias bombs)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from agent.cdi.nvidia import (
    GpuMinor,
    MigCapability,
    parse_information,
    parse_mig_minors,
    read_gpu_minors,
    read_mig_capabilities,
)
from agent.cdi.registry import CdiRegistry
from agent.cdi.resolve import DeviceRefs, device_refs, nvidia_dra_minor
from agent.cdi.spec import MAX_DEVICES, CdiDevice, parse_spec, split_qualified
from agent.core.sysfs import Issues, SysfsReader

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CDI = FIXTURES / "cdi-dra" / "cdi"
H200_PROC = FIXTURES / "nvidia-procfs" / "proc"
DRA_PROC = FIXTURES / "cdi-dra" / "proc"
H200_UUID = "GPU-e0994de4-8084-3401-2ea6-a123360289e0"
WHOLE = "k8s.gpu.nvidia.com/claim=dab5ab50-d59a-42a6-af16-cfd4628c0f7a-gpu-0"
MIG = "k8s.gpu.nvidia.com/claim=c8593c85-440d-4156-b199-aea592ff83df-gpu-0-mig-1g18gb-19-0"
VF = "rdma.example.com/vf=vf-0000-1a-00-2"
CHANNEL = "k8s.compute-domain.nvidia.com/claim=5f0e4d7a-93c1-4c1e-8a1b-2b6c0e9d1f34-channel-0"


# --- the driver's procfs (recorded on an H200) ----------------------------------------------


def test_the_recorded_information_file_names_minor_uuid_and_address() -> None:
    text = (H200_PROC / "driver/nvidia/gpus/0000:00:06.0/information").read_text()
    assert parse_information(text) == GpuMinor(0, H200_UUID, "0000:00:06.0")
    assert read_gpu_minors(Issues(SysfsReader(H200_PROC))) == {
        0: GpuMinor(0, H200_UUID, "0000:00:06.0")
    }


@pytest.mark.parametrize(
    "text", ["", "Device Minor: \t -1\n", "Device Minor: \t zero\n", "GPU UUID: GPU-1\n"]
)
def test_an_information_file_without_a_minor_is_a_parse_error(text: str) -> None:
    with pytest.raises(ValueError, match="Device Minor"):
        parse_information(text)


def test_mig_minors_name_instances_and_skip_the_rest() -> None:
    caps = parse_mig_minors((DRA_PROC / "driver/nvidia-caps/mig-minors").read_text())
    assert caps == (
        MigCapability(102, 0, 11, None),
        MigCapability(103, 0, 11, 0),
        MigCapability(104, 0, 11, 1),
        MigCapability(105, 0, 12, None),
        MigCapability(106, 0, 12, 0),
    )
    assert parse_mig_minors("config 1\ngpu0/gi1/ci0/access x\ngarbage\n") == ()


def test_no_driver_and_no_mig_are_quiet(tmp_path: Path) -> None:
    issues = Issues(SysfsReader(tmp_path))
    assert read_gpu_minors(issues) == {}
    assert read_mig_capabilities(issues) == {}
    assert issues.items == []


def test_an_unreadable_information_file_is_one_issue(tmp_path: Path) -> None:
    shutil.copytree(H200_PROC, tmp_path / "proc")
    bad = tmp_path / "proc/driver/nvidia/gpus/0000:00:07.0"
    bad.mkdir()
    (bad / "information").write_text("Model: \t\t NVIDIA H200\n")
    issues = Issues(SysfsReader(tmp_path / "proc"))
    assert list(read_gpu_minors(issues)) == [0]
    assert [(i.path, i.reason) for i in issues.items] == [
        ("driver/nvidia/gpus/0000:00:07.0/information", "parse")
    ]


# --- spec parsing (pure) ----------------------------------------------------------------------


def test_the_whole_gpu_claim_spec() -> None:
    spec = parse_spec(
        (CDI / "k8s.gpu.nvidia.com-claim_dab5ab50-d59a-42a6-af16-cfd4628c0f7a.yaml").read_text()
    )
    assert spec.kind == "k8s.gpu.nvidia.com/claim"
    assert spec.devices == (
        CdiDevice("dab5ab50-d59a-42a6-af16-cfd4628c0f7a-gpu-0", ("/dev/nvidia0",), ()),
    )


def test_json_specs_parse_too() -> None:
    spec = parse_spec((CDI / "rdma.example.com-vf_4e0d5b7c.json").read_text(), json_format=True)
    assert spec.devices == (
        CdiDevice(
            "vf-0000-1a-00-2",
            ("/dev/infiniband/uverbs2", "/dev/infiniband/rdma_cm"),
            ("PCIDEVICE_RDMA_EXAMPLE_COM_VF=0000:1a:00.2",),
        ),
    )


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "not a mapping"),
        ("- a\n- b\n", "not a mapping"),
        ("kind: nokind\ndevices: []\n", "vendor.com/class"),
        ("kind: a.com/b\ndevices: {x: 1}\n", "not a list"),
        ("kind: a.com/b\ndevices: [\n", "not YAML"),
        ("kind: !!python/object:os.system a.com/b\ndevices: []\n", "not YAML"),
    ],
)
def test_malformed_specs_are_value_errors(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_spec(text)


def test_odd_entries_are_skipped_not_fatal() -> None:
    spec = parse_spec(
        "kind: a.com/b\ndevices:\n- 7\n- {name: 5}\n- {name: ok, containerEdits: [1]}\n"
        "- name: n\n  containerEdits: {deviceNodes: [3, {path: 4}, {path: /dev/nvidia1}],"
        " env: [1, 'A=B']}\n"
    )
    assert spec.devices == (CdiDevice("ok"), CdiDevice("n", ("/dev/nvidia1",), ("A=B",)))


def test_an_alias_bomb_is_bounded() -> None:
    """A billion-laughs document: aliases are shared, not copied, and only the keys of a
    device are walked, so it parses in bounded time and memory, to nothing."""
    lines = ["kind: a.com/b", "a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join(['*a' + str(i - 1)] * 10)}]" for i in range(1, 9)]
    lines.append("devices: [*a8]")
    start = time.monotonic()
    assert parse_spec("\n".join(lines)).devices == ()
    assert time.monotonic() - start < 2.0


def test_too_many_devices_is_an_error() -> None:
    body = "".join(f"- name: d{i}\n" for i in range(MAX_DEVICES + 1))
    with pytest.raises(ValueError, match="devices, more than"):
        parse_spec("kind: a.com/b\ndevices:\n" + body)


def test_deep_nesting_is_an_error_not_a_crash() -> None:
    with pytest.raises(ValueError):
        parse_spec("[" * 100_000, json_format=True)


def test_qualified_names() -> None:
    assert split_qualified(WHOLE) == (
        "k8s.gpu.nvidia.com/claim",
        "dab5ab50-d59a-42a6-af16-cfd4628c0f7a-gpu-0",
    )
    assert split_qualified("nodevice") is None
    assert split_qualified("a.com/b=") is None


# --- references --------------------------------------------------------------------------------


def test_device_refs_from_nodes_and_environment() -> None:
    d = CdiDevice(
        "x",
        (
            "/dev/nvidia3",
            "/dev/nvidiactl",
            "/dev/nvidia-caps/nvidia-cap103",
            "/dev/nvidia-caps-imex-channels/channel0",
            "/dev/infiniband/uverbs2",
            "/dev/infiniband/rdma_cm",
        ),
        (
            "NVIDIA_VISIBLE_DEVICES=GPU-e0994de4-8084-3401-2ea6-a123360289e0,void",
            "PCIDEVICE_X=0000:1A:00.2,3b:00.3",
            "OTHER=GPU-e0994de4-8084-3401-2ea6-a123360289e0",
        ),
    )
    assert device_refs(d) == DeviceRefs(
        (3,), (103,), (2,), (H200_UUID,), ("0000:1a:00.2", "0000:3b:00.3"), (0,)
    )
    assert device_refs(CdiDevice("y", ("/dev/nvidia-uvm",), ("NVIDIA_VISIBLE_DEVICES=all",))).empty


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("gpu-0", (0, False)),
        ("dab5ab50-d59a-42a6-af16-cfd4628c0f7a-gpu-12", (12, False)),
        ("c8593c85-440d-4156-b199-aea592ff83df-gpu-0-mig-1g18gb-19-0", (0, True)),
        ("gpu-1-mig-3g.71gb-9-4", (1, True)),
        ("gpu-vfio-0", None),
        ("channel-0", None),
    ],
)
def test_nvidia_dra_device_names(name: str, expected: tuple[int, bool] | None) -> None:
    assert nvidia_dra_minor(name) == expected


# --- the directory --------------------------------------------------------------------------


def test_the_fixture_directory() -> None:
    index = CdiRegistry(str(CDI)).scan()
    assert index.present and index.specs == 4 and index.issues == ()
    assert sorted(index.devices) == sorted([WHOLE, MIG, VF, CHANNEL])
    assert device_refs(index.devices[CHANNEL]) == DeviceRefs(imex_channels=(0,))


def test_absent_directory_is_quiet(tmp_path: Path) -> None:
    index = CdiRegistry(str(tmp_path / "none")).scan()
    assert not index.present and index.devices == {} and index.issues == ()


def test_a_symlink_out_of_the_root_is_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "secret.yaml"
    outside.write_text("kind: evil.com/x\ndevices: [{name: leaked}]\n")
    root = tmp_path / "cdi"
    shutil.copytree(CDI, root)
    (root / "link.yaml").symlink_to(outside)
    (root / "dirlink.yaml").symlink_to(tmp_path)
    index = CdiRegistry(str(root)).scan()
    assert "evil.com/x=leaked" not in index.devices
    assert sorted((i.path, i.reason) for i in index.issues) == [
        ("dirlink.yaml", "permission"),
        ("link.yaml", "permission"),
    ]
    assert index.specs == 4


def test_huge_fifo_and_garbage_files_each_cost_one_issue(tmp_path: Path) -> None:
    root = tmp_path / "cdi"
    shutil.copytree(CDI, root)
    with (root / "huge.yaml").open("wb") as f:
        f.truncate(64 * 1024 * 1024)  # sparse: 64 MiB that are never read
    os.mkfifo(root / "pipe.yaml")
    (root / "garbage.json").write_bytes(b"\xff\xfe{not json")
    (root / "subdir.yaml").mkdir()
    start = time.monotonic()
    index = CdiRegistry(str(root)).scan()
    assert time.monotonic() - start < 2.0
    assert {i.path: i.reason for i in index.issues} == {
        "garbage.json": "parse",
        "huge.yaml": "parse",
        "pipe.yaml": "permission",
        "subdir.yaml": "permission",
    }
    assert sorted(index.devices) == sorted([WHOLE, MIG, VF, CHANNEL])


def test_too_many_files_reads_the_first(tmp_path: Path) -> None:
    for i in range(5):
        (tmp_path / f"s{i}.yaml").write_text(f"kind: a.com/b\ndevices: [{{name: d{i}}}]\n")
    index = CdiRegistry(str(tmp_path), max_specs=3).scan()
    assert sorted(index.devices) == ["a.com/b=d0", "a.com/b=d1", "a.com/b=d2"]
    assert [i.reason for i in index.issues] == ["parse"]


def test_unchanged_specs_are_not_parsed_again_and_changes_are_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = tmp_path / "a.yaml"
    spec.write_text("kind: a.com/b\ndevices: [{name: one}]\n")
    registry = CdiRegistry(str(tmp_path))
    assert list(registry.scan().devices) == ["a.com/b=one"]
    calls = []
    import agent.cdi.registry as reg

    real = reg.parse_spec
    monkeypatch.setattr(reg, "parse_spec", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert list(registry.scan().devices) == ["a.com/b=one"]
    assert calls == []
    spec.write_text("kind: a.com/b\ndevices: [{name: two}, {name: three}]\n")
    assert sorted(registry.scan().devices) == ["a.com/b=three", "a.com/b=two"]
    assert calls == [1]
    spec.unlink()
    assert registry.scan().devices == {}
