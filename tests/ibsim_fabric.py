"""Two-tier fat trees for ibsim (``tests/ibsim_lab.py``) and the hosts that sit on them.

:func:`fat_tree` writes an ibsim net file: leaf switches, each with its hosts' HCAs on its
first ports and one uplink to every spine after them; spines with one port per leaf. Hosts
are either all on one leaf (every HCA of a host under the same leaf, ``rails=False``) or
rail-optimised (HCA ``r`` of every host under leaf ``r``, ``rails=True``). An HCA is an ibsim
``Hca`` node named ``<host>-<device>``.

:func:`write_host` makes what the agent of one host needs: a sysfs tree with the host's
InfiniBand ports (``class/infiniband/<device>/ports/1``: state, link layer, rate, counters)
and the command prefix that points each tool at the host's HCA in the simulator
(libumad2sim attaches at the node named by ``SIM_HOST``; the agent passes ``-C <device>``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: 12X, QDR base speed, HDR extended speed on every cabled port (ibsim trains a link at the
#: best both ends support; its ports claim 1X-12X, SDR-QDR, FDR-HDR)
OPTS = "w=8 s=4 e=7"
#: a port trained at 12X HDR as the kernel's sysfs says it
RATE = "600 Gb/sec (12X HDR)\n"

#: What makes the simulator look like this host to the tools: libumad2sim offers one device,
#: ibsim0, attached at the node SIM_HOST names. The agent runs `smpquery -C mlx5_0 ...`; this
#: wrapper (the --ibpeer.command-prefix) points it at <host>-mlx5_0 and execs ibsim-run from
#: the host's directory (libumad2sim writes a stand-in sysfs, sys-PID/, into its cwd).
WRAPPER = """#!/bin/bash
cd "$(dirname "$0")"
args=(); dev=""
while [ $# -gt 0 ]; do
  if [ "$1" = "-C" ]; then dev="$2"; args+=(-C ibsim0); shift 2; continue; fi
  args+=("$1"); shift
done
SIM_HOST="{host}-$dev" exec ibsim-run "${{args[@]}}"
"""

#: the counters the infiniband sampler reads for a port (written 0 by write_host)
COUNTERS = (
    "symbol_error",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_xmit_discards",
    "link_error_recovery",
    "link_downed",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "port_xmit_wait",
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
    "unicast_xmit_packets",
    "unicast_rcv_packets",
)


@dataclass(frozen=True, slots=True)
class FatTree:
    """Who is where: ``hosts`` in order, each host's devices, each (host, device)'s leaf and
    leaf port, each leaf's uplink ports (leaf port -> (spine, spine port))."""

    net: str
    hosts: tuple[str, ...]
    devices: Mapping[str, tuple[str, ...]]
    leaf_of: Mapping[tuple[str, str], tuple[str, int]]
    uplinks: Mapping[str, Mapping[int, tuple[str, int]]]

    def leaf_hosts(self, leaf: str) -> list[str]:
        return sorted({h for (h, _), (lf, _) in self.leaf_of.items() if lf == leaf})


def fat_tree(
    hosts: Sequence[str],
    devices: Sequence[str],
    *,
    leaves: int,
    spines: int,
    rails: bool = False,
    switch_ports: int = 0,
    per_leaf: Sequence[int] = (),
) -> FatTree:
    """A two-tier fat tree. ``rails=False``: hosts fill the leaves in order, the same number
    on each (``len(hosts)`` must divide by ``leaves``), or ``per_leaf[i]`` on leaf ``i``
    when given (uneven leaves), every device of a host on its leaf; ``rails=True``:
    ``leaves == len(devices)``, device ``r`` of every host on leaf ``r``. Switches get
    ``switch_ports`` ports (default: just enough)."""
    if rails and leaves != len(devices):
        raise ValueError("a rail-optimised tree has one leaf per device")
    if per_leaf and (len(per_leaf) != leaves or sum(per_leaf) != len(hosts) or rails):
        raise ValueError("per_leaf: one count per leaf, summing to the hosts (no rails)")
    if not rails and not per_leaf and len(hosts) % leaves:
        raise ValueError("hosts must fill the leaves evenly")
    leaf_names = [f"leaf{i + 1}" for i in range(leaves)]
    spine_names = [f"spine{i + 1}" for i in range(spines)]
    down: dict[str, list[tuple[str, str]]] = {lf: [] for lf in leaf_names}
    counts = list(per_leaf) or [len(hosts) // leaves] * leaves
    host_leaf = [li for li, n in enumerate(counts) for _ in range(n)]
    for i, host in enumerate(hosts):
        for r, dev in enumerate(devices):
            leaf = leaf_names[r] if rails else leaf_names[host_leaf[i]]
            down[leaf].append((host, dev))
    need = max(len(d) for d in down.values()) + spines
    ports = max(switch_ports, need, leaves)
    lines: list[str] = []
    leaf_of: dict[tuple[str, str], tuple[str, int]] = {}
    uplinks: dict[str, dict[int, tuple[str, int]]] = {}
    for li, leaf in enumerate(leaf_names):
        lines.append(f'Switch\t{ports} "{leaf}"')
        for k, (host, dev) in enumerate(down[leaf], 1):
            lines.append(f'[{k}]\t"{host}-{dev}"[1]\t{OPTS}')
            leaf_of[(host, dev)] = (leaf, k)
        uplinks[leaf] = {}
        for si, spine in enumerate(spine_names):
            k = len(down[leaf]) + si + 1
            lines.append(f'[{k}]\t"{spine}"[{li + 1}]\t{OPTS}')
            uplinks[leaf][k] = (spine, li + 1)
        lines.append("")
    for si, spine in enumerate(spine_names):
        lines.append(f'Switch\t{ports} "{spine}"')
        for li, leaf in enumerate(leaf_names):
            lines.append(f'[{li + 1}]\t"{leaf}"[{len(down[leaf]) + si + 1}]\t{OPTS}')
        lines.append("")
    for (host, dev), (leaf, k) in sorted(leaf_of.items()):
        lines += [f'Hca\t1 "{host}-{dev}"', f'[1]\t"{leaf}"[{k}]\t{OPTS}', ""]
    return FatTree(
        "\n".join(lines),
        tuple(hosts),
        {h: tuple(devices) for h in hosts},
        leaf_of,
        uplinks,
    )


def write_host(root: Path, host: str, devices: Sequence[str]) -> Path:
    """``root/sys`` with ``devices``' InfiniBand ports up at 12X HDR and every counter 0, and
    ``root/ibsim-wrap`` (the command prefix); returns ``root``."""
    for dev in devices:
        d = root / "sys/class/infiniband" / dev
        port = d / "ports/1"
        (port / "counters").mkdir(parents=True, exist_ok=True)
        (d / "node_type").write_text("1: CA\n")
        (d / "hca_type").write_text("MT4129\n")
        (d / "fw_ver").write_text("28.39.1002\n")
        (port / "link_layer").write_text("InfiniBand\n")
        (port / "state").write_text("4: ACTIVE\n")
        (port / "phys_state").write_text("5: LinkUp\n")
        (port / "rate").write_text(RATE)
        for name in COUNTERS:
            (port / "counters" / name).write_text("0\n")
    wrap = root / "ibsim-wrap"
    wrap.write_text(WRAPPER.format(host=host))
    wrap.chmod(0o755)
    return root


def set_counter(root: Path, device: str, name: str, value: int) -> None:
    """Replace one counter file of ``root``'s host atomically, as the kernel presents it."""
    path = root / "sys/class/infiniband" / device / "ports/1/counters" / name
    tmp = path.with_name(f".{name}.tmp")
    tmp.write_text(f"{value}\n")
    tmp.replace(path)
