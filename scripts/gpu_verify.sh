#!/usr/bin/env bash
# Issue #3 verification on a GPU node, in one run: records NVML, runs the GPU tests and the
# replay tests on the fresh recording, cross-checks the live agent's /metrics against
# nvidia-smi, measures an NVML pass, and takes a fabricscope snapshot.
#   bash scripts/gpu_verify.sh OUTDIR
# Needs python3 with the agent's dependencies (PYTHONPATH may point at carried wheels).
set -uo pipefail
OUT=${1:?usage: gpu_verify.sh OUTDIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
step() { echo; echo "=== $*"; }
rc=0

step "nvidia-smi facts"
{ nvidia-smi; nvidia-smi topo -m; nvidia-smi nvlink --status; nvidia-smi nvlink -e;
  nvidia-smi -q; } >"$OUT/nvidia-smi.txt" 2>&1
head -20 "$OUT/nvidia-smi.txt"

step "record NVML"
python3 scripts/nvml_record.py -o "$OUT/h200x2.recording.json" || rc=1
cp "$OUT/h200x2.recording.json" tests/fixtures/nvml/h200x2.recording.json

step "GPU tests and replay tests on the fresh recording"
python3 -m pytest -q -p no:cacheprovider tests/test_nvml.py tests/test_nvml_record.py \
  tests/test_nvml_fixtures.py tests/test_nvml_crosscheck.py -rs || rc=1

step "cross-check, in-process"
python3 scripts/gpu_crosscheck.py || rc=1

step "agent: live /metrics, cross-check, GPU memory, RSS"
python3 -m exporter.cli agent --web.listen-address=127.0.0.1:10118 --log.level=info &
AGENT=$!
get() { python3 -c 'import sys,urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$1"; }
for _ in $(seq 100); do get http://127.0.0.1:10118/healthz >/dev/null 2>&1 && break; sleep 0.1; done
get http://127.0.0.1:10118/metrics >"$OUT/metrics.txt"
grep -c '^fabricscope_' "$OUT/metrics.txt"
python3 scripts/gpu_crosscheck.py --metrics-url http://127.0.0.1:10118/metrics || rc=1
echo "agent pid $AGENT; compute apps:"; nvidia-smi --query-compute-apps=pid,used_memory --format=csv
if nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -qw "$AGENT"; then
  echo "FAIL: the agent holds a GPU context"; rc=1; else echo "PASS: agent holds no GPU context"; fi
grep VmRSS /proc/$AGENT/status
kill $AGENT; wait $AGENT

step "NVML pass cost"
python3 bench/bench_nvml.py --json "$OUT/bench_nvml.json" || rc=1

step "topo and snapshot"
python3 -m exporter.cli topo | tee "$OUT/topo.txt"
python3 -m exporter.cli snapshot -o "$OUT/h200x2-snapshot.tar.gz" || rc=1
python3 -m exporter.cli agent --once --snapshot "$OUT/h200x2-snapshot.tar.gz" >"$OUT/replay.txt"
echo "replayed series: $(grep -c '^fabricscope_' "$OUT/replay.txt")"

step "done, rc=$rc"
exit $rc
