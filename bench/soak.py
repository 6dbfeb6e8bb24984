"""Does the agent grow? Runs it for ``--warmup`` + ``--duration`` seconds under far more work
per hour than a node gives it, samples the RSS, PSS, USS and anonymous memory of the main
process and of each supervised child every ``--every`` seconds, fits each one's growth in MiB
a day, and judges all processes together against ``--max-slope``.

The load (real processes and sockets; only the cluster is stood in for, as in
``bench/bench_sizing.py``, whose stand-ins this reuses):

- ``--sampling.interval`` short (1 s by default, 15 times the default's passes);
- the pod watch against a stand-in API server with ``--pods`` pods whose watch adds and
  deletes a pod every ``--churn`` seconds (each with a fresh uid) and ends every 60 s (a
  new watch resumes from the latest resourceVersion), and relists on a 410 every 10 min;
- the throughput child reading ``--logs`` busy container logs, rotated as the kubelet
  rotates them (``0.log`` renamed to ``0.log.<time>``, a new ``0.log``; the oldest
  removed past 2) every ``--rotate`` seconds;
- the NVML child on the stand-in ``libnvidia-ml.so.1`` (``tests/nvml_standin``), killed
  (SIGKILL) every ``--kill-child`` seconds: the agent replaces it (child restarts);
- ``/metrics`` scraped every ``--scrape`` seconds.

The fit (:func:`fit`, :func:`analyse`): the warm-up is dropped (and a replaced child's own
first ``--child-warmup`` seconds: a fresh NVML child's RSS rises some 40-50 KiB over its first
ten minutes and is then flat to the byte, so with ``--kill-child 1800`` a child warm-up of 600
keeps that one-off rise of every lifetime out of the shared slope); each process's lifetimes
keep their own level and share one slope; the slope's standard error is widened for the
residuals' autocorrelation (memory moves in steps); the verdict is on the last ``--late`` part
of the run, the RSS of all processes summed (PSS and USS are reported, not judged: other
processes mapping the same files move them; so is the anonymous memory, the resident pages
backed by no file, where a leak lives and which neither the page cache nor other processes
move). ``below``: slope + 2 SE under the bound; ``above``: slope - 2 SE over it;
``unresolved``: the run is too short or noisy to tell, which the output says, with the smallest
slope it resolves. With ``--max-slope`` it exits 1 on ``above``, or when a leak of twice the
bound would not have read ``above`` (too noisy to check anything), or (``--require-resolved``)
on anything but ``below``.

``--probe DIR`` loads ``bench/memprobe`` into the agent's main process (tracemalloc,
objects by type, malloc and pymalloc statistics, smaps by mapping, dumped as JSON lines; the
supervised children run ``python -S``, without it);
``--leak N`` makes the main process keep N bytes more a second: the positive control.

With ``--json`` the samples so far are written every ``--checkpoint`` seconds
(``"complete": false``): a run killed before its end leaves them, and ``--refit`` fits them.

    python bench/soak.py --duration 3600 --json soak.json [--max-slope 1]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_sizing as sizing  # the stand-ins and the /proc readers

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def pod_list_json(version: int, items: Iterable[dict[str, Any]]) -> str:
    """A PodList as the API server answers a list, at ``version``."""
    return json.dumps(
        {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(version)},
            "items": list(items),
        }
    )


def churn_step(
    state: dict[str, int], items: dict[int, dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One pod added and the oldest one holding no GPU (the first 8 hold them) deleted, each
    at a resourceVersion of its own, as the API server would: (added, deleted). ``state``
    holds the ``version`` and the ``next`` pod's number; the caller holds their lock."""
    state["version"] += 1
    new = state["next"]
    state["next"] += 1
    added = sizing.pod(new, False)
    added["metadata"]["resourceVersion"] = str(state["version"])
    items[new] = added
    gone = items.pop(min(i for i in items if i >= 8))
    state["version"] += 1
    gone = {**gone, "metadata": {**gone["metadata"], "resourceVersion": str(state["version"])}}
    return added, gone


