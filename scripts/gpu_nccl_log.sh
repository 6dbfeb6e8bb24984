#!/usr/bin/env bash
# Records real NCCL_DEBUG=INFO logs of a torch.distributed job on this GPU machine, for the
# NCCL log parser's fixtures (issue 25). Writes only into OUTDIR.
#   bash scripts/gpu_nccl_log.sh OUTDIR
# 1. one rank on GPU 0 (init, network selection, communicator lines; one GPU has no peers,
#    so no channel connection lines);
# 2. two ranks on the same GPU (NCCL refuses: its own WARN lines for a failed init);
# 3. two ranks on GPU 0 and, where a second GPU exists, GPU 1 with NCCL_P2P_DISABLE=1
#    NCCL_SHM_DISABLE=1 (the network transport between two "nodes"; skipped on one GPU).
set -uo pipefail
OUT=${1:?usage: gpu_nccl_log.sh OUTDIR}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV,GRAPH PYTHONUNBUFFERED=1
JOB=$(mktemp --suffix=.py)
cat >"$JOB" <<'PY'
import os, torch, torch.distributed as dist
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dev = int(os.environ.get("GPU_OF_RANK", "0").split(",")[rank])
torch.cuda.set_device(dev)
dist.init_process_group("nccl", device_id=torch.device("cuda", dev))
x = torch.ones(1 << 20, device="cuda")
for _ in range(5):
    dist.all_reduce(x)
torch.cuda.synchronize()
print(f"rank {rank}: all_reduce ok, x[0]={x[0].item()}", flush=True)
dist.destroy_process_group()
PY
run() {  # name world gpus
  local name=$1 world=$2 gpus=$3
  echo "== $name: world $world on GPUs $gpus" | tee "$OUT/$name.log"
  python3 -c 'import torch; print("torch", torch.__version__, "nccl", ".".join(map(str, torch.cuda.nccl.version())))' >>"$OUT/$name.log" 2>&1
  GPU_OF_RANK=$gpus timeout 120 torchrun --standalone --nproc_per_node="$world" "$JOB" >>"$OUT/$name.log" 2>&1
  echo "== exit $?" >>"$OUT/$name.log"
  grep -c 'NCCL' "$OUT/$name.log"
}
run one-rank 1 0
run two-ranks-one-gpu 2 0,0
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 run two-gpus-net 2 0,1
else echo "one GPU: the two-GPU network run is not possible here"; fi
rm -f "$JOB"
