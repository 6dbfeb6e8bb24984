"""The agent's average CPU on an 8-GPU node at the default intervals, projected from recorded
measurements (no GPU needed): what each process costs, with the sources it stands on.

    python bench/cpu_projection.py --before OLD_CHECKOUT [--after .]
        [--passes bench/results/sampler-passes.json] [--json FILE]

No lent machine has had 8 GPUs with NVLinks and 8 HCAs, so the figure is built from parts,
each from a file a benchmark wrote:

* **main process, measured**: ``bench/results/sizing-h200x2-nvlink.json`` (the agent as the
  chart runs it on a lent 2x H200, alone: pod watch with 110 pods, 8 busy logs, live NVML,
  scrapes every 30 s). That machine is a VM without InfiniBand devices and with a flat
  virtual PCIe, so its main process did not pay for the InfiniBand and PCI samplers' passes
  of a real node; they are added:
* **InfiniBand, PCI and netdev passes**: ``--passes`` (``bench/bench_sampler_passes.py`` on
  the DGX fixture tree: 12 RDMA devices and their netdevs, 8 GPUs, their PCIe switches;
  netdev from its ``netdev_ethtool`` row when it has one: 12 real veths answering netlink
  and ethtool, 577 statistics each, where the DGX tree's names answer "no such device"), the
  steady pass every interval plus the static refresh (priced as a first pass) once every 40
  passes, before and after, on the machine that file names (a slower CPU than a GPU node's:
  an over-estimate);
* **main process, 8 GPUs instead of 2**: receiving and rendering the NVML child's answer,
  per GPU, from the isolated runs of ``bench/bench_isolation.py`` (agent side of a pass: 0.853
  ms at 1 GPU on a lent 1x H200, 2.8 ms at 4 GPUs on a lent 4x H100; docs/performance.md,
  2026-11-24 and 2026-11-26);
* **throughput child**: as measured on the 2x H200 (8 busy logs at 2,000 lines a second,
  a chatty job: the child's cost is the logs' rate, not the GPUs');
* **NVML child**: the larger of two extrapolations of the 2x H200 with 18 NVLinks a GPU:
  (a) linear in GPUs from the two sizing runs (``sizing-h200-cpu.json``: 1 GPU without
  NVLinks; ``sizing-h200x2-nvlink.json``: 2 GPUs with 18 each), the NVLink GPUs' share per
  GPU times 8 on the 1-GPU run's fixed cost; (b) ``bench/results/nvml-h200x2.json``'s pass
  on that machine (its CPU per pass, extrapolated there to 8 GPUs x 18 NVLinks with the
  per-call costs recorded beside it) at the interval, plus the child's own cost outside the
  pass (pipe, pickling, its statistics) from the 1-GPU sizing run less that run's pass.

The interval is the agent's default (``agent.config.Sampling``). The target is 5 millicores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.config import Sampling  # noqa: E402 - after the path is set
from bench.jsonout import emit  # noqa: E402

RESULTS = ROOT / "bench" / "results"
TARGET_MILLICORES = 5.0
GPUS = 8
#: static refresh of the InfiniBand and PCI samplers (their default ``static_refresh_passes``)
REFRESH_PASSES = 40
#: agent-side CPU of one isolated NVML pass (docs/performance.md, "NVML in a child process"
#: and "4x H100 with NVSwitch"): (GPUs, ms)
AGENT_SIDE_MS = ((1, 0.853), (4, 2.8))
#: the NVML pass of one H200 without NVLinks, in the child (same table): ms
H200_PASS_MS = 0.736


#: runs with the measured checkout first on the path: prints [low, high]
_NVML_CHILD = r"""
import importlib.util, json, statistics, sys
sys.path.insert(0, sys.argv[1])
from agent.nvml.record import RecordingNvml, ReplayNvml, load
from agent.nvml.sampler import NvmlSampler
from tests.nvml.test_nvml_fixtures import with_field_values
spec = importlib.util.spec_from_file_location("bench_nvml", sys.argv[2] + "/bench/bench_nvml.py")
bench = sys.modules["bench_nvml"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
rec = with_field_values(load(sys.argv[1] + "/tests/fixtures/nvml/h200x2.recording.json"))
api = RecordingNvml(ReplayNvml(rec))
sampler = NvmlSampler(lambda: api, watch_xid=False)
records, _ = bench.run_passes(api, sampler, 160)
sampler.close()
model = bench.CostModel.from_measured(bench.MEASURED)
price = bench.MEASURED["cpu_s_per_PcieReplayCounter"]
print(json.dumps([
    statistics.mean(model.price(r.calls, r.fields, p)[0] for r in records[1:])
    for p in (0.0, price)
]))
"""


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RESULTS / name).read_text())
    return data


def millicores(ms_per_pass: float, interval: float) -> float:
    return ms_per_pass / interval  # ms per s = millicores


def role(sizing: dict[str, Any], name: str) -> float:
    return float(next(p["cpu_millicores"] for p in sizing["processes"] if p["role"] == name))


def nvml_model(checkout: Path) -> tuple[float, float]:
    """Mean CPU seconds of a steady NVML pass (2 GPUs, the 2x H200 recording with batched
    field answers) of ``checkout``'s sampler, priced by ``bench/bench_nvml.py``'s recorded
    per-call costs: (unmeasured calls at 0, at one driver round trip)."""
    got = subprocess.run(
        [sys.executable, "-c", _NVML_CHILD, str(checkout), str(ROOT)],
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    low, high = json.loads(got.stdout.splitlines()[-1])
    return float(low), float(high)


def rotation_saving_ms(traffic_rotation: int, fabric_rotation: int) -> dict[str, float]:
    """CPU ms a pass saves on 8 GPUs by reading each GPU's NVLink traffic fields and fabric
    registration every Nth pass instead of every pass, at the costs recorded on the 2x H200:
    the two traffic fields over all links in a loop (``nvml-fieldvalues-h200x2.json``; a
    pass's batch costs more than the loop's, so this is the lower bound) and the fabric call
    timed inside the sampler's passes (``nvml-h200x2-per-call.json``)."""
    traffic = float(load("nvml-fieldvalues-h200x2.json")["cpu_s_FieldValues_2_traffic_all_links"])
    per_call = load("nvml-h200x2-per-call.json")["per_call"]["by_function"]
    fabric = float(per_call["gpu_fabric_info"]["cpu_us_per_call"]) / 1e6
    return {
        "traffic": traffic * 1000 * GPUS * (1 - 1 / traffic_rotation),
        "fabric": fabric * 1000 * GPUS * (1 - 1 / fabric_rotation),
    }


def project(
    passes: dict[str, Any],
    interval: float,
    checkouts: dict[str, Path],
    sizing: tuple[str, str] = ("sizing-h200-cpu.json", "sizing-h200x2-nvlink.json"),
    *,
    nvml: dict[str, tuple[float, int, int]] | None = None,
    netdev_passes: dict[str, Any] | None = None,
    main_side_by_side: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """``nvml``: each checkout's NVML defaults, (interval, traffic rotation, fabric
    rotation) by label (None: ``interval``, every pass: the code the sizing runs measured);
    ``netdev_passes``: the file whose ``netdev_ethtool`` row prices netdev (None: ``passes``);
    ``main_side_by_side``: two sizing runs of the old and new code at the same time on one
    GPU node, whose main processes' difference is taken off the measured main process of the
    new code."""
    defaults = nvml or {label: (interval, 1, 1) for label in checkouts}
    nvml_every = {label: d[0] for label, d in defaults.items()}
    one, two = load(sizing[0]), load(sizing[1])
    nvml = load("nvml-h200x2.json")
    gpus_two = int(nvml["gpus"])

    # the NVML child, as recorded (the code of the 2x H200 run)
    fixed = role(one, "nvml child")
    outside_pass = max(0.0, fixed - millicores(H200_PASS_MS, interval))
    per_gpu = (role(two, "nvml child") - outside_pass) / gpus_two
    linear = outside_pass + per_gpu * GPUS
    pass_8 = float(nvml["extrapolated_8gpu_18link_cpu_seconds"]["median"]) * 1000
    by_pass = millicores(pass_8, interval) + outside_pass
    recorded_child = max(linear, by_pass)

    # the main process: measured, plus 6 more GPUs' answers, plus InfiniBand and PCI passes
    (g1, ms1), (g4, ms4) = AGENT_SIDE_MS
    agent_per_gpu_ms = (ms4 - ms1) / (g4 - g1)
    more_gpus = {
        k: millicores(agent_per_gpu_ms * (GPUS - gpus_two), every)
        for k, every in nvml_every.items()
    }
    main_measured = role(two, "main")
    main_saved = 0.0
    if main_side_by_side is not None:
        main_saved = max(
            0.0, role(load(main_side_by_side[0]), "main") - role(load(main_side_by_side[1]), "main")
        )
    throughput = role(two, "throughput child")

    # what the code before and after asks NVML, priced with the recorded per-call costs:
    # the change in the mean pass (refresh passes included) scaled to 8 GPUs, with calls
    # nobody has priced at 0 (``saving_low``) and at one driver round trip (``saving_high``)
    priced = {label: nvml_model(checkout) for label, checkout in checkouts.items()}
    saving = {
        k: (priced["before"][k] - priced["after"][k]) / gpus_two * GPUS * 1000 for k in (0, 1)
    }
    # the recorded child at the old interval is a pass every ``interval`` plus the child's
    # work outside its pass; the new code's pass is that pass less what the rotations save,
    # every ``nvml_interval`` (the work outside the pass kept as it was: an over-estimate)
    rotated = {label: rotation_saving_ms(d[1], d[2]) for label, d in defaults.items()}
    pass_ms = (recorded_child - outside_pass) * interval
    nvml_child = {
        label: outside_pass
        + millicores(
            pass_ms - sum(rotated[label].values()) - (saving[0] if label == "after" else 0.0),
            nvml_every[label],
        )
        for label in ("before", "after")
    }
    out: dict[str, Any] = {
        "nvml_priced_mean_pass_ms_2gpu": {
            label: {
                "unmeasured_at_0": round(v[0] * 1000, 3),
                "unmeasured_at_replay": round(v[1] * 1000, 3),
            }
            for label, v in priced.items()
        },
        "nvml_saving_millicores_8gpu": {
            "low (used)": round(millicores(saving[0], interval), 3),
            "high": round(millicores(saving[1], interval), 3),
        },
        "nvml_intervals_seconds": nvml_every,
        "nvml_rotation_saving_ms_per_pass_8gpu": {
            label: {k: round(v, 2) for k, v in r.items()} for label, r in rotated.items()
        },
        "main_saved_side_by_side_millicores": round(main_saved, 2),
    }
    netdev_rows = (netdev_passes or passes)["samplers"]
    for label in ("before", "after"):
        sysfs_ms = 0.0
        parts: dict[str, float] = {}
        rows = {k: v for k, v in passes["samplers"].items() if not k.startswith("netdev")}
        if "netdev_ethtool" in netdev_rows:
            # answered netdevs with their ethtool statistics stand in for the DGX tree's names
            rows["netdev_ethtool"] = netdev_rows["netdev_ethtool"]
        elif "netdev" in netdev_rows:
            rows["netdev"] = netdev_rows["netdev"]
        for name, row in rows.items():
            # a separate netdev file prices the netdev code both checkouts share (its "after")
            r = row["after" if name.startswith("netdev") and netdev_passes else label]
            steady, first = r["steady_pass_ms_median"], r["first_pass_ms_median"]
            ms = steady + (first - steady) / REFRESH_PASSES
            parts[name] = round(millicores(ms, interval), 2)
            sysfs_ms += ms
        measured = main_measured - (main_saved if label == "after" else 0.0)
        main = measured + more_gpus[label] + millicores(sysfs_ms, interval)
        total = main + throughput + nvml_child[label]
        out[label] = {
            "main_millicores": round(main, 2),
            "main_parts": {
                "measured_2x_h200": round(measured, 2),
                "six_more_gpus_answers": round(more_gpus[label], 2),
                **{f"{k}_passes": v for k, v in parts.items()},
            },
            "throughput_child_millicores": throughput,
            "nvml_child_millicores": round(nvml_child[label], 2),
            "total_millicores": round(total, 2),
            "meets_5_millicores": total <= TARGET_MILLICORES,
            "without_sysfs_and_netdev_passes": round(total - millicores(sysfs_ms, interval), 2),
        }
    out["nvml_child"] = {
        "recorded": round(recorded_child, 2),
        "linear_in_gpus": round(linear, 2),
        "by_recorded_pass": round(by_pass, 2),
        "pass_ms_8gpu_18link": round(pass_8, 2),
        "child_outside_pass_millicores": round(outside_pass, 2),
        "fixed_1gpu_millicores": fixed,
        "per_nvlink_gpu_millicores": round(per_gpu, 2),
    }
    return out


_DEFAULTS = (
    "import sys; sys.path.insert(0, sys.argv[1]); import agent.config as c; "
    "from agent.nvml.sampler import NvmlSampler as S; s = S(watch_xid=False); "
    "n = getattr(c.NvmlSettings(), 'interval_seconds', None); "
    "print(n or 0, getattr(s, 'traffic_rotation', 1), getattr(s, 'fabric_rotation', 1))"
)


def _nvml_defaults(checkout: Path, interval: float) -> tuple[float, int, int]:
    """The NVML interval, NVLink traffic rotation and fabric rotation ``checkout`` defaults
    to (``interval`` and every pass where it has no such setting)."""
    got = subprocess.run(
        [sys.executable, "-c", _DEFAULTS, str(checkout)],
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
    )
    every, traffic, fabric = got.stdout.split()
    return float(every) or interval, int(traffic), int(fabric)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--passes", type=Path, default=RESULTS / "sampler-passes.json")
    ap.add_argument("--before", type=Path, required=True, help="the old checkout")
    ap.add_argument("--after", type=Path, default=ROOT, help="the new checkout")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--netdev-passes",
        type=Path,
        default=None,
        help="bench_sampler_passes output whose netdev_ethtool row prices netdev (default: "
        "--passes): a GPU node without ip(8) cannot make the veths",
    )
    ap.add_argument(
        "--main-side-by-side",
        nargs=2,
        metavar=("BEFORE", "AFTER"),
        default=None,
        help="bench/results files: the old and the new code sized at the same time on one GPU "
        "node; the main process's difference is taken off the 2-GPU run's",
    )
    ap.add_argument(
        "--sizing-1gpu",
        default="sizing-h200-cpu.json",
        help="bench/results file: the agent on the lent 1x H200 (the NVML child's fixed cost)",
    )
    ap.add_argument(
        "--sizing-2gpu",
        default="sizing-h200x2-nvlink.json",
        help="bench/results file: the agent on the lent 2x H200 with NVLinks (the main "
        "process, the throughput child, the NVML child per NVLink GPU)",
    )
    ns = ap.parse_args(argv)
    passes = json.loads(ns.passes.read_text())
    netdev = json.loads(ns.netdev_passes.read_text()) if ns.netdev_passes else None
    interval = Sampling().interval_seconds
    checkouts = {"before": ns.before.resolve(), "after": ns.after.resolve()}
    nvml = {label: _nvml_defaults(c, interval) for label, c in checkouts.items()}
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "gpus": GPUS,
        "interval_seconds": interval,
        "nvml_interval_seconds": {label: d[0] for label, d in nvml.items()},
        "target_millicores": TARGET_MILLICORES,
        "verified_on_a_gpu": False,
        "sources": {
            "sizing_1gpu": f"bench/results/{ns.sizing_1gpu}",
            "sizing_2gpu_nvlink": f"bench/results/{ns.sizing_2gpu}",
            "nvml_pass": "bench/results/nvml-h200x2.json",
            "sysfs_passes": str(ns.passes.resolve().relative_to(ROOT)),
            "sysfs_passes_machine": passes["machine"],
            "sysfs_passes_date": passes["date"],
            "sysfs_passes_load_average_1m": passes["load_average_1m"],
            "netdev_passes": str(ns.netdev_passes) if ns.netdev_passes else None,
            "main_side_by_side": ns.main_side_by_side,
            "nvml_rotation_costs": [
                "bench/results/nvml-fieldvalues-h200x2.json",
                "bench/results/nvml-h200x2-per-call.json",
            ],
        },
        **project(
            passes,
            interval,
            checkouts,
            (ns.sizing_1gpu, ns.sizing_2gpu),
            nvml=nvml,
            netdev_passes=netdev,
            main_side_by_side=ns.main_side_by_side,
        ),
    }
    emit(result, ns.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
