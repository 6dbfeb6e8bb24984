#!/usr/bin/env bash
# Proof, on any GPU machine with 2 or more GPUs, that the agent names the rank NCCL's RAS says
# stopped answering: a real N-rank torchrun job (N = the GPU count), the agent finding it by
# itself and asking its RAS, one rank SIGSTOPped (short, then long), SIGCONT; the alert
# expressions of deploy/rules/ras.rules.yaml on the agent's /metrics; the cost of a query to
# the agent and to the job. Details: scripts/gpu_ras_verify.py. About 4-5 minutes.
#   bash scripts/gpu_ras_verify.sh OUTDIR
# Writes only to OUTDIR: summary.json, run.log, job.log (the job's NCCL RAS lines), agent.log,
# scrapes.txt (every /metrics the script took), ras_answers.jsonl (every RAS answer the script
# asked for, as received, with the NCCL version and date), ras_job.py. Exit 1 when a check fails.
# Needs: torch with NCCL (2.28.7 or later for RAS's JSON), nvidia-smi, python3 with the agent's
# dependencies but pyroute2, bcrypt, protobuf and kubernetes (not imported for these samplers);
# google-re2 is imported by the metric catalog: when absent, WHEELS_DIR (a directory of wheels,
# e.g. carried in the repository's shared/) is searched for it.
set -uo pipefail
OUT=${1:?usage: gpu_ras_verify.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if ! python3 -c 'import re2' 2>/dev/null; then
  if [ -n "${WHEELS_DIR:-}" ]; then
    # a wheel is a zip: unpacked onto PYTHONPATH, no pip needed
    for whl in "$WHEELS_DIR"/google_re2-*cp3*.whl; do
      [ -e "$whl" ] && python3 -m zipfile -e "$whl" "$OUT/.wheels"
    done
    export PYTHONPATH="$PYTHONPATH:$OUT/.wheels"
  fi
  python3 -c 'import re2' 2>/dev/null || {
    echo "FAIL: google-re2 is not installed and WHEELS_DIR holds no wheel of it" \
      "(pip download google-re2 --only-binary=:all: --python-version 3.12" \
      "--platform manylinux2014_x86_64 -d shared/wheels, then WHEELS_DIR=shared/wheels)"
    exit 1
  }
fi
python3 scripts/gpu_ras_verify.py "$OUT" "${@:2}" 2>&1 | tee "$OUT/run.log"
rc=${PIPESTATUS[0]}
rm -rf "$OUT/.wheels"
exit "$rc"
