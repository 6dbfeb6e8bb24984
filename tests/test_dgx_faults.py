"""The DGX-class fixture carries five documented faults (tests/fixtures/dgx-h100/PROVENANCE.md):
each is detected, as a finding and as an alertable series, and nothing else is.

The tree is built from a real Dell 8xH100 `lspci -vvv`, real `ibstat` output and real port
counters (a ConnectX-7 with saturated PMA counters); the faults are edits listed in its
PROVENANCE.md."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.core.sysfs import SysfsReader
from agent.infiniband import capacity
from agent.infiniband import findings as infiniband_findings
from agent.infiniband import sampler as infiniband
from agent.pci import topology
from agent.pci.sampler import PciSampler
from tests.agentrun import fabricscope

EXPECTED_FINDINGS = {
    ("nic_cross_numa", "0000:5d:00.0"),  # 1: mlx5_5's numa_node rewritten to 1
    ("pci_link_width_degraded", "0000:38:00.0"),  # 2: switch uplink trained x8 of x16
    ("acs_p2p_redirect", "0000:b9:01.0"),  # 3: ACS redirect on switch b8's ports ...
    ("acs_p2p_redirect", "0000:b9:02.0"),  #    ... that lie on GPU/NIC paths
    ("port_down", "mlx5_11/1"),  # 4: RoCE port DOWN/Polling
    ("counter_saturated", "mlx5_6/1/excessive_buffer_overrun_errors"),  # 5: gpud PR943 dump,
    ("counter_saturated", "mlx5_6/1/link_downed"),  #    every saturated counter it holds
    ("counter_saturated", "mlx5_6/1/port_xmit_discards"),
    ("counter_saturated", "mlx5_6/1/port_xmit_wait"),
}

#: gauge -> value that means "something is wrong" (an alert rule's condition)
ALARMS = {
    "fabricscope_topology_gpu_nearest_nic_cross_numa": 1.0,
    "fabricscope_pci_link_width_degraded": 1.0,
    "fabricscope_pci_acs_p2p_redirect_enabled": 1.0,
    "fabricscope_infiniband_port_up": 0.0,
    "fabricscope_infiniband_port_pma_saturated": 1.0,
    # none of these: mlx5_11 is DOWN at a placeholder 40 Gb/s (not judged), the ConnectX-6 Dx
    # run at 100 like each other, every NIC at its PCIe speed (the Gen4 ones at 16 of 16)
    "fabricscope_infiniband_port_rate_degraded": 1.0,
    "fabricscope_pci_link_speed_degraded": 1.0,
}

EXPECTED_ALARMS = {
    ("fabricscope_topology_gpu_nearest_nic_cross_numa", (("pci_bus_id", "0000:5d:00.0"),)),
    ("fabricscope_pci_link_width_degraded", (("pci_bus_id", "0000:38:00.0"),)),
    ("fabricscope_pci_acs_p2p_redirect_enabled", (("pci_bus_id", "0000:b9:01.0"),)),
    ("fabricscope_pci_acs_p2p_redirect_enabled", (("pci_bus_id", "0000:b9:02.0"),)),
    ("fabricscope_infiniband_port_up", (("device", "mlx5_11"), ("port", "1"))),
    *(
        (
            "fabricscope_infiniband_port_pma_saturated",
            (("counter", c), ("device", "mlx5_6"), ("port", "1")),
        )
        for c in (
            "excessive_buffer_overrun_errors",
            "link_downed",
            "port_xmit_discards",
            "port_xmit_wait",
        )
    ),
}


def test_every_fault_is_a_finding_and_nothing_else_is(dgx_sys_root: Path) -> None:
    reader = SysfsReader(dgx_sys_root)
    ib = infiniband.InfinibandSampler(reader).sample()
    pci = PciSampler(reader).sample()
    found = (
        infiniband_findings.findings(ib)
        + capacity.findings(ib)
        + topology.findings(topology.analyse(pci))
    )
    assert {(f.kind, f.subject) for f in found} == EXPECTED_FINDINGS
    assert len(found) == len(EXPECTED_FINDINGS)
    assert ib.issues == () and pci.issues == ()


@pytest.mark.parametrize("detail", ["minimal", "default", "full"])
def test_every_fault_raises_exactly_its_alarm_series(dgx_sys_root: Path, detail: str) -> None:
    """At every --collector.detail level: the folds leave out healthy zeros (a saturated
    counter's 0s, a bridge's link speeds), never an alarm."""
    proc = fabricscope(
        [
            "agent",
            "--once",
            "--no-sampler.netdev",
            f"--path.sysfs={dgx_sys_root}",
            f"--collector.detail={detail}",
        ]
    )
    assert proc.returncode == 0, proc.stderr
    alarms = set()
    watched = 0
    for family in text_string_to_metric_families(proc.stdout):
        for sample in family.samples:
            if sample.name in ALARMS:
                watched += 1
                if sample.value == ALARMS[sample.name]:
                    alarms.add((sample.name, tuple(sorted(sample.labels.items()))))
    # the healthy devices are watched too, not merely absent (full: 152 saturation zeros more)
    assert watched > (200 if detail == "full" else 80)
    assert alarms == EXPECTED_ALARMS


def test_every_rdma_device_knows_its_pci_address(dgx_sys_root: Path) -> None:
    """The tree's ``device`` links read ``../..`` (valid, but not ending in the address, unlike
    the kernel's ``../../../0000:1a:00.0``): the address must come from resolving the link."""
    ib = infiniband.InfinibandSampler(SysfsReader(dgx_sys_root)).sample()
    nics = {d.address for d in PciSampler(SysfsReader(dgx_sys_root)).sample().by_role("nic")}
    assert {d.pci_bus_id for d in ib.devices} == nics
    assert len(ib.devices) == 12
