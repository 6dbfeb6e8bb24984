#!/usr/bin/env bash
# Records real NCCL_DEBUG=INFO logs of a torch.distributed job on this GPU machine, for the
# NCCL log parser's fixtures (issue 25). Writes only into OUTDIR.
#   bash scripts/gpu_nccl_log.sh OUTDIR
# 1. one rank on GPU 0 (init, network selection, communicator lines; one GPU has no peers,
#    so no channel connection lines);
# 2. two ranks on the same GPU (NCCL refuses: its own WARN lines for a failed init);
# 3. two ranks on GPU 0 and, where a second GPU exists, GPU 1 with NCCL_P2P_DISABLE=1
#    NCCL_SHM_DISABLE=1 (the network transport between two "nodes"; skipped on one GPU);
# 4. where there are two GPUs or more: a DDP training job with one rank per GPU (a small
#    model, llm.c-style step lines with tok/s from rank 0), three times: as NCCL chooses
#    (P2P over NVLink where there is one), NCCL_DEBUG_SUBSYS left at its default, with NCCL_P2P_DISABLE=1 (shared memory), and with
#    NCCL_SHM_DISABLE=1 too (sockets), for the intra-node transport finding's fixtures; plus
#    nvidia-smi topo -m of the machine.
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
DDP=$(mktemp --suffix=.py)
cat >"$DDP" <<'PY'
import os, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
model = DistributedDataParallel(torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).cuda())
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
tokens = 16 * 2048 * dist.get_world_size()
t = time.perf_counter()
for step in range(1, 61):
    loss = model(torch.randn(16, 2048, device="cuda")).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 10 == 0:
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t) / 10 * 1000
        t = time.perf_counter()
        if rank == 0:
            print(f"step {step:4d}/60 | loss {loss.item():.6f} (+nanz)| norm 1.0000 (+nanz)| lr 1.00e-04 | {ms:.2f} ms | -100.0% bf16 MFU | {tokens / ms * 1000:.0f} tok/s", flush=True)
dist.destroy_process_group()
PY
NGPU=$(nvidia-smi -L | grep -c '^GPU ')
if [ "$NGPU" -ge 2 ]; then
  nvidia-smi topo -m >"$OUT/topo-m.txt" 2>&1
  ddp() {  # name, then environment assignments
    local name=$1; shift
    echo "== $name: DDP, $NGPU ranks, one per GPU, $*" | tee "$OUT/$name.log"
    python3 -c 'import torch; print("torch", torch.__version__, "nccl", ".".join(map(str, torch.cuda.nccl.version())))' >>"$OUT/$name.log" 2>&1
    env -u NCCL_DEBUG_SUBSYS "$@" timeout 180 torchrun --standalone --nproc_per_node="$NGPU" "$DDP" >>"$OUT/$name.log" 2>&1
    echo "== exit $?" >>"$OUT/$name.log"
    echo "$name: $(grep -c ' via ' "$OUT/$name.log") channel lines, $(grep -c 'tok/s' "$OUT/$name.log") step lines"
  }
  ddp ddp-p2p NCCL_DEBUG=INFO
  ddp ddp-shm NCCL_DEBUG=INFO NCCL_P2P_DISABLE=1
  ddp ddp-socket NCCL_DEBUG=INFO NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
else echo "one GPU: the DDP transport runs need two GPUs or more"; fi
rm -f "$JOB" "$DDP"
