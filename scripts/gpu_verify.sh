#!/usr/bin/env bash
# Verification on any GPU node (any GPU count), in one run: records NVML, replays that fresh
# recording and cross-checks it against this node's nvidia-smi (live against live), runs the
# NVML tests (they replay the committed fixtures and, where NVML is present, the live
# library), cross-checks the sampler in-process and a live agent's /metrics (NVML in its
# child process) against nvidia-smi, compares every NVML path of the NVLink error counters
# with nvidia-smi nvlink -e/-ec, checks the NVLink traffic counters against traffic of a known
# size (two GPUs or more), checks what pod attribution reads of the GPUs (MIG, the driver's
# minors, compute modes), measures an NVML pass and what isolation costs, runs a soak
# (SOAK_SECONDS, default 60; 0 when a long soak already runs beside it, see
# docs/development.md), and takes a fabricscope snapshot. Never writes into the repository:
# everything goes to OUTDIR.
#   bash scripts/gpu_verify.sh OUTDIR
# Needs python3 with the agent's dependencies (PYTHONPATH may point at carried wheels).
set -uo pipefail
OUT=${1:?usage: gpu_verify.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
step() { echo; echo "=== $*"; }
rc=0
tree_sum() { find agent exporter tests scripts bench -type f ! -name '*.pyc' -print0 | sort -z | xargs -0 md5sum | md5sum; }
before=$(tree_sum)

step "nvidia-smi facts"
{ nvidia-smi; nvidia-smi topo -m; nvidia-smi nvlink --status; nvidia-smi nvlink -e;
  nvidia-smi -q; } >"$OUT/nvidia-smi.txt" 2>&1
head -20 "$OUT/nvidia-smi.txt"

step "record NVML (into $OUT, never over tests/fixtures)"
python3 scripts/nvml_record.py -o "$OUT/live.recording.json" || rc=1

step "cross-check: this run's recording, replayed, against this node's nvidia-smi"
python3 scripts/gpu_crosscheck.py --recording "$OUT/live.recording.json" || rc=1

step "NVML tests (committed fixtures, and the live library where the test asks for it)"
python3 -m pytest -q -p no:cacheprovider tests/nvml/test_nvml.py tests/nvml/test_nvml_record.py \
  tests/nvml/test_nvml_fixtures.py tests/nvml/test_nvml_crosscheck.py tests/nvml/test_nvml_fabric.py \
  -rs || rc=1

step "pod attribution's GPU facts: MIG enumeration, the driver's minors, compute modes"
# read-only: MIG mode against nvidia-smi (MIG left as it is), /proc/driver/nvidia's minors,
# UUIDs and bus ids and NVML's compute mode against nvidia-smi -q, the probe's busy check
python3 scripts/gpu_mig_check.py "$OUT/mig" || rc=1
python3 scripts/gpu_attribution_check.py || rc=1
python3 -m pytest -q -p no:cacheprovider tests/nvml/test_nvml_mig.py tests/cdi \
  tests/probe/test_probe_shared_gpus.py -rs || rc=1

step "pynvml's structures against this machine's nvml.h (bench/nvml_abi.py)"
if [ -e "${CUDA_HOME:-/usr/local/cuda}/include/nvml.h" ] && command -v gcc >/dev/null; then
  python3 bench/nvml_abi.py --cuda "${CUDA_HOME:-/usr/local/cuda}" | grep -v '^ok' || rc=1
else echo "SKIP: no nvml.h or no gcc here"; fi

step "NVLink error counters: every NVML path side by side with nvidia-smi nvlink -e / -ec"
python3 scripts/gpu_nvlink_errors.py --json "$OUT/nvlink_errors.json" || rc=1

step "NVLink traffic counters against traffic of a known size (all_reduce, peer copy)"
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "$NGPU" -ge 2 ]; then
  python3 scripts/gpu_nvlink_traffic.py --json "$OUT/nvlink_traffic.json" || rc=1
else echo "SKIP: one GPU, no NVLink traffic to make"; fi

step "cross-check, in-process"
python3 scripts/gpu_crosscheck.py || rc=1

