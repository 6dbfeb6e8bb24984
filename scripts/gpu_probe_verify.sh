#!/usr/bin/env bash
# Issue #4 verification on a 2-GPU node, in one run: intra-node probe at the default sizes,
# two agents (one GPU each, NCCL forced onto its network transport) probing each other
# through the real rendezvous and authentication, the matrix command, peak GPU memory, and
# no CUDA context left behind. Also reruns the GPU-marked tests and prices NVML calls.
#   bash scripts/gpu_probe_verify.sh OUTDIR
set -uo pipefail
OUT=${1:?usage: gpu_probe_verify.sh OUTDIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
FS="python3 -m exporter.cli"
get() { python3 -c 'import sys,urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$1"; }
step() { echo; echo "=== $*"; }
rc=0
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 100 >"$OUT/gpumem.csv" &
SMI=$!

step "GPU-marked tests (live NVML record/replay)"
python3 -m pytest -q -p no:cacheprovider -m gpu tests/nvml/test_nvml_record.py tests/nvml/test_nvml.py -rs 2>&1 | tail -3 || rc=1

step "the probe's bounded wait for NCCL's own calls, NCCL's errors, abort and teardown"
python3 scripts/gpu_probe_stuck.py 2>&1 | grep -v Warning || rc=1

step "NVML per-call costs"
python3 bench/nvml_fieldvalues.py >"$OUT/nvml_costs.json" 2>&1 || rc=1
python3 -c "import json;d=json.load(open('$OUT/nvml_costs.json'));print({k:round(v*1e3,3) for k,v in d.items() if k.startswith('cpu')})"

peak() {  # peak MiB per GPU seen by the background monitor since line $1 of gpumem.csv
  tail -n +"$1" "$OUT/gpumem.csv" | python3 -c "
import sys, collections; m = collections.defaultdict(int)
for l in sys.stdin:
    i, v = l.split(','); m[i.strip()] = max(m[i.strip()], int(v))
print(dict(m))"; }
for buf in default 2097152; do
  step "intra-node probe (all_reduce, sendrecv; default sizes), NCCL_BUFFSIZE=$buf"
  from=$(($(wc -l <"$OUT/gpumem.csv") + 1))
  t0=$(date +%s.%N)
  if [ "$buf" = default ]; then $FS probe --collectives all_reduce,sendrecv || rc=1
  else NCCL_BUFFSIZE=$buf $FS probe --collectives all_reduce,sendrecv || rc=1; fi
  echo "wall: $(python3 -c "print(round($(date +%s.%N)-$t0,1))") s; peak GPU MiB: $(peak $from)"
  echo "compute apps after the probe:"; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
done

step "two agents, one GPU each, NCCL over its network transport, real rendezvous + auth"
mkdir -p /tmp/fs && head -c 32 /dev/urandom | base64 >/tmp/fs/secret && chmod 600 /tmp/fs/secret
printf '127.0.0.1\n127.0.0.2\n' >/tmp/fs/peers
COMMON="--sampling.interval 5 --sampling.timeout 5 --no-sampler.netdev --probe --probe.peers-file /tmp/fs/peers --probe.secret-file /tmp/fs/secret --probe.round-seconds 30 --probe.budget 0.5 --probe.intra-seconds 0 --log.level info"
CUDA_VISIBLE_DEVICES=0 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 $FS agent --web.listen-address 127.0.0.1:9101 --probe.listen-address 127.0.0.1:10119 $COMMON >/tmp/fs/a.log 2>&1 &
A=$!
CUDA_VISIBLE_DEVICES=1 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 $FS agent --web.listen-address 127.0.0.1:9102 --probe.listen-address 127.0.0.2:10119 $COMMON >/tmp/fs/b.log 2>&1 &
B=$!
for i in $(seq 120); do
  sleep 1
  if get http://127.0.0.1:9101/metrics 2>/dev/null | grep -q '^fabricscope_probe_busbw_bytes_per_second{.*peer="127.0.0.2"'; then
    if get http://127.0.0.1:9102/metrics 2>/dev/null | grep -q '^fabricscope_probe_busbw_bytes_per_second{.*peer="127.0.0.1"'; then
      echo "both agents have a node-pair result after ${i}s"; break; fi; fi
done
get http://127.0.0.1:9101/metrics >"$OUT/agent_a.prom"; get http://127.0.0.1:9102/metrics >"$OUT/agent_b.prom"
grep -h '^fabricscope_probe_\(busbw\|latency\|runs_total\|rendezvous\)' "$OUT/agent_a.prom" "$OUT/agent_b.prom"
grep -q 'peer="127.0.0.2"' "$OUT/agent_a.prom" || { echo "FAIL: no node-pair result on A"; rc=1; }
grep -ih "probe" /tmp/fs/a.log /tmp/fs/b.log | tail -8

step "matrix: agent A alone on GPU 0 (rendezvous, no peers), the CLI as guest on GPU 1"
kill $A $B; wait $A $B 2>/dev/null
CUDA_VISIBLE_DEVICES=0 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 $FS agent --web.listen-address 127.0.0.1:9101 --probe.listen-address 127.0.0.1:10119 --sampling.interval 5 --sampling.timeout 5 --no-sampler.netdev --probe --probe.secret-file /tmp/fs/secret --probe.intra-seconds 0 >/tmp/fs/a2.log 2>&1 &
A=$!
for _ in $(seq 50); do get http://127.0.0.1:9101/healthz >/dev/null 2>&1 && break; sleep 0.2; done
CUDA_VISIBLE_DEVICES=1 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 $FS probe --matrix --peer 127.0.0.1:10119 --secret-file /tmp/fs/secret --peer-gpus 2 --csv "$OUT/matrix.csv" --png "$OUT/matrix.png"
echo "matrix exit: $? (1 expected: agent A holds one GPU, so the (1,1) cell cannot run)"
cat "$OUT/matrix.csv"
kill $A; wait $A 2>/dev/null
sleep 1; kill $SMI
echo "compute apps at the end:"; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
echo "peak GPU memory (MiB) per GPU during the whole run: $(peak 1)"
step "done, rc=$rc"
exit $rc
