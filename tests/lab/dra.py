"""A lab node whose job gets its GPUs and NICs only from ResourceClaims (Dynamic Resource
Allocation), as a node running NVIDIA's GPU DRA driver and a DRA NIC driver shows them to
the agent:

* the kubelet's pod-resources ``List`` (:mod:`tests.lab.kubelet`) answers with the
  container's ``dynamic_resources``: a claim ``<pod>-gpus`` of eight ``gpu.nvidia.com``
  devices named ``gpu-<minor>``, and a claim ``<pod>-rails`` of the eight compute rails, no
  device-plugin devices;
* the CDI directory (``<node>/cdi``, the agent's ``--path.cdi``) holds the specs the drivers
  wrote for those claims: the GPU driver's ``k8s.gpu.nvidia.com-claim_<uid>.yaml`` (one device
  ``<claim uid>-gpu-<minor>`` per GPU with its ``/dev/nvidia<minor>`` node, the layout of the
  curated spec in ``tests/fixtures/cdi-dra``), and a NIC driver's JSON spec giving each rail
  by PCI address (``PCIDEVICE_...``, the SR-IOV plugin's convention);
* ``<node>/proc/driver/nvidia/gpus/<pci>/information`` names each GPU's minor, UUID and PCI
  address, in the layout recorded on an H200 (``tests/fixtures/nvidia-procfs``).

Minors run backwards against NVML's indices (GPU 0 is ``/dev/nvidia7``), as nothing promises
they agree: a join on the index instead of the minor would attribute the wrong GPUs.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from agent.kubernetes import podresources_pb2 as pb
from tests.lab.node import GPU_BUS_IDS, LabNode, gpu_uuid
from tests.lab.scenarios import NAMESPACE, RAILS

INFORMATION = (
    Path(__file__).resolve().parents[1]
    / "fixtures/nvidia-procfs/proc/driver/nvidia/gpus/0000:00:06.0/information"
)
GPU_DRIVER = "gpu.nvidia.com"
NIC_DRIVER = "rdma.example.com"


def minor(gpu: int) -> int:
    return 7 - gpu


def claim_uid(node: LabNode, claim: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node.name}.{claim}.claim.fabricscope.lab"))


def _information(uuid_: str, pci: str, minor_: int) -> str:
    """The recorded file with this GPU's UUID, bus location and minor."""
    values = {"GPU UUID": uuid_, "Bus Location": pci, "Device Minor": str(minor_)}
    out = []
    for line in INFORMATION.read_text().splitlines():
        key, sep, rest = line.partition(":")
        if sep and key in values:
            pad = rest[: len(rest) - len(rest.lstrip())]
            out.append(f"{key}:{pad}{values[key]}")
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def _rail_pci(node: LabNode, device: str) -> str:
    return os.path.basename(os.path.realpath(node.sys / "class/infiniband" / device / "device"))


def write(node: LabNode) -> None:
    """The node's CDI specs and the driver's per-GPU procfs files."""
    gpus_uid = claim_uid(node, "gpus")
    rails_uid = claim_uid(node, "rails")
    for g in range(8):
        pci = f"0000:{GPU_BUS_IDS[g]}:00.0"
        d = node.proc / "driver/nvidia/gpus" / pci
        d.mkdir(parents=True, exist_ok=True)
        (d / "information").write_text(_information(gpu_uuid(node.name, g), pci, minor(g)))
    cdi = node.root / "cdi"
    cdi.mkdir(exist_ok=True)
    lines = ["cdiVersion: 0.5.0", "kind: k8s.gpu.nvidia.com/claim", "devices:"]
    for g in range(8):
        lines += [
            f"- name: {gpus_uid}-gpu-{minor(g)}",
            "  containerEdits:",
            "    deviceNodes:",
            f"    - path: /dev/nvidia{minor(g)}",
            "      major: 195",
        ]
    lines += ["containerEdits:", "  env:", "  - NVIDIA_VISIBLE_DEVICES=void"]
    (cdi / f"k8s.gpu.nvidia.com-claim_{gpus_uid}.yaml").write_text("\n".join(lines) + "\n")
    nic = {
        "cdiVersion": "0.6.0",
        "kind": f"{NIC_DRIVER}/nic",
        "devices": [
            {
                "name": f"{rails_uid}-{dev}",
                "containerEdits": {
                    "env": [f"PCIDEVICE_RDMA_EXAMPLE_COM_NIC={_rail_pci(node, dev)}"]
                },
            }
            for dev, _ in RAILS
        ],
    }
    (cdi / f"{NIC_DRIVER}-nic_{rails_uid}.json").write_text(json.dumps(nic, indent=1))


def claims(node: LabNode) -> list[pb.DynamicResource]:
    """The container's ResourceClaims as the kubelet reports them."""
    gpus_uid = claim_uid(node, "gpus")
    rails_uid = claim_uid(node, "rails")
    gpus = pb.DynamicResource(
        claim_name=f"{node.pod}-gpus",
        claim_namespace=NAMESPACE,
        claim_resources=[
            pb.ClaimResource(
                cdi_devices=[
                    pb.CDIDevice(name=f"k8s.gpu.nvidia.com/claim={gpus_uid}-gpu-{minor(g)}")
                ],
                driver_name=GPU_DRIVER,
                pool_name=node.name,
                device_name=f"gpu-{minor(g)}",
            )
            for g in range(8)
        ],
    )
    rails = pb.DynamicResource(
        claim_name=f"{node.pod}-rails",
        claim_namespace=NAMESPACE,
        claim_resources=[
            pb.ClaimResource(
                cdi_devices=[pb.CDIDevice(name=f"{NIC_DRIVER}/nic={rails_uid}-{dev}")],
                driver_name=NIC_DRIVER,
                pool_name=node.name,
                device_name=dev,
            )
            for dev, _ in RAILS
        ],
    )
    return [gpus, rails]