step "agent: live /metrics (NVML in a child process), cross-check, GPU memory, RSS"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# full detail: the cross-check compares every link's state, speed and far end with nvidia-smi
# (the default folds healthy links into per-GPU series)
python3 -m exporter.cli agent --web.listen-address=127.0.0.1:$PORT --log.level=info \
  --collector.detail=full 2>"$OUT/agent.log" &
AGENT=$!
get() { python3 -c 'import sys,urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$1"; }
for _ in $(seq 100); do get http://127.0.0.1:$PORT/healthz >/dev/null 2>&1 && break; sleep 0.1; done
for _ in $(seq 100); do get http://127.0.0.1:$PORT/metrics | grep -q '^fabricscope_gpu_info' && break; sleep 0.1; done
get http://127.0.0.1:$PORT/metrics >"$OUT/metrics.txt"
grep -c '^fabricscope_' "$OUT/metrics.txt"
grep '^fabricscope_sampler_.*sampler="nvml"' "$OUT/metrics.txt"
python3 scripts/gpu_crosscheck.py --metrics-url http://127.0.0.1:$PORT/metrics || rc=1
CHILD=$(python3 -c 'import pathlib,sys
for s in pathlib.Path("/proc").glob("[0-9]*/stat"):
    try: f = s.read_text().rsplit(")", 1)[1].split()
    except OSError: continue
    if f[1] == sys.argv[1]: print(s.parent.name); break' "$AGENT")
echo "agent pid $AGENT, NVML child pid ${CHILD:-none}; compute apps:"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv
if nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -qwE "$AGENT${CHILD:+|$CHILD}"; then
  echo "FAIL: the agent or its child holds a GPU context"; rc=1; else echo "PASS: no GPU context"; fi
mem() { grep -E '^(Rss|Pss|Private_Dirty):' "/proc/$1/smaps_rollup" | tr -s ' ' | paste -sd' '; }
echo "agent $(mem $AGENT)"; [ -n "$CHILD" ] && echo "child $(mem $CHILD)"
[ -n "$CHILD" ] || { echo "FAIL: no NVML child process"; rc=1; }
kill $AGENT; wait $AGENT || { echo "FAIL: agent exit status $?"; rc=1; }

step "the probe's GPU view (NVML in its own child) against nvidia-smi"
python3 scripts/gpu_probe_devices.py || rc=1

step "NVML pass cost"
python3 bench/bench_nvml.py --json "$OUT/bench_nvml.json" || rc=1

step "isolation cost (in-process against child process, live NVML)"
python3 bench/bench_isolation.py --live --passes 100 --json "$OUT/bench_isolation.json" || rc=1
# every counter every pass: ~1.8 s a pass on 4 GPUs (NVML's per-link error counter calls), so
# fewer passes than at the defaults
python3 bench/bench_isolation.py --live --link-error-rotation 1 --slow-error-rotation 1 \
  --passes 20 --json "$OUT/bench_isolation_rot1.json" || rc=1

SOAK_SECONDS=${SOAK_SECONDS:-60}
if [ "$SOAK_SECONDS" -gt 0 ]; then
  step "soak, ${SOAK_SECONDS} s (bench/gpu_soak.py; the long one runs detached, see docs/development.md)"
  python3 bench/gpu_soak.py --duration "$SOAK_SECONDS" --out "$OUT/soak" || rc=1
else echo; echo "=== soak: SOAK_SECONDS=0 (a long soak runs beside this run)"; fi

step "topo and snapshot"
python3 -m exporter.cli topo | tee "$OUT/topo.txt"
python3 -m exporter.cli snapshot -o "$OUT/snapshot.tar.gz" || rc=1
python3 -m exporter.cli agent --once --snapshot "$OUT/snapshot.tar.gz" >"$OUT/replay.txt"
echo "replayed series: $(grep -c '^fabricscope_' "$OUT/replay.txt")"

step "the repository is unchanged"
if [ "$(tree_sum)" != "$before" ]; then
  echo "FAIL: the run changed files under agent/ exporter/ tests/ scripts/ bench/"; rc=1
else echo "PASS"; fi

step "done, rc=$rc"
exit $rc
