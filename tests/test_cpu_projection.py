"""bench/cpu_projection.py: the 8-GPU CPU projection docs/performance.md quotes is computed
from the recorded files, not by hand; it must stay computable from what is committed, and
its parts must add up."""

from __future__ import annotations

import json
from pathlib import Path

from bench import cpu_projection as cp

ROOT = Path(__file__).resolve().parent.parent


def test_the_projection_adds_up_and_a_checkout_against_itself_saves_nothing(
    tmp_path: Path,
) -> None:
    out = tmp_path / "projection.json"
    assert cp.main(["--before", str(ROOT), "--after", str(ROOT), "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["interval_seconds"] == 15.0 and r["gpus"] == 8 and r["verified_on_a_gpu"] is False
    for source in r["sources"].values():
        if isinstance(source, str) and source.startswith("bench/"):
            assert (ROOT / source).is_file(), source
    assert r["nvml_saving_millicores_8gpu"] == {"low (used)": 0.0, "high": 0.0}
    for label in ("before", "after"):
        p = r[label]
        assert p["main_millicores"] == round(sum(p["main_parts"].values()), 2)
        parts = p["main_millicores"] + p["throughput_child_millicores"]
        assert abs(p["total_millicores"] - parts - p["nvml_child_millicores"]) < 0.02
        assert p["meets_5_millicores"] is (p["total_millicores"] <= 5.0)
    assert r["before"]["nvml_child_millicores"] == r["after"]["nvml_child_millicores"]
    # the NVML child's projection is the larger of its two extrapolations
    n = r["nvml_child"]
    assert n["recorded"] == max(n["linear_in_gpus"], n["by_recorded_pass"])


def test_the_committed_projection_is_what_the_script_computes_from_the_committed_files() -> None:
    committed = json.loads((ROOT / "bench/results/cpu-projection-8gpu.json").read_text())
    sources = committed["sources"]
    passes = json.loads((ROOT / sources["sysfs_passes"]).read_text())
    assert sources["sysfs_passes_date"] == passes["date"]
    # netdev priced by netdevs that answer, with their ethtool statistics, where measured (a
    # file of its own where the GPU node could not make veths: the code both checkouts share)
    netdev_file = sources.get("netdev_passes")
    netdev_rows = json.loads((ROOT / netdev_file).read_text()) if netdev_file else passes
    netdev = "netdev_ethtool" if "netdev_ethtool" in netdev_rows["samplers"] else "netdev"
    other = ({"netdev", "netdev_ethtool"} - {netdev}).pop()  # priced once, not twice
    for label in ("before", "after"):
        p = committed[label]
        assert f"{other}_passes" not in p["main_parts"]
        for name, rows in (("infiniband", passes), ("pci", passes), (netdev, netdev_rows)):
            row = rows["samplers"][name]["after" if rows is not passes else label]
            steady, first = row["steady_pass_ms_median"], row["first_pass_ms_median"]
            ms = steady + (first - steady) / cp.REFRESH_PASSES
            assert p["main_parts"][f"{name}_passes"] == round(ms / 15.0, 2)
        # the parts are rounded each: their sum may differ from the total in the last place
        assert abs(p["main_millicores"] - sum(p["main_parts"].values())) < 0.02
    # the NVML interval and rotations are each checkout's defaults; the new code's are read
    assert committed["nvml_interval_seconds"]["after"] == cp._nvml_defaults(ROOT, 15.0)[0]
    # the figure docs/performance.md and the README quote
    total = committed["after"]["total_millicores"]
    for doc in ("docs/performance.md", "README.md"):
        assert f"{total} millicores" in (ROOT / doc).read_text(), doc