@contextlib.contextmanager
def churning_api_server(pods: int, churn: float) -> Iterator[str]:
    """A pod list of ``pods`` pods; watches that add a pod and delete another every
    ``churn`` seconds and end after 60 s; a 410 (relist) for a watch every 10 minutes."""
    from pytest_httpserver import HTTPServer
    from werkzeug.wrappers import Request, Response

    lock = threading.Lock()
    state: dict[str, Any] = {"version": 5000, "next": pods, "watches": 0}
    items = {i: sizing.pod(i, i < 8) for i in range(pods)}

    def handle(request: Request) -> Response:
        if request.args.get("watch") != "true":
            with lock:
                body = pod_list_json(state["version"], items.values())
            return Response(body, mimetype="application/json")
        with lock:
            state["watches"] += 1
            expire = state["watches"] % 10 == 0

        def events() -> Iterator[str]:
            if expire:
                status = {"kind": "Status", "code": 410, "reason": "Expired"}
                yield json.dumps({"type": "ERROR", "object": status}) + "\n"
                return
            end = time.monotonic() + 60
            while time.monotonic() < end:
                time.sleep(churn)
                with lock:
                    added, gone = churn_step(state, items)
                yield json.dumps({"type": "ADDED", "object": added}) + "\n"
                yield json.dumps({"type": "DELETED", "object": gone}) + "\n"

        return Response(events(), mimetype="application/json")

    server = HTTPServer(threaded=True)
    server.expect_request("/api/v1/pods").respond_with_handler(handle)
    server.start()
    try:
        yield server.url_for("/").rstrip("/")
    finally:
        server.clear()
        server.stop()


class RotatingLogs(sizing.BusyLogs):
    """Busy logs, rotated as the kubelet rotates container logs."""

    def __init__(self, root: Path, n: int, rate: float, every: float) -> None:
        super().__init__(root, n, rate)
        self.every = every
        self.rotations = 0
        self.done = threading.Event()

    def run(self) -> None:
        while True:
            # the writer opens its files when it starts: stop it, rotate, start it again
            self.stop.clear()
            writer = threading.Thread(target=super().run, daemon=True)
            writer.start()
            finished = self.done.wait(self.every)
            self.stop.set()
            writer.join(5)
            if finished:
                break
            stamp = time.strftime("%Y%m%d-%H%M%S")
            for f in self.files:
                with contextlib.suppress(FileNotFoundError):
                    f.rename(f.with_name(f"0.log.{stamp}"))
                for old in sorted(f.parent.glob("0.log.*"))[:-2]:
                    old.unlink()
            self.rotations += 1

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.thread.join(10)


#: how many standard errors make a slope "resolved" against a bound
SIGMAS = 2.0
_DAY_MIB = 86400 / 2**20  # bytes a second -> MiB a day
#: the processes the verdict sums (a child whose role never showed is left out)
ROLES = ("main", "nvml child", "throughput child")
KINDS = ("rss", "pss", "uss", "anon")

Segment = list[tuple[float, float]]  # (seconds, bytes) of one process's lifetime
#: one sample of one process: (seconds, RSS, PSS, USS, anonymous bytes); a run written before
#: anonymous memory was sampled has no fifth
Sample = tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Fit:
    """A slope and its standard error, in MiB a day, fitted over ``seconds`` of samples."""

    slope: float
    stderr: float | None  # None: too few samples to say
    samples: int
    seconds: float

    def verdict(self, bound: float) -> str:
        """``below``: slope + 2 SE at or under ``bound`` (MiB a day); ``above``: slope - 2 SE
        over it; ``unresolved``: too short or too noisy a run to tell."""
        if self.stderr is None:
            return "unresolved"
        if self.slope + SIGMAS * self.stderr <= bound:
            return "below"
        if self.slope - SIGMAS * self.stderr > bound:
            return "above"
        return "unresolved"

    def as_dict(self, bound: float) -> dict[str, Any]:
        return {
            "slope_mib_per_day": round(self.slope, 2),
            "stderr_mib_per_day": None if self.stderr is None else round(self.stderr, 2),
            "samples": self.samples,
            "seconds": round(self.seconds),
            "verdict": self.verdict(bound),
        }


