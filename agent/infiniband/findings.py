"""The InfiniBand ports' own findings: ports down or switched off, PMA counters stuck at the
maximum of their width. Pure functions of an :class:`~agent.infiniband.records.InfinibandSnapshot`;
ACTIVE ports that run below their rate are :mod:`agent.infiniband.capacity`'s.
"""

from __future__ import annotations

from agent.core.findings import Finding
from agent.infiniband.records import (
    PORT_STATE_ACTIVE,
    SOURCE_CLEARED,
    IbDevice,
    IbPort,
    InfinibandSnapshot,
    PortCounter,
)

PHYS_STATE_DISABLED = 3


def findings(snap: InfinibandSnapshot) -> list[Finding]:
    """Ports down (``port_down``: not ACTIVE with a LinkUp physical link, the condition of
    ``fabricscope_infiniband_port_up == 0`` and of its alert) unless an administrator
    switched them off (``port_disabled``, info), and PMA counters stuck at the maximum of
    their width (``counter_saturated``), sorted. ACTIVE ports below their rate:
    ``capacity.findings``."""
    out: list[Finding] = []
    for dev in snap.devices:
        for port in dev.ports:
            subject = f"{dev.name}/{port.port}"
            phys = port.phys_state
            if phys is not None and phys.number == PHYS_STATE_DISABLED:
                out.append(
                    Finding(
                        "port_disabled",
                        subject,
                        f"{dev.name} port {port.port} is switched off (physical state "
                        f"{phys.name}).",
                    )
                )
            elif port.up is False and port.state is not None and phys is not None:
                why = (
                    f"ACTIVE but its physical state is {phys.name}, not LinkUp"
                    if port.state.number == PORT_STATE_ACTIVE
                    else f"{port.state.name}, physical state {phys.name}, not ACTIVE"
                )
                out.append(Finding("port_down", subject, f"{dev.name} port {port.port} is {why}."))
            for c in port.counters:
                if c.saturated:
                    out.append(
                        Finding("counter_saturated", f"{subject}/{c.name}", _stuck(dev, port, c))
                    )
    return sorted(out)


def _stuck(dev: IbDevice, port: IbPort, c: PortCounter) -> str:
    where = f"{c.source}/{c.name} on {dev.name} port {port.port}"
    if port.link_layer is not None and port.link_layer != "InfiniBand":
        # perfquery reads and clears a PMA through an InfiniBand subnet (a LID, MADs to the
        # port's PerfMgt agent): a RoCE or iWARP port has neither, so nothing clears it
        netdev = f" ({', '.join(port.netdevs)})" if port.netdevs else ""
        return (
            f"{where} sits at {c.raw}, the maximum of its {c.width}-bit width, and no remedy "
            f"exists on this {port.link_layer} port: PMA counters are cleared through an "
            "InfiniBand subnet, which a RoCE or iWARP port has none of (--infiniband.reset-"
            "saturated and perfquery -R skip it). Read the link's wide counters on its netdev"
            f"{netdev} instead: the driver's 64-bit ethtool statistics (mlx5: "
            "rx_vport_rdma_unicast_bytes, rx_symbol_err_phy, rx_crc_errors_phy), exported as "
            "fabricscope_netdev_ethtool_statistic_total."
        )
    src = port.counter_source
    if src is not None and src.source == SOURCE_CLEARED:
        return (
            f"{where} reached {c.raw}, the maximum of its {c.width}-bit width, within one "
            "pass before the agent cleared it: what it missed is lost (a shorter "
            "--sampling.interval, or an HCA with 64-bit PortCountersExtended error counters)."
        )
    return (
        f"{where} sits at {c.raw}, the maximum of its {c.width}-bit width: it no longer counts "
        "until it is cleared (--infiniband.reset-saturated, or perfquery -R)."
    )
