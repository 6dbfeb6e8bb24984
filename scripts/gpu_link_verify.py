#!/usr/bin/env python3
"""GPU-machine checks of two judgements that need a real GPU (issues 21 and 25):

1. A GPU's PCIe generation is judged only while it runs compute processes
   (``fabricscope_gpu_pcie_link_generation_degraded``, ``gpu_pcie_speed_degraded``): the live
   NVML sampler runs on an idle GPU (the gauge must be absent) and while a torch process
   copies to and multiplies on GPU 0 (the gauge must be present and say what ``nvidia-smi``
   says of the link at that moment: current generation below the maximum or not).
2. The GPU NCCL names in its communicator lines (``busId 60`` ...): a one-rank torch job
   runs with ``NCCL_DEBUG=INFO``; the parser's GPU of that process must be the PCI address
   NVML and ``nvidia-smi`` give for GPU 0, and the NUMA map the agent builds from this
   machine's sysfs must hold it wherever sysfs gives the GPU a NUMA node.

Prints one line per check (PASS/FAIL/INFO) and exits 1 on any FAIL. Needs torch and the
agent's dependencies; writes only into OUTDIR.
    python3 scripts/gpu_link_verify.py OUTDIR
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.nvml.findings import findings, generation_degraded_under_load  # noqa: E402
from agent.nvml.sampler import NvmlSampler  # noqa: E402
from agent.nvml.snapshot import NvmlSnapshot  # noqa: E402
from scripts.gpu_crosscheck import smi_bus_id  # noqa: E402

FAILS: list[str] = []

LOAD = """
import sys, time, torch
torch.cuda.set_device(0)
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
host = torch.empty(256 << 20, dtype=torch.uint8).pin_memory()
dev = torch.empty_like(host, device="cuda")
print("loaded", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    dev.copy_(host, non_blocking=True)
    host.copy_(dev, non_blocking=True)
    torch.cuda.synchronize()
"""

JOB = """
import torch, torch.distributed as dist
torch.cuda.set_device(0)
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
x = torch.ones(1 << 20, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
dist.destroy_process_group()
"""


def check(ok: bool, what: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'} {what}", flush=True)
    if not ok:
        FAILS.append(what)


def smi(*fields: str) -> list[list[str]]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]


def sample() -> NvmlSnapshot:
    sampler = NvmlSampler(watch_xid=False)
    try:
        return sampler.sample()
    finally:
        sampler.close()


def rendered(snap: NvmlSnapshot) -> dict[tuple[str, str], float]:
    """(family, gpu label) -> value of what the agent would export for ``snap``."""
    from exporter.metrics import nvml
    from exporter.metrics.spec import Families

    out = Families()
    nvml.render(snap, out)
    return {
        (spec.name, dict(zip(spec.labels, labels, strict=False)).get("gpu", "")): value
        for spec, samples in out.items()
        for labels, value in samples
    }


def generation_checks(out: Path) -> None:
    snap = sample()
    for gpu in snap.gpus:
        p = gpu.pcie
        busy = len(gpu.compute_processes or ())
        print(
            f"INFO idle pass: GPU {gpu.index} Gen{p.current_generation} of Gen{p.max_generation}"
            f" x{p.current_width}/x{p.max_width}, {busy} compute processes"
        )
        if not busy:
            check(
                generation_degraded_under_load(gpu) is None,
                f"GPU {gpu.index} idle: its generation is not judged (gauge absent)",
            )
    load = subprocess.Popen([sys.executable, "-c", LOAD, "40"], stdout=subprocess.PIPE, text=True)
    try:
        assert load.stdout is not None
        check(load.stdout.readline().strip() == "loaded", "torch load started on GPU 0")
        busy_snap = None
        for _ in range(60):  # NVML lists the process once its context exists
            s = sample()
            g0 = next(g for g in s.gpus if g.index == 0)
            # NVML's pids are the host's: in a VM sandbox they may not be ours; a fresh
            # machine runs nothing else, so any compute process on GPU 0 is the load
            if g0.compute_processes:
                busy_snap = s
                break
            time.sleep(0.5)
        check(busy_snap is not None, "NVML lists the load as a compute process of GPU 0")
        if busy_snap is None:
            return
        (cur, mx), *_ = smi("pcie.link.gen.current", "pcie.link.gen.max")
        g0 = next(g for g in busy_snap.gpus if g.index == 0)
        judged = generation_degraded_under_load(g0)
        p = g0.pcie
        print(
            f"INFO busy pass: GPU 0 Gen{p.current_generation} of Gen{p.max_generation}; "
            f"nvidia-smi right after: Gen{cur} of Gen{mx}; judged degraded={judged}"
        )
        check(judged is not None, "busy GPU 0: its generation is judged (gauge present)")
        check(
            judged == (int(cur) < int(mx)),
            f"busy GPU 0: the judgement ({judged}) is nvidia-smi's (Gen{cur} < Gen{mx})",
        )
        gauge = rendered(busy_snap).get(("fabricscope_gpu_pcie_link_generation_degraded", "0"))
        check(
            gauge == (1.0 if judged else 0.0),
            f"busy GPU 0: fabricscope_gpu_pcie_link_generation_degraded is {gauge}",
        )
        idle_gauge = rendered(snap).get(("fabricscope_gpu_pcie_link_generation_degraded", "0"))
        check(
            idle_gauge is None or bool(snap.gpus[0].compute_processes),
            f"idle GPU 0: the gauge was absent ({idle_gauge})",
        )
        kinds = {f.kind for f in findings(busy_snap) if f.subject == "gpu0"}
        check(
            ("gpu_pcie_speed_degraded" in kinds) == bool(judged),
            "busy GPU 0: gpu_pcie_speed_degraded finding follows the judgement",
        )
    finally:
        load.kill()
        load.wait()
        (out / "generation.txt").write_text("done\n")


def nccl_checks(out: Path) -> None:
    from agent.core.sysfs import SysfsReader
    from agent.infiniband.sampler import InfinibandSampler
    from agent.pci.sampler import PciSampler
    from agent.samplers import numa_nodes
    from agent.throughput.nccl import parse_nccl_line
    from agent.throughput.nccl_run import NcclRun

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(JOB)
    env = dict(os.environ, NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET", NCCL_NVLS_ENABLE="0")
    proc = subprocess.run(
        ["torchrun", "--standalone", "--nproc_per_node=1", f.name],
        check=False,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    os.unlink(f.name)
    log = proc.stdout + proc.stderr
    (out / "nccl-one-rank.log").write_text(log)
    check(proc.returncode == 0, f"one-rank NCCL job ran (exit {proc.returncode})")
    run = NcclRun()
    gpus: set[str] = set()
    for line in log.splitlines():
        parsed = parse_nccl_line(line)
        if parsed is None:
            continue
        run.feed(parsed, None)
        bus = getattr(parsed.event, "bus_id", None)
        if bus is not None:
            gpus.add(bus)
    print(f"INFO NCCL {run.version}: GPUs named in communicator lines: {sorted(gpus)}")
    (smi_bus,), *_ = smi("pci.bus_id")
    want = smi_bus_id(smi_bus)
    g0 = next(g for g in sample().gpus if g.index == 0)
    print(f"INFO nvidia-smi GPU 0: {smi_bus} -> {want}; NVML: {g0.pci_bus_id}")
    check(gpus == {want}, f"the parser's GPU of the process is GPU 0's address {want}")
    check(g0.pci_bus_id == want, "NVML's bus id of GPU 0 is the same address")
    sysfs = SysfsReader("/sys")
    pci = PciSampler(sysfs).sample()
    try:
        ib = InfinibandSampler(sysfs).sample()
    except Exception as exc:  # no RDMA device on this machine: NoData
        print(f"INFO InfiniBand sampler: {type(exc).__name__}: {exc}")
        ib = None
    numa = dict(numa_nodes(pci, ib) or ())
    dev = pci.get(want)
    node = dev.numa_node if dev is not None else None
    print(f"INFO sysfs: GPU {want} numa_node={node}; NUMA map: {numa}")
    if node is not None and node >= 0:
        check(numa.get(want) == node, "the NUMA map holds GPU 0 at its sysfs NUMA node")
    else:
        check(want not in numa, "GPU 0 has no NUMA node in sysfs: left out of the map")


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out.mkdir(parents=True, exist_ok=True)
    generation_checks(out)
    nccl_checks(out)
    print(f"{len(FAILS)} failed" if FAILS else "all passed")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