def fit(segments: list[Segment]) -> Fit:
    """One least-squares slope through several lifetimes of one process (a child replaced
    starts again from its imports): each lifetime keeps its own level (intercept), the slope
    is shared, fitted from how each grows within its life (segments of under 3 samples add
    nothing).

    Memory moves in steps (a page, a pool, an arena), so neighbouring samples are not
    independent: the slope's standard error is widened by the residuals' lag-1
    autocorrelation ``r`` (``n_eff = n (1 - r) / (1 + r)``), as for any autocorrelated
    series; without that a step in the middle of a run would read as a precise slope."""
    used = [seg for seg in segments if len(seg) >= 3]
    n = sum(len(seg) for seg in used)
    span = sum(seg[-1][0] - seg[0][0] for seg in used)
    centred: list[list[tuple[float, float]]] = []
    for seg in used:
        mt = sum(t for t, _ in seg) / len(seg)
        mv = sum(v for _, v in seg) / len(seg)
        centred.append([(t - mt, v - mv) for t, v in seg])
    var = sum(t * t for seg in centred for t, _ in seg)
    if n < 3 or var == 0:
        return Fit(0.0, None, n, span)
    slope = sum(t * v for seg in centred for t, v in seg) / var
    resid = [[v - slope * t for t, v in seg] for seg in centred]
    ss = sum(e * e for seg in resid for e in seg)
    dof = n - len(used) - 1
    if dof < 1:
        return Fit(slope * _DAY_MIB, None, n, span)
    if ss == 0:
        return Fit(slope * _DAY_MIB, 0.0, n, span)
    r1 = sum(x * y for seg in resid for x, y in itertools.pairwise(seg)) / ss
    r1 = min(max(r1, 0.0), 0.99)
    n_eff = max(3.0, n * (1 - r1) / (1 + r1))
    stderr = (ss / dof / var) ** 0.5 * (n / n_eff) ** 0.5
    return Fit(slope * _DAY_MIB, stderr * _DAY_MIB, n, span)


def late(segments: list[Segment], fraction: float) -> list[Segment]:
    """The samples in the last ``fraction`` of the segments' overall time span."""
    times = [t for seg in segments for t, _ in seg]
    if not times:
        return []
    cut = max(times) - (max(times) - min(times)) * fraction
    return [[p for p in seg if p[0] >= cut] for seg in segments]


def total(fits: list[Fit]) -> Fit:
    """The processes together: slopes add, independent errors add in quadrature; none at all
    says nothing (unresolved)."""
    if not fits:
        return Fit(0.0, None, 0, 0.0)
    errors = [f.stderr for f in fits]
    stderr = None if any(e is None for e in errors) else sum(e * e for e in errors if e) ** 0.5
    return Fit(
        sum(f.slope for f in fits),
        stderr,
        sum(f.samples for f in fits),
        max((f.seconds for f in fits), default=0.0),
    )


