#!/usr/bin/env bash
# Sizing on any GPU node: what the agent holds and spends as the chart deploys it (the pod
# watch against a stand-in API server with 110 pods, the kubelet's pod-resources socket giving
# the node's GPUs to 8 pods, the throughput child reading 8 busy container logs, the NVML
# child on this node's own NVML, /metrics scraped every 30 s), RSS, PSS and CPU of the main
# process and of each child over 5 minutes after a minute's warm-up, and the NVML sampler's
# memory per GPU (tracemalloc over three passes) to extrapolate to 8 GPUs. Checks that the
# extrapolated figures fit the chart's resources (read from values.yaml) with the headroom
# values.yaml states; reports the footprint targets of docs/performance.md beside them. The
# agent and its dependencies are compiled to bytecode first (bench_sizing.py), as the image
# ships them.
# Never writes into the repository (bytecode aside, which git ignores): everything goes to
# OUTDIR.
#   bash scripts/gpu_sizing.sh OUTDIR
# Needs python3 with the agent's dependencies and the bench's (pytest-httpserver, werkzeug,
# kubernetes, grpcio, protobuf): PYTHONPATH may point at carried wheels. gcc is not needed.
set -uo pipefail
OUT=${1:?usage: gpu_sizing.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
step() { echo; echo "=== $*"; }
rc=0
tree_sum() { find agent exporter tests scripts bench -type f ! -name '*.pyc' -print0 | sort -z | xargs -0 md5sum | md5sum; }
before=$(tree_sum)

step "machine"
{ nvidia-smi -L; nproc; free -m; uname -a; python3 --version; } 2>&1 | tee "$OUT/machine.txt"

step "the agent as the chart runs it, live NVML (5 min after 1 min of warm-up)"
# the chart's memory limit, given to the agent as the chart does (each child's ceiling is its
# share of it)
limit=$(python3 -c 'import yaml; v = yaml.safe_load(open("deploy/helm/fabricscope/values.yaml"))["resources"]["limits"]["memory"]; u = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}; print(int(v[:-2]) * u[v[-2:]])')
python3 bench/bench_sizing.py --live-nvml --sysfs /sys --per-gpu --extrapolate-to 8 \
  --memory-limit "$limit" \
  --duration 300 --warmup 60 --json "$OUT/sizing-gpu.json" 2>&1 | tee "$OUT/sizing-gpu.txt" || rc=1

step "checks"
python3 - "$OUT/sizing-gpu.json" <<'PY' || rc=1
import json, sys
r = json.load(open(sys.argv[1]))
roles = sorted(p["role"] for p in r["processes"])
ok = True
def check(cond, what):
    global ok
    print(("PASS: " if cond else "FAIL: ") + what)
    ok = ok and cond
check("nvml child" in roles, f"an NVML child process (roles: {roles})")
check("throughput child" in roles, "a throughput child holding the pod logs")
check(r["throughput_series"] == r["busy_logs"], f"{r['throughput_series']} throughput series for {r['busy_logs']} logs")
check(r.get("memory_ceiling_errors") == 0, f"no child reached its memory ceiling under the chart's limit ({r.get('memory_limit')} bytes): {r.get('memory_ceiling_errors')} ended")
check(r["nvml_sampler_memory"]["gpus"] >= 1, f"NVML saw {r['nvml_sampler_memory']['gpus']:.0f} GPUs" + (f" ({r['nvml_sampler_memory']['error']})" if "error" in r["nvml_sampler_memory"] else ""))
# a crash of NVIDIA's library in the per-GPU measurement's own process, started again: said
for c in r["nvml_sampler_memory"].get("crashes", []):
    print(f"NOTE: the per-GPU measurement's process {c} (started again)")
e = r["extrapolated"]
main = next(p for p in r["processes"] if p["role"] == "main")
print(f"measured at {e['from_gpus']} GPUs: RSS {r['total']['rss_mib']} MiB, PSS {r['total']['pss_mib']} MiB, CPU {r['total']['cpu_millicores']}m")
print(f"extrapolated to {e['to_gpus']} GPUs: RSS {e['rss_mib']} MiB, PSS {e['pss_mib']} MiB (+{e['added_mib']} MiB)")
for p in r["processes"]:
    print(f"  {p['role']}: RSS {p['rss_mib']} MiB, PSS {p['pss_mib']} MiB, CPU {p['cpu_millicores']}m")
# the chart's figures, read from the chart itself: the checks follow it
import re, yaml
values = yaml.safe_load(open("deploy/helm/fabricscope/values.yaml"))["resources"]
def mib(q):
    m = re.fullmatch(r"(\d+)(Mi|Gi)", str(q))
    return int(m.group(1)) * (1024 if m.group(2) == "Gi" else 1)
req, lim = mib(values["requests"]["memory"]), mib(values["limits"]["memory"])
cpu = int(str(values["requests"]["cpu"]).rstrip("m"))
print(f"chart: requests memory {req}Mi, limits memory {lim}Mi, requests cpu {cpu}m (deploy/helm/fabricscope/values.yaml)")
# the footprint targets (docs/performance.md), reported, not checked: the chart's figures below
# are what this node must fit, and they are checked
def target(cond, what):
    print(("target met: " if cond else "target NOT met: ") + what)
target(e["pss_mib"] <= 96, f"extrapolated PSS {e['pss_mib']} MiB within 96 MiB")
target(e["rss_mib"] <= 128, f"extrapolated RSS {e['rss_mib']} MiB within 128 MiB")
target(main["rss_mib"] <= 64, f"main process RSS {main['rss_mib']} MiB within 64 MiB")
# the chart sized from them: PSS (what the memory cgroup charges for the processes) within
# the request, RSS with half again of headroom within the limit, CPU within the request
check(e["pss_mib"] <= req, f"extrapolated PSS within the {req}Mi request")
check(e["rss_mib"] * 1.5 <= lim, f"extrapolated RSS with half again of headroom within the {lim}Mi limit")
check(r["total"]["cpu_millicores"] <= cpu, f"average CPU within the {cpu}m request")
# each process within what the partition of the limit holds for it (agent/core/ceiling.py):
# on a node of 8 GPUs this checks the NVML floor's assumption (at most 4 MiB more a GPU)
from agent.core.ceiling import MAIN, SHARES
gpus = r["nvml_sampler_memory"]["gpus"]
check(main["rss_mib"] * 2**20 < MAIN.floor, f"main process RSS {main['rss_mib']} MiB within its {MAIN.floor >> 20} MiB floor")
for p in r["processes"]:
    child = p["role"].removesuffix(" child")
    if child in SHARES and "vmdata_mib" in p:
        floor = SHARES[child].floor
        check(p["vmdata_mib"] * 2**20 < floor, f"{p['role']} counted {p['vmdata_mib']} MiB (VmData) within its {floor >> 20} MiB floor, {gpus:.0f} GPUs")
sys.exit(0 if ok else 1)
PY

after=$(tree_sum)
[ "$before" = "$after" ] || { echo "FAIL: the repository changed"; rc=1; }
echo; echo "gpu_sizing: $([ $rc = 0 ] && echo PASS || echo FAIL) (results in $OUT)"
exit $rc
