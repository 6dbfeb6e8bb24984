"""Table tests for the pure parsers of agent/pci/sampler.py."""

from __future__ import annotations

import pytest

from agent.pci.sampler import (
    AcsState,
    classify,
    format_cpulist,
    parse_acs_control,
    parse_cpulist,
    parse_hex,
    parse_int,
    parse_link_speed,
    parse_link_width,
    parse_pcie_port_type,
    split_sysfs_path,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2.5 GT/s PCIe\n", 2_500_000_000),
        ("5.0 GT/s PCIe\n", 5_000_000_000),
        ("8.0 GT/s PCIe\n", 8_000_000_000),
        ("16.0 GT/s PCIe\n", 16_000_000_000),
        ("32.0 GT/s PCIe\n", 32_000_000_000),
        ("64.0 GT/s PCIe\n", 64_000_000_000),
        ("2.5 GT/s\n", 2_500_000_000),  # kernels before 4.19: no "PCIe"
        ("5 GT/s\n", 5_000_000_000),
        ("8 GT/s", 8_000_000_000),
        ("Unknown\n", None),  # the kernel's own word for an unknown speed
    ],
)
def test_parse_link_speed(text: str, expected: int | None) -> None:
    assert parse_link_speed(text) == expected


@pytest.mark.parametrize("text", ["", "fast", "16 Gb/s", "GT/s", "-8 GT/s", "16.0.1 GT/s PCIe"])
def test_parse_link_speed_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_link_speed(text)


@pytest.mark.parametrize(("text", "expected"), [("16\n", 16), ("8", 8), ("0\n", 0), ("x4", 4)])
def test_parse_link_width(text: str, expected: int) -> None:
    assert parse_link_width(text) == expected


@pytest.mark.parametrize("text", ["", "sixteen", "-1", "16 lanes"])
def test_parse_link_width_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_link_width(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0-3\n", (0, 1, 2, 3)),
        ("0,4,8\n", (0, 4, 8)),
        ("0-1,64-65\n", (0, 1, 64, 65)),
        ("7\n", (7,)),
        ("\n", ()),  # a memory-only NUMA node has no CPUs
        ("3,1-2", (1, 2, 3)),
    ],
)
def test_parse_cpulist(text: str, expected: tuple[int, ...]) -> None:
    assert parse_cpulist(text) == expected


@pytest.mark.parametrize("text", ["a-b", "0-", "3-1", "0,,1", "ff"])
def test_parse_cpulist_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpulist(text)


@pytest.mark.parametrize(
    ("cpus", "expected"),
    [((0, 1, 2, 3), "0-3"), ((0, 4, 8), "0,4,8"), ((), ""), ((5, 3, 4, 9), "3-5,9")],
)
def test_format_cpulist(cpus: tuple[int, ...], expected: str) -> None:
    assert format_cpulist(cpus) == expected
    assert parse_cpulist(expected) == tuple(sorted(cpus))


def test_parse_hex_and_int() -> None:
    assert parse_hex("0x10de\n") == 0x10DE
    assert parse_hex("0x030200\n") == 0x030200
    assert parse_int("-1\n") == -1
    assert parse_int("2") == 2
    for bad in ("10de", "0xzz", ""):
        with pytest.raises(ValueError):
            parse_hex(bad)
    for bad in ("one", "1.5", ""):
        with pytest.raises(ValueError):
            parse_int(bad)


# -- config space -------------------------------------------------------------------------


def config(
    size: int = 4096,
    *,
    pcie_at: int | None = 0x68,
    port_type: int = 6,
    ext: tuple[tuple[int, int], ...] = ((0x100, 0x0003), (0x170, 0x000D), (0x1F0, 0x0001)),
    acs_control: int = 0,
) -> bytes:
    """A config image: standard list PM (0x40) -> PCIe (pcie_at); extended chain ``ext`` of
    (offset, id) in order; ACS Control at the ACS entry + 6. Truncated to ``size`` bytes, as a
    short read returns it."""
    c = bytearray(4096)
    c[0x06] = 0x10
    c[0x34] = 0x40
    c[0x40] = 0x01
    if pcie_at is not None:
        c[0x41] = pcie_at
        c[pcie_at] = 0x10
        c[pcie_at + 2] = 0x2 | port_type << 4
    for i, (off, cap_id) in enumerate(ext):
        nxt = ext[i + 1][0] if i + 1 < len(ext) else 0
        c[off : off + 4] = (cap_id | 1 << 16 | nxt << 20).to_bytes(4, "little")
        if cap_id == 0x000D:
            c[off + 6 : off + 8] = acs_control.to_bytes(2, "little")
    return bytes(c[:size])


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        (config(acs_control=0x001D), AcsState(0x170, 0x001D)),  # what Linux enables
        (config(acs_control=0x0000), AcsState(0x170, 0x0000)),
        (config(acs_control=0x0004), AcsState(0x170, 0x0004)),  # request redirect only
        (config(ext=((0x100, 0x0003), (0x1F0, 0x0001))), AcsState(None, 0)),  # no ACS
        (config(ext=((0x100, 0x000D),), acs_control=0x0008), AcsState(0x100, 0x0008)),
        (config(256), AcsState(None, 0)),  # conventional PCI: no extended space at all
        (config(64), None),  # unprivileged read: unknown, not "disabled"
        (config(128), None),
        (b"", None),
    ],
)
def test_parse_acs_control(image: bytes, expected: AcsState | None) -> None:
    assert parse_acs_control(image) == expected


