#!/usr/bin/env bash
# Live localisation on one GPU machine: one agent per GPU (up to 8), each a "node" with its own
# probe address on loopback (127.0.0.1, 127.0.0.2, ...), probing each other on the agents'
# own schedule through the real rendezvous and authentication. One node is slowed on purpose:
# its agent (and so its probe workers) runs with NCCL_P2P_DISABLE=1, so its pairs go through
# host memory (SHM) instead of NVLink, several times slower, while every other pair uses the
# NVLinks. Every agent's /metrics is scraped every SCRAPE seconds for DURATION seconds into
# OUTDIR/scrapes/<node>.txt (probe series only, each scrape after a "# scrape <unix time>"
# line). The shipped localisation rules are evaluated on those scrapes by a real Prometheus
# afterwards, on any machine: bench/probe_localise_eval.py OUTDIR/scrapes (the GPU machine has
# no Prometheus); tests/test_probe_localise.py does so in CI on the recorded scrapes.
#   bash scripts/gpu_probe_localise.sh OUTDIR [DURATION=150] [ROUND=30] [SLOW=last]
# Needs two GPUs or more and the probe extra (torch). Writes nothing into the repository.
set -uo pipefail
OUT=${1:?usage: gpu_probe_localise.sh OUTDIR [DURATION] [ROUND] [SLOW]}
DURATION=${2:-150}
ROUND=${3:-30}
SCRAPE=${SCRAPE:-5}
mkdir -p "$OUT/scrapes" "$OUT/logs"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
[ "$NGPU" -gt 8 ] && NGPU=8
if [ "$NGPU" -lt 2 ]; then echo "FAIL: needs two GPUs or more (found $NGPU)"; exit 2; fi
SLOW=${4:-last}; [ "$SLOW" = last ] && SLOW=$((NGPU - 1))
SECRET=$(mktemp); head -c 32 /dev/urandom | base64 >"$SECRET"; chmod 600 "$SECRET"
PEERS="$OUT/peers"; : >"$PEERS"
for i in $(seq 0 $((NGPU - 1))); do echo "127.0.0.$((i + 1))" >>"$PEERS"; done
echo "$NGPU nodes (one GPU each): $(tr '\n' ' ' <"$PEERS"); slowed: 127.0.0.$((SLOW + 1)) (NCCL_P2P_DISABLE=1); round ${ROUND}s, ${DURATION}s"
PIDS=()
for i in $(seq 0 $((NGPU - 1))); do
  extra=(); [ "$i" = "$SLOW" ] && extra=(NCCL_P2P_DISABLE=1)
  env CUDA_VISIBLE_DEVICES=$i "${extra[@]}" python3 -m exporter.cli agent \
    --web.listen-address "127.0.0.1:$((9300 + i))" --sampling.interval 5 --sampling.timeout 5 \
    --no-sampler.netdev --no-sampler.throughput --no-sampler.workload --no-sampler.attribution \
    --probe --probe.peers-file "$PEERS" --probe.secret-file "$SECRET" \
    --probe.listen-address "127.0.0.$((i + 1)):10119" --probe.round-seconds "$ROUND" \
    --probe.budget 0.5 --probe.intra-seconds 0 --probe.sizes 1MiB,16MiB,64MiB \
    --log.level info >"$OUT/logs/node-$i.log" 2>&1 &
  PIDS+=($!)
done
get() { python3 -c 'import sys,urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$1"; }
for i in $(seq 0 $((NGPU - 1))); do
  for _ in $(seq 100); do get "http://127.0.0.1:$((9300 + i))/healthz" >/dev/null 2>&1 && break; sleep 0.2; done
done
t0=$(date +%s)
while [ $(( $(date +%s) - t0 )) -lt "$DURATION" ]; do
  now=$(date +%s.%N)
  for i in $(seq 0 $((NGPU - 1))); do
    { echo "# scrape $now"; get "http://127.0.0.1:$((9300 + i))/metrics" 2>/dev/null | grep '^fabricscope_probe_'; } \
      >>"$OUT/scrapes/127.0.0.$((i + 1)).txt"
  done
  sleep "$SCRAPE"
done
kill "${PIDS[@]}" 2>/dev/null; wait 2>/dev/null
echo "last busbw per node pair (GB/s, sendrecv 64 MiB), as each node saw it:"
for f in "$OUT"/scrapes/*.txt; do
  node=$(basename "$f" .txt)
  awk -v n="$node" '/^# scrape/{delete v} /^fabricscope_probe_busbw_bytes_per_second\{.*collective="sendrecv".*size_bytes="67108864"/{match($0,/peer="[^"]*"/); p=substr($0,RSTART+6,RLENGTH-7); v[p]=$NF} END{for (p in v) printf "  %s -> %s: %.1f\n", n, p, v[p]/1e9}' "$f"
done | sort
grep -h "probe" "$OUT"/logs/node-*.log | grep -ci "error\|fail" | xargs echo "probe log lines with error/fail:"
rm -f "$SECRET"
echo "done: evaluate with python3 bench/probe_localise_eval.py $OUT/scrapes"
