"""``fabricscope topo``: the GPU/NIC topology matrix, RDMA ports and every finding of the
node, as a table or JSON, from the host or a snapshot."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from contextlib import ExitStack

from agent import topo_report
from agent.config import IbPeerSettings
from agent.core.runner import Runner, SamplerSpec
from agent.core.sampler import Sampler
from agent.core.sysfs import SysfsReader
from agent.ibpeer.child import isolated_sampler as isolated_ibpeer
from agent.ibpeer.sampler import IbPeerSnapshot, missing_tools
from agent.infiniband.records import InfinibandSnapshot
from agent.infiniband.sampler import InfinibandSampler
from agent.node_findings import collect
from agent.nvml.sampler import NvmlSampler, isolated_sampler
from agent.nvml.snapshot import NvmlSnapshot
from agent.nvml.topology import nvlinks_by_address
from agent.pci import topology
from agent.pci.sampler import PciSampler, PciSnapshot
from agent.workload.records import WorkloadSnapshot
from agent.workload.sampler import WorkloadSampler
from exporter.cli.source import open_source


def cmd_topo(ns: argparse.Namespace) -> int:
    """PCI, InfiniBand and NVML once, then the workload checks on their snapshots (live
    host only: a snapshot holds no process state); on the host, when infiniband-diags is
    installed, the far end of each InfiniBand port's cable (its switch and port, the errors
    counted there: a few SMP and PMA queries per port, one hop, never a sweep); every finding
    of the node is printed.
    Without PCI data the RDMA ports and findings are printed and the matrix is said to be
    unavailable; with no GPU, NIC or RDMA port at all there is nothing to show: exit 1."""
    with ExitStack() as stack:
        src = open_source(stack, ns)
        sysfs = SysfsReader(src.sysfs)
        specs = [
            SamplerSpec(PciSampler(sysfs), 30.0, 30.0),
            SamplerSpec(InfinibandSampler(sysfs), 30.0, 30.0),
        ]
        if "nvml" not in src.unavailable:
            nvml: Sampler
            if src.nvml_api is None:  # the live library: in a child process, as in the agent
                child = isolated_sampler({"watch_xid": False}, 30.0, one_shot=True)
                stack.callback(child.close)
                nvml = child
            else:  # a snapshot's recording, replayed (pure Python)
                nvml = NvmlSampler(src.nvml_api, watch_xid=False)
            specs.append(SamplerSpec(nvml, 30.0, 30.0))
        peers_note = ""
        if ns.snapshot:
            peers_note = "not read from a snapshot"
        elif not ns.peers:
            peers_note = "not read (--no-peers)"
        else:
            prefix = tuple(shlex.split(ns.ibpeer_command_prefix))
            missing = missing_tools(prefix)
            if missing:
                peers_note = f"not read ({', '.join(missing)} not installed: infiniband-diags)"
            else:
                # this node's own cables only: no leaf's table, no uplinks; in a child that
                # reaps whatever a tool leaves, as in the agent
                settings = IbPeerSettings(command_prefix=prefix, uplinks_max=0)
                peer_child = isolated_ibpeer(settings, str(src.sysfs), 30.0, one_shot=True)
                stack.callback(peer_child.close)
                specs.append(SamplerSpec(peer_child, 30.0, 30.0))
        statuses = Runner(specs).run_once()
        peer_st = statuses.get("ibpeer")
        peer = (
            peer_st.snapshot
            if peer_st is not None and isinstance(peer_st.snapshot, IbPeerSnapshot)
            else None
        )
        if peer_st is not None and peer is None and not peers_note:
            peers_note = "not read (see the log)" if peer_st.hardware_present else ""
        pci, ib_st, nvml_st = statuses["pci"], statuses["infiniband"], statuses.get("nvml")
        pci_snap = pci.snapshot if isinstance(pci.snapshot, PciSnapshot) else None
        ib = ib_st.snapshot if isinstance(ib_st.snapshot, InfinibandSnapshot) else None
        gpu = (
            nvml_st.snapshot
            if nvml_st is not None and isinstance(nvml_st.snapshot, NvmlSnapshot)
            else None
        )
        topo = topology.analyse(pci_snap) if pci_snap is not None else None
        ports = sum(len(d.ports) for d in ib.devices) if ib is not None else 0
        gpus = len(gpu.gpus) if gpu is not None else 0
        if not ports and not gpus and (topo is None or not (topo.gpus or topo.nics)):
            failed = [n for n, st in sorted(statuses.items()) if not st.success]
            why = f"; {', '.join(failed)} failed (see the log above)" if failed else ""
            print(
                f"fabricscope: nothing to show: no GPU, NIC or RDMA port under {src.sysfs}{why}",
                file=sys.stderr,
            )
            return 1
        unavailable = (
            f"no PCI devices under {src.sysfs}/bus/pci/devices"
            if pci.success
            else "reading the PCI topology failed; see the log above"
        )
        work = None
        if "workload" not in src.unavailable and gpu is not None and pci_snap is not None:
            snap = pci_snap
            workload = WorkloadSampler(
                SysfsReader(ns.path_procfs), sysfs, lambda: gpu, lambda: snap
            )
            w = Runner([SamplerSpec(workload, 30.0, 30.0)]).run_once()["workload"]
            work = w.snapshot if isinstance(w.snapshot, WorkloadSnapshot) else None
        nvlinks = nvlinks_by_address(gpu) if gpu is not None else {}
        node = collect(pci=topo, ib=ib, gpu=gpu, work=work, peer=peer)
        if ns.format == "json":
            doc = topo_report.to_json(topo, node, ib, nvlinks, unavailable=unavailable, peer=peer)
            print(json.dumps(doc, indent=2, sort_keys=True))
        else:
            failed = [
                n for n in ("infiniband", "nvml") if n in statuses and not statuses[n].success
            ]
            table = topo_report.format_table(
                topo,
                node,
                ib,
                nvlinks,
                failed,
                unavailable=unavailable,
                peer=peer,
                peers_note=peers_note,
            )
            print(table)
        return 0
