"""explain follows a job's SR-IOV virtual functions to the physical port they ride on: the
job's HCAs, read from a real Prometheus holding the agent's pod attribution series, include
each VF's physical function (``pf_device``), whose port is the cable to the switch; a pod
whose VF's own RDMA device is not visible on the host (``device`` empty) still names it."""

from __future__ import annotations

import time
from pathlib import Path

from exporter.explain.client import ClientSettings, PrometheusClient
from exporter.explain.discover import JobSpec, Throughput, footprint
from tests.promharness import openmetrics_blocks, start_prometheus

INFO = "fabricscope_pod_rdma_info"


def _series(where: tuple[str, str], vf: tuple[str, str], pf: tuple[str, str]) -> str:
    """``where`` (instance, pod), ``vf`` and ``pf`` (RDMA device, PCI address)."""
    (instance, pod), (device, pci), (pf_dev, pf_pci) = where, vf, pf
    labels = (
        f'claim="",container="trainer",device="{device}",device_id="{pci}",'
        f'instance="{instance}",namespace="ml",pci_bus_id="{pci}",pf_device="{pf_dev}",'
        f'pf_pci_bus_id="{pf_pci}",pod="{pod}",resource="intel.com/mlnx_sriov_rdma"'
    )
    return f"{INFO}{{{labels}}}"


def test_a_jobs_hcas_include_the_physical_function_of_each_vf(tmp_path: Path) -> None:
    end = int(time.time()) - 300
    start = end - 1800
    rows = [
        # node-0: the VF's RDMA device is on the host (mlx5_4), riding on mlx5_0
        _series(("node-0", "llm-0"), ("mlx5_4", "0000:1a:00.2"), ("mlx5_0", "0000:1a:00.0")),
        # node-1: the VF's RDMA device is not visible on the host; its PF is
        _series(("node-1", "llm-1"), ("", "0000:3b:00.3"), ("mlx5_1", "0000:3b:00.0")),
        # another job's VF on node-0: not this job's
        _series(("node-0", "other-0"), ("mlx5_5", "0000:1a:00.3"), ("mlx5_2", "0000:1a:01.0")),
    ]
    lines = [
        f"# TYPE {INFO} gauge\n",
        *(f"{s} 1 {t}\n" for t in range(start, end + 1, 60) for s in rows),
    ]
    tsdb = openmetrics_blocks(lines, tmp_path / "om.txt", tmp_path / "tsdb", timeout=60)
    with start_prometheus(tmp_path / "prom", [], tsdb_path=tsdb) as prom:
        client = PrometheusClient(ClientSettings(prom.url))
        tp = Throughput("", "", "", None, (), ())
        fp = footprint(client, JobSpec("llm", "ml"), tp, start, end)
    assert fp.instances == ("node-0", "node-1") and fp.pods == ("llm-0", "llm-1")
    assert fp.hcas == (("node-0", "mlx5_0"), ("node-0", "mlx5_4"), ("node-1", "mlx5_1"))
