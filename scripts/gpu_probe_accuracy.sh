#!/usr/bin/env bash
# The probe against nccl-tests on one GPU machine, in one run: builds nccl-tests from a source
# tarball against torch's pip NCCL, then for every rank count the machine allows (2, 4, 8 ...
# up to its GPU count, and the GPU count itself) runs all_reduce_perf and sendrecv_perf
# (-b 8K -e 64M -f 2) with one thread per GPU (-t N -g 1: one rank per thread, as the probe
# runs one process per GPU; this is the reference) and, for the record, from one thread
# driving every GPU (-g N), all_reduce_perf at 8 B (latency), then the probe at the same sizes
# (its default timing, and graph and eager beside it); then a GPU x GPU sendrecv heatmap of
# every GPU of the machine. Writes ranks-N/accuracy.md / .json per rank count, accuracy.md
# (all of them), heatmap.png and the logs to OUTDIR.
# On a machine with one GPU it runs the one-GPU timing check instead (both sides at one rank:
# all_reduce on one rank, sendrecv to itself), says so, and makes no heatmap: that tests the
# probe's timing method at every size, not the fabric between GPUs.
#   bash scripts/gpu_probe_accuracy.sh NCCL_TESTS_TARBALL OUTDIR [WHEELS_DIR]
# WHEELS_DIR: matplotlib and its dependencies as wheels, installed when matplotlib is absent.
set -uo pipefail
TARBALL=${1:?usage: gpu_probe_accuracy.sh NCCL_TESTS_TARBALL OUTDIR [WHEELS_DIR]}
OUT=${2:?usage: gpu_probe_accuracy.sh NCCL_TESTS_TARBALL OUTDIR [WHEELS_DIR]}
WHEELS=${3:-}
TARBALL=$(realpath "$TARBALL"); mkdir -p "$OUT"; OUT=$(realpath "$OUT")
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
step() { echo; echo "=== $*"; }
t0=$(date +%s)
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "$NGPU" -lt 1 ]; then
  echo "FAIL: no GPU here"
  exit 2
fi
RANK_COUNTS=""
n=2; while [ "$n" -le "$NGPU" ]; do RANK_COUNTS="$RANK_COUNTS $n"; n=$((n * 2)); done
case " $RANK_COUNTS " in *" $NGPU "*) ;; *) [ "$NGPU" -ge 2 ] && RANK_COUNTS="$RANK_COUNTS $NGPU";; esac
if [ "$NGPU" -lt 2 ]; then
  RANK_COUNTS=1
  echo "NOTE: one GPU here: the one-GPU timing check (one rank on both sides), NOT the"
  echo "      comparison over the fabric between two GPUs, which needs 2 GPUs of one machine"
fi
echo "$NGPU GPU(s): rank counts$RANK_COUNTS"

if ! python3 -c "import matplotlib" 2>/dev/null && [ -n "$WHEELS" ]; then
  step "matplotlib from $WHEELS"
  python3 -m pip install -q --no-index --find-links "$WHEELS" matplotlib 2>&1 | tail -2
fi

step "build nccl-tests against torch's NCCL"
NCCL_DIR=$(python3 -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])")
echo "NCCL from $NCCL_DIR: $(ls "$NCCL_DIR/include/nccl.h" "$NCCL_DIR"/lib/libnccl.so* 2>&1 | tr '\n' ' ')"
[ -e "$NCCL_DIR/lib/libnccl.so" ] || ln -sf libnccl.so.2 "$NCCL_DIR/lib/libnccl.so"
if [ -z "${CUDA_HOME:-}" ]; then
  if command -v nvcc >/dev/null; then CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
  else CUDA_HOME=/usr/local/cuda; fi
fi
echo "CUDA from $CUDA_HOME: $("$CUDA_HOME/bin/nvcc" --version | tail -1)"
BUILD=$(mktemp -d); tar -xzf "$TARBALL" -C "$BUILD"; SRC=$(find "$BUILD" -maxdepth 2 -name Makefile -path '*nccl-tests*' -printf '%h\n' | head -1)
# sm_90 only (H100/H200): a build for every architecture takes minutes
(cd "$SRC" && make -j16 MPI=0 CUDA_HOME="$CUDA_HOME" NCCL_HOME="$NCCL_DIR" \
   NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" src.build >"$OUT/nccl-tests-build.log" 2>&1) \
  || { tail -20 "$OUT/nccl-tests-build.log"; echo "FAIL: nccl-tests build"; exit 1; }
BIN="$SRC/build"
export LD_LIBRARY_PATH="$NCCL_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "built in $(( $(date +%s) - t0 )) s"

rc=0
: >"$OUT/accuracy.md"
LAST=$(echo $RANK_COUNTS | awk '{print $NF}')
for RANKS in $RANK_COUNTS; do
  step "nccl-tests, $RANKS rank(s): one thread per GPU (the reference) and one thread for all"
  REF="$OUT/ranks-$RANKS/nccl-tests"; ONE="$OUT/ranks-$RANKS/nccl-tests-one-thread"
  mkdir -p "$REF" "$ONE"
  "$BIN/all_reduce_perf" -b 8K -e 64M -f 2 -t $RANKS -g 1 >"$REF/all_reduce_perf.log" 2>&1
  "$BIN/sendrecv_perf" -b 8K -e 64M -f 2 -t $RANKS -g 1 >"$REF/sendrecv_perf.log" 2>&1
  "$BIN/all_reduce_perf" -b 8 -e 8 -t $RANKS -g 1 >"$REF/latency_perf.log" 2>&1
  "$BIN/all_reduce_perf" -b 8K -e 64M -f 2 -g $RANKS >"$ONE/all_reduce_perf.log" 2>&1
  "$BIN/sendrecv_perf" -b 8K -e 64M -f 2 -g $RANKS >"$ONE/sendrecv_perf.log" 2>&1
  grep -E '^ +(1048576|67108864) ' "$REF/all_reduce_perf.log" "$REF/sendrecv_perf.log"

  HEATMAP=; [ "$RANKS" = "$LAST" ] && [ "$RANKS" -ge 2 ] && HEATMAP=--heatmap
  step "the probe at the same sizes (its default timing, graph and eager), $RANKS rank(s) ${HEATMAP:+and the heatmap of every GPU}"
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 100 >"$OUT/ranks-$RANKS/gpumem.csv" &
  SMI=$!
  python3 bench/probe_accuracy.py --nccl-tests-dir "$REF" --out "$OUT/ranks-$RANKS" --ranks $RANKS $HEATMAP || rc=1
  kill $SMI
  { echo "### $RANKS rank(s)"; echo; cat "$OUT/ranks-$RANKS/accuracy.md"; echo; } >>"$OUT/accuracy.md"
  [ -n "$HEATMAP" ] && cp "$OUT/ranks-$RANKS/heatmap.png" "$OUT/heatmap.png"
  echo "peak GPU memory (MiB) per GPU during the probe: $(python3 -c "
import collections; m = collections.defaultdict(int)
for l in open('$OUT/ranks-$RANKS/gpumem.csv'):
    i, v = l.split(','); m[i.strip()] = max(m[i.strip()], int(v))
print(dict(m))")"
done

if [ "$NGPU" -ge 2 ]; then
  step "the probe CLI at its defaults (sizes 8K..64M)"
  python3 -m exporter.cli probe --collectives all_reduce,sendrecv,latency | tee "$OUT/probe_cli.txt"
else
  echo "NOTE: one GPU: the comparison over the fabric and the heatmap were NOT run"
fi
echo "total wall: $(( $(date +%s) - t0 )) s, rc=$rc"
exit $rc