def test_acs_bits() -> None:
    linux = AcsState(0x170, 0x001D)
    assert linux.source_validation and linux.upstream_forwarding
    assert linux.p2p_request_redirect and linux.p2p_completion_redirect and linux.p2p_redirect
    assert AcsState(0x170, 0x0008).p2p_redirect  # completion redirect alone is enough
    assert not AcsState(0x170, 0x0011).p2p_redirect  # source validation + upstream fwd only
    assert not AcsState(None, 0).p2p_redirect


def test_parse_acs_control_survives_a_looping_chain() -> None:
    c = bytearray(4096)
    c[0x100:0x104] = (0x0003 | 1 << 16 | 0x1F0 << 20).to_bytes(4, "little")
    c[0x1F0:0x1F4] = (0x0001 | 1 << 16 | 0x100 << 20).to_bytes(4, "little")  # back to 0x100
    assert parse_acs_control(bytes(c)) == AcsState(None, 0)


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        (config(port_type=4), "root_port"),
        (config(port_type=5), "upstream_port"),
        (config(port_type=6), "downstream_port"),
        (config(port_type=0), "endpoint"),
        (config(pcie_at=None), None),  # conventional PCI function
        (config(64), None),  # the capability lies beyond an unprivileged read
    ],
)
def test_parse_pcie_port_type(image: bytes, expected: str | None) -> None:
    assert parse_pcie_port_type(image) == expected


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (
            "devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:19:00.0",
            ("pci0000:15", ("0000:15:01.0", "0000:16:00.0", "0000:17:01.0", "0000:19:00.0")),
        ),
        ("devices/pci0000:00/0000:00:1f.2", ("pci0000:00", ("0000:00:1f.2",))),
        (  # Intel VMD: a second host bridge nested under an endpoint; the last one counts
            "devices/pci0000:00/0000:00:0e.0/pci10000:e0/10000:e0:1d.0/10000:e1:00.0",
            ("pci10000:e0", ("10000:e0:1d.0", "10000:e1:00.0")),
        ),
        (  # Hyper-V: the PCI domain hangs off VMBus
            "devices/LNXSYSTM:00/LNXSYBUS:00/ACPI0004:00/VMBUS:00/47505500-0001-0000-3130-444531304244"
            "/pci0001:00/0001:00:00.0",
            ("pci0001:00", ("0001:00:00.0",)),
        ),
        ("devices/virtual/net/lo", None),
        ("devices/pci0000:00", None),
    ],
)
def test_split_sysfs_path(path: str, expected: tuple[str, tuple[str, ...]] | None) -> None:
    assert split_sysfs_path(path) == expected


@pytest.mark.parametrize(
    ("vendor", "class_code", "has_rdma", "expected"),
    [
        (0x10DE, 0x030200, False, "gpu"),  # H100: 3D controller
        (0x10DE, 0x030000, False, "gpu"),  # RTX 6000 Ada: VGA
        (0x10DE, 0x068000, False, None),  # NVSwitch: "Bridge"
        (0x10DE, 0x040300, False, None),  # GPU's HD audio function
        (0x15B3, 0x020000, True, "nic"),  # ConnectX-7 in Ethernet mode
        (0x15B3, 0x020700, True, "nic"),  # ConnectX in InfiniBand mode
        (0x15B3, 0x020000, False, "nic"),  # RDMA driver not loaded: still the NIC
        (0x15B3, 0x080000, False, None),  # BlueField system function
        (0x1077, 0x0C0600, True, "nic"),  # QLogic qib: serial-bus IB class, has infiniband/
        (0x8086, 0x020000, False, None),  # an Intel NIC without RDMA
        (None, None, True, "nic"),
        (0x10DE, None, False, None),
    ],
)
def test_classify(
    vendor: int | None, class_code: int | None, has_rdma: bool, expected: str | None
) -> None:
    assert classify(vendor, class_code, has_rdma) == expected