def analyse(
    samples: dict[int, list[Sample]],
    roles: dict[int, str],
    *,
    warmup: float,
    child_warmup: float,
    fraction: float,
    bound: float,
) -> dict[str, Any]:
    """Fits per process role and for all together, after the warm-up (and, for a child
    started later, ``child_warmup`` seconds of its own), over all of the rest and over its
    last ``fraction``; the verdict on all processes' RSS over the late part."""
    by_role: dict[str, list[list[Sample]]] = {}
    for pid, pts in samples.items():
        # a child that came later (a replaced one) starts again from its imports; the main
        # process is there from the start (its first sample comes a moment after it)
        later = pts[0][0] > 0 and roles.get(pid) != "main"
        start = max(warmup, pts[0][0] + child_warmup) if later else warmup
        kept = [p for p in pts if p[0] >= start]
        if kept:
            by_role.setdefault(roles.get(pid, "child"), []).append(kept)
    per: dict[str, Any] = {}
    late_fits: dict[str, dict[str, Fit]] = {}
    whole_fits: dict[str, dict[str, Fit]] = {}
    for role, lives in sorted(by_role.items()):
        lives.sort(key=lambda seg: seg[0][0])
        late_fits[role] = {}
        whole_fits[role] = {}
        entry: dict[str, Any] = {
            "lifetimes": len(lives),
            "rss_mib_first": round(lives[0][0][1] / 2**20, 1),
            "rss_mib_last": round(lives[-1][-1][1] / 2**20, 1),
            "uss_mib_last": round(lives[-1][-1][3] / 2**20, 1),
        }
        for i, kind in enumerate(KINDS, start=1):
            if any(len(p) <= i for seg in lives for p in seg):
                continue  # not sampled by the run (an older one: no anonymous memory)
            series = [[(p[0], float(p[i])) for p in seg] for seg in lives]
            whole_fits[role][kind] = fit(series)
            late_fits[role][kind] = fit(late(series, fraction))
            entry[kind] = {
                "after_warmup": whole_fits[role][kind].as_dict(bound),
                "late": late_fits[role][kind].as_dict(bound),
            }
        per[role] = entry
    present = [r for r in ROLES if r in late_fits]
    all_fits: dict[str, Any] = {}
    for kind in KINDS:
        if any(kind not in late_fits[r] for r in present):
            continue
        all_fits[kind] = {
            "after_warmup": total([whole_fits[r][kind] for r in present]).as_dict(bound),
            "late": total([late_fits[r][kind] for r in present]).as_dict(bound),
        }
    # the verdict: RSS of all processes over the late part. PSS and USS are reported, not
    # judged: any other process on the machine that maps the same files (another Python of
    # the same interpreter) moves them (a page it stops sharing becomes this one's own)
    checked = [total([late_fits[r]["rss"] for r in present])]
    verdicts = [f.verdict(bound) for f in checked]
    verdict = (
        "above" if "above" in verdicts else "unresolved" if "unresolved" in verdicts else "below"
    )
    # what this run can see: would a leak of twice the bound read "above" in a process that
    # does not grow? Adding a line to every sample adds its slope to the fit and leaves the
    # error as it is: 2 * bound - 2 SE > bound
    caught = all(
        Fit(2 * bound, f.stderr, f.samples, f.seconds).verdict(bound) == "above" for f in checked
    )
    return {
        "bound_mib_per_day": bound,
        "verdict": verdict,
        "resolution_mib_per_day": max(
            (round(SIGMAS * f.stderr, 2) for f in checked if f.stderr is not None), default=None
        ),
        "leak_of_twice_the_bound_caught": caught,
        "missing_roles": [r for r in ROLES if r not in late_fits],
        "processes": per,
        "total": all_fits,
    }


def analyse_run(
    samples: dict[int, list[Sample]],
    roles: dict[int, str],
    ns: argparse.Namespace,
    bound: float,
) -> dict[str, Any]:
    """:func:`analyse` with the command line's warm-ups and late fraction: the run and
    ``--refit`` fit alike."""
    return analyse(
        samples,
        roles,
        warmup=ns.warmup,
        child_warmup=ns.child_warmup,
        fraction=ns.late,
        bound=bound,
    )


def usage(pid: int) -> tuple[int, int, int, int]:
    """(RSS, PSS, USS, anonymous) bytes: USS is the pages only this process maps
    (Private_Clean + Private_Dirty), which no other process on the machine moves; PSS shares
    each shared page among the processes mapping it, the agent's and any other's (another
    Python using the same libpython counts); anonymous is the resident pages backed by no
    file (the heaps, pymalloc's arenas, stacks): where a leak lives, and what neither the
    page cache nor another process's mappings move (a library's pages faulted in or evicted
    move RSS, not it)."""
    got = dict.fromkeys(("Rss", "Pss", "Private_Clean", "Private_Dirty", "Anonymous"), 0)
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in got:
            got[key] = int(rest.split()[0]) * 1024
    return (
        got["Rss"],
        got["Pss"],
        got["Private_Clean"] + got["Private_Dirty"],
        got["Anonymous"],
    )


