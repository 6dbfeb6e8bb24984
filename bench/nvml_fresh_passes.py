"""Does NVML crash a process in its first passes? The NVML sampler's first three passes, each
time in a fresh process (Python's fault handler on), ``--runs`` times per variant and
environment, counting how each process ended; a crash is printed with what it printed (the
call it died in: :func:`bench_sizing.crash_line`, and the last 30 lines of its stderr the
first time a variant crashes). ``bench/nvml_bisect.py`` runs each variant for minutes in one
process; this catches what happens once per process, at start (issue 30: on a 2x H200 with
NVLinks, a segfault in the library's function lookup on the first pass). Run on a GPU node:

    python3 bench/nvml_fresh_passes.py [--runs 20] [--json FILE]

Variants: ``tracemalloc`` (what ``bench_sizing.py --per-gpu`` runs: tracemalloc on, no XID
watch), ``prelude`` (nvmlInit, device count, nvmlShutdown, then the passes: the same
measurement's start, without tracemalloc), ``agent`` (the passes as the NVML child makes them,
the XID watch on); environments: ``plain`` and ``mcheck3`` (``MALLOC_CHECK_=3``: glibc checks
the heap on every call and aborts where it is first found corrupted).
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_sizing import crash_line  # noqa: E402
from bench.jsonout import emit  # noqa: E402

_IMPORTS = "from agent.nvml.api import LiveNvml\nfrom agent.nvml.sampler import NvmlSampler\n"
VARIANTS: dict[str, str] = {
    "tracemalloc": "import tracemalloc\ntracemalloc.start()\n"
    + _IMPORTS
    + "s = NvmlSampler(LiveNvml, watch_xid=False)\nfor _ in range(3):\n    s.sample()\n",
    "prelude": _IMPORTS
    + "a = LiveNvml()\na.init()\na.device_count()\na.shutdown()\n"
    + "s = NvmlSampler(LiveNvml, watch_xid=False)\nfor _ in range(3):\n    s.sample()\n",
    "agent": _IMPORTS
    + "s = NvmlSampler(LiveNvml, watch_xid=True)\nfor _ in range(3):\n    s.sample()\ns.close()\n",
}
ENVIRONMENTS: dict[str, dict[str, str]] = {"plain": {}, "mcheck3": {"MALLOC_CHECK_": "3"}}


def run(
    commands: Mapping[str, Sequence[str]],
    environments: Mapping[str, Mapping[str, str]],
    runs: int,
    timeout: float = 120.0,
) -> dict[str, object]:
    """Each command ``runs`` times in each environment, each a fresh process: how each
    variant ended, per environment, and every crash."""
    ended: dict[str, collections.Counter[str]] = {}
    crashes: list[dict[str, object]] = []
    for env_name, extra in environments.items():
        env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}", **extra}
        for name, cmd in commands.items():
            tally = ended.setdefault(f"{env_name}/{name}", collections.Counter())
            for i in range(runs):
                try:
                    done = subprocess.run(
                        list(cmd),
                        capture_output=True,
                        text=True,
                        env=env,
                        timeout=timeout,
                        check=False,
                    )
                except subprocess.TimeoutExpired:
                    tally["timeout"] += 1
                    continue
                rc = done.returncode
                how = "ok" if rc == 0 else f"signal {-rc}" if rc < 0 else f"exit {rc}"
                tally[how] += 1
                if rc == 0:
                    continue
                line = crash_line(done.stderr, 600)
                crashes.append({"variant": name, "environment": env_name, "run": i,
                                "ended": how, "line": line})  # fmt: skip
                print(f"{env_name}/{name} #{i}: {how}: {line}", flush=True)
                if tally[how] == 1:
                    tail = done.stderr.strip().splitlines()[-30:]
                    print("    " + "\n    ".join(tail), flush=True)
    return {"runs": runs, "ended": {k: dict(v) for k, v in ended.items()}, "crashes": crashes}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--runs", type=int, default=20, help="processes per variant and environment")
    ap.add_argument("--json", type=Path, default=None)
    ns = ap.parse_args(argv)
    commands = {k: [sys.executable, "-X", "faulthandler", "-c", v] for k, v in VARIANTS.items()}
    result = run(commands, ENVIRONMENTS, ns.runs)
    emit(result, ns.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