def write_json(path: Path, result: dict[str, Any]) -> None:
    """``result`` to ``path`` whole or not at all (written beside it, then renamed): a run
    killed while it writes a checkpoint leaves the checkpoint before."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(result, indent=1) + "\n")
    part.replace(path)


def refit(ns: argparse.Namespace) -> int:
    """``--refit FILE``: the fit of a run already made, with this version's analysis."""
    result = json.loads(ns.refit.read_text())
    samples = {int(pid): [tuple(p) for p in pts] for pid, pts in result["samples"].items()}
    roles = {int(pid): role for pid, role in result["roles"].items()}
    bound = ns.max_slope if ns.max_slope is not None else result["bound_mib_per_day"]
    planned = result.get("planned_s", result["warmup_s"] + result["duration_s"])
    fitted = analyse_run(samples, roles, ns, bound)
    result.update(fitted, warmup_s=ns.warmup, child_warmup_s=ns.child_warmup, late_fraction=ns.late)
    write_json(ns.refit, result)
    t = fitted["total"]["rss"]["late"]
    cut = ""
    if result.get("complete") is False:
        cut = f" (cut short: {result.get('measured_s', 0):g} of {planned:g} s sampled)"
    missing = ", ".join(fitted["missing_roles"])
    print(
        f"soak: refit {ns.refit}{cut}: all processes, late part: {fitted['verdict']} {bound:g} "
        f"MiB a day (RSS {t['slope_mib_per_day']} ± {t['stderr_mib_per_day']}); resolves "
        f"{fitted['resolution_mib_per_day']} MiB a day"
        + (f"; not sampled: {missing}" if missing else "")
    )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=3600.0, help="seconds measured")
    ap.add_argument("--warmup", type=float, default=120.0, help="seconds not fitted")
    ap.add_argument(
        "--child-warmup", type=float, default=60.0,
        help="seconds of a replaced child's own life not fitted",
    )  # fmt: skip
    ap.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    ap.add_argument("--interval", default="1s", help="the agent's --sampling.interval")
    ap.add_argument("--pods", type=int, default=110)
    ap.add_argument("--churn", type=float, default=5.0, help="seconds between pod changes")
    ap.add_argument("--logs", type=int, default=8)
    ap.add_argument("--lines-per-second", type=float, default=2000.0)
    ap.add_argument("--rotate", type=float, default=120.0, help="seconds between log rotations")
    ap.add_argument("--scrape", type=float, default=5.0)
    ap.add_argument("--kill-child", type=float, default=300.0, help="seconds (0: never)")
    ap.add_argument(
        "--max-slope", type=float, default=None,
        help="the bound, MiB a day, all processes (exit 1 when the late slope is above it by "
        "more than two standard errors, or when a leak of twice it would not show)",
    )  # fmt: skip
    ap.add_argument(
        "--late", type=float, default=0.5,
        help="the fraction of the run (after the warm-up) the verdict is fitted over",
    )  # fmt: skip
    ap.add_argument(
        "--require-resolved", action="store_true",
        help="with --max-slope: fail unless the run shows the slope below the bound",
    )  # fmt: skip
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--checkpoint", type=float, default=600.0,
        help="seconds between partial writes of --json (every sample so far, \"complete\": "
        "false): a run cut short (a session's end, a kill) leaves what it sampled for --refit",
    )  # fmt: skip
    ap.add_argument(
        "--probe", type=Path, default=None,
        help="a directory: the agent writes its memory probe there "
        "(bench/memprobe: tracemalloc, objects by type, mallinfo2, smaps; costs memory itself; "
        "the main process only: the children run python -S)",
    )  # fmt: skip
    ap.add_argument("--probe-every", type=float, default=60.0, help="seconds between dumps")
    ap.add_argument(
        "--leak", type=int, default=0,
        help="bytes a second the main process is made to keep (bench/memprobe): the positive "
        "control, a run that must fail the check",
    )  # fmt: skip
    ap.add_argument(
        "--refit", type=Path, default=None,
        help="a JSON this benchmark wrote: fit its samples again (with --warmup, --child-warmup, "
        "--late, --max-slope) and rewrite its verdict, no agent run",
    )  # fmt: skip
    ns = ap.parse_args()
    if ns.refit is not None:
        return refit(ns)

    # a SIGTERM (a CI timeout, a kill) ends the run through the ``finally`` that stops the
    # agent: no agent is left behind
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="fabricscope-soak-"))
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    sizing.build_standin(work)
    env["LD_LIBRARY_PATH"] = f"{work}:{env.get('LD_LIBRARY_PATH', '')}"
    if ns.probe is not None or ns.leak:
        probe = str(Path(__file__).resolve().parent / "memprobe")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (probe, env.get("PYTHONPATH")) if p)
    if ns.probe is not None:
        ns.probe.mkdir(parents=True, exist_ok=True)
        env["FABRICSCOPE_MEMPROBE"] = str(ns.probe.resolve())
        env["FABRICSCOPE_MEMPROBE_EVERY"] = str(ns.probe_every)
    if ns.leak:
        env["FABRICSCOPE_MEMPROBE_LEAK"] = str(ns.leak)
    port = sizing.free_port()
    bound = ns.max_slope if ns.max_slope is not None else 1.0
    samples: dict[int, list[Sample]] = {}  # by pid
    roles: dict[int, str] = {}
    kills = 0
    scrapes = 0
    rotating: RotatingLogs | None = None

    def record(**extra: Any) -> dict[str, Any]:
        """The run as written: its settings, what it counted, ``extra``, every sample."""
        return {
            "machine": f"{platform.node()}: {os.cpu_count()} CPUs, {platform.platform()}",
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "duration_s": ns.duration,
            "warmup_s": ns.warmup,
            "planned_s": ns.warmup + ns.duration,
            "child_warmup_s": ns.child_warmup,
            "late_fraction": ns.late,
            "sampling_interval": ns.interval,
            "pods": ns.pods,
            "pod_churn_s": ns.churn,
            "busy_logs": ns.logs,
            "log_lines_per_second": ns.lines_per_second,
            "log_rotations": rotating.rotations if rotating is not None else 0,
            "scrapes": scrapes,
            "nvml_child_kill_every_s": ns.kill_child,
            "nvml_child_kills": kills,
            "planted_leak_bytes_per_s": ns.leak,
            **extra,
            # every sample: (seconds, RSS, PSS, USS, anonymous bytes) by process id, and
            # each one's role
            "roles": {str(pid): role for pid, role in sorted(roles.items())},
            "samples": {str(pid): pts for pid, pts in sorted(samples.items())},
        }

    with contextlib.ExitStack() as stack:
        url = stack.enter_context(churning_api_server(ns.pods, ns.churn))
        sock = work / "kubelet.sock"
        stack.enter_context(sizing.kubelet(sock, ["GPU-00000000-0000-0000-0000-000000000000"], 8))
        logs = work / "pods"
        rotating = RotatingLogs(logs, ns.logs, ns.lines_per_second, ns.rotate)
        stack.enter_context(rotating)
        agent = sizing.start_agent(
            work,
            env,
            url=url,
            port=port,
            sock=sock,
            logs=logs,
            sysfs=str(sizing.DGX),
            flags=(f"--sampling.interval={ns.interval}",),
        )
        metrics = f"http://127.0.0.1:{port}/metrics"
        try:
            t0 = time.monotonic()
            end = t0 + ns.warmup + ns.duration
            next_scrape = next_sample = t0
            next_kill = t0 + ns.kill_child if ns.kill_child > 0 else float("inf")
            every = ns.checkpoint if ns.json and ns.checkpoint > 0 else float("inf")
            next_checkpoint = t0 + every
            while time.monotonic() < end:
                now = time.monotonic()
                if agent.poll() is not None:
                    raise SystemExit(f"soak: the agent exited ({agent.returncode}); see its log")
                if now >= next_scrape:
                    with contextlib.suppress(OSError):
                        _OPENER.open(metrics, timeout=10).read()
                        scrapes += 1
                    next_scrape += ns.scrape
                if now >= next_kill:
                    for p in sizing.children(agent.pid):
                        if sizing.role(p, logs) == "nvml child":
                            with contextlib.suppress(OSError):
                                os.kill(p, signal.SIGKILL)
                                kills += 1
                    next_kill += ns.kill_child
                if now >= next_sample:
                    t = now - t0
                    for p in [agent.pid, *sizing.children(agent.pid)]:
                        with contextlib.suppress(OSError):
                            if roles.get(p, "child") == "child":  # not known yet
                                roles[p] = "main" if p == agent.pid else sizing.role(p, logs)
                            samples.setdefault(p, []).append((t, *usage(p)))
                    next_sample += ns.every
                if now >= next_checkpoint:
                    # the samples so far, for --refit should the run not reach its end
                    write_json(
                        ns.json,
                        record(complete=False, measured_s=round(now - t0), bound_mib_per_day=bound),
                    )
                    next_checkpoint += every
                soonest = min(next_scrape, next_sample, next_kill, next_checkpoint)
                time.sleep(max(0.05, soonest - time.monotonic()))
            restarts = 0
            body = _OPENER.open(metrics, timeout=10).read().decode()
            for line in body.splitlines():
                if line.startswith('fabricscope_sampler_child_restarts_total{sampler="nvml"}'):
                    restarts = int(float(line.rsplit(" ", 1)[1]))
        finally:
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(20)
            except subprocess.TimeoutExpired:
                agent.kill()

    fitted = analyse_run(samples, roles, ns, bound)
    result = record(complete=True, nvml_child_restarts=restarts, **fitted)
    with contextlib.suppress(OSError):
        for f in sorted(work.rglob("*")):
            if f.is_file():
                f.unlink()
    brief = {k: v for k, v in result.items() if k not in ("samples", "roles", "processes")}
    print(json.dumps(brief))
    print()
    print(
        f"slopes in MiB a day, ± one standard error; late: the last {ns.late:.0%} "
        f"of the {ns.duration:g} s after the warm-up"
    )
    print(
        "| process | RSS first -> last | RSS late | anonymous late | USS late | PSS late "
        "| RSS after warm-up |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")

    def pm(f: dict[str, Any]) -> str:
        return f"{f['slope_mib_per_day']} ± {f['stderr_mib_per_day']}"

    rows = [
        (f"{w} ({p['lifetimes']} lives)" if p["lifetimes"] > 1 else w, p,
         f"{p['rss_mib_first']} -> {p['rss_mib_last']} MiB")
        for w, p in fitted["processes"].items()
    ]  # fmt: skip
    rows.append(("all", fitted["total"], ""))
    for who, p, span in rows:
        print(
            f"| {who} | {span} | {pm(p['rss']['late'])} | {pm(p['anon']['late'])} | "
            f"{pm(p['uss']['late'])} | "
            f"{pm(p['pss']['late'])} | {pm(p['rss']['after_warmup'])} |"
        )
    if ns.json:
        write_json(ns.json, result)
    caught = fitted["leak_of_twice_the_bound_caught"]
    print(
        f"soak: all processes, late part: {fitted['verdict']} {bound:g} MiB a day "
        f"(RSS {pm(fitted['total']['rss']['late'])}; USS {pm(fitted['total']['uss']['late'])}, "
        f"not judged); "
        f"resolves {fitted['resolution_mib_per_day']} MiB a day: a leak of {2 * bound:g} MiB a "
        f"day would {'' if caught else 'NOT '}show; {kills} NVML child kills, {restarts} restarts"
    )
    if ns.max_slope is not None:
        ok = (
            fitted["verdict"] != "above"
            and caught
            and not fitted["missing_roles"]
            and not (ns.kill_child > 0 and kills and not restarts)
        )
        if ns.require_resolved and fitted["verdict"] != "below":
            ok = False
        print(f"soak: {'PASS' if ok else 'FAIL'}")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
