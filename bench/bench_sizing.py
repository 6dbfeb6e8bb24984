"""What the agent holds and spends as the chart deploys it: memory (RSS and PSS) and CPU of
the main process and of each supervised child, with the pod watch, the NVML child, the
throughput child reading a busy log directory, and scrapes every 30 s. The figures the
chart's requests and limits come from.

What runs (real processes, real sockets; only the cluster is stood in for):

- ``fabricscope agent`` serving ``/metrics``, scraped every 30 s as the ServiceMonitor does;
- the pod watch (``--kubernetes.node-name``: list and watch this node's pods) against an
  API server answering as the real one does (pytest-httpserver, the tests' stand-in), with
  ``--pods`` pods on the node, a watch that stays open;
- the kubelet's pod-resources socket (a real gRPC server) giving the job's pod the node's
  GPUs (pod attribution);
- the throughput child reading ``--logs`` busy container logs (CRI format; each a training
  job's rank printing Composer throughput blocks and NCCL INFO lines and a chatty stream of
  other lines, ``--lines-per-second`` in all);
- the NVML child: on a CPU-only machine the stand-in ``libnvidia-ml.so.1``
  (``tests/nvml_standin``, one GPU) loaded by the real pynvml, so the child's interpreter,
  pynvml and the sampler are what they are on a GPU node; with ``--live-nvml`` the node's
  own NVML (``scripts/gpu_sizing.sh`` on a GPU machine);
- sysfs: the DGX fixture tree (``--sysfs`` for a real one).

Measured every 5 s over ``--duration`` seconds after a warm-up: each process's RSS and PSS
(``/proc/PID/smaps_rollup``) and CPU (user + system from ``/proc/PID/stat``, read at the
window's start and end: the steady state, start-up left out). Start-up is reported apart:
the main process's CPU when ``/metrics`` first answered (``startup``), and each process's CPU
before the window (``cpu_seconds_before_window``: start-up, first passes and warm-up).
PSS shares the pages the processes have in common (the interpreter, the libraries), as the
container's memory cgroup charges them once. Also, with ``--per-gpu``: the Python memory the NVML
sampler keeps per GPU (tracemalloc over three passes of the real sampler, on the recorded
2x H200 answers repeated for 2 and 8 GPUs, or the live NVML's GPUs), for extrapolating the
NVML child to more GPUs than the machine has.

    python bench/bench_sizing.py [--duration 90] [--json FILE] [--live-nvml] [--sysfs /sys]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.core.procstat import parse_stat  # noqa: E402 - after the path is set

DGX = ROOT / "tests" / "fixtures" / "dgx-h100" / "sys"
STANDIN = ROOT / "tests" / "nvml_standin" / "libnvidia-ml.c"
RECORDING = ROOT / "tests" / "fixtures" / "nvml" / "h200x2.recording.json"
NODE = "gpu-node-0"
PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


#: what the agent imports from outside the repository (compiled with it, below)
DEPENDENCIES = (
    "pynvml",
    "prometheus_client",
    "grpc",
    "google.protobuf",
    "pyroute2",
    "re2",
    "yaml",
    "psutil",
)


def compile_bytecode() -> list[str]:
    """Compile the agent's modules and its dependencies' to bytecode before the agent starts,
    as the image's ``pip install`` does (the image ships ``.pyc`` files and never writes
    any): otherwise the first process to import a module compiles it, and the compiler's
    memory stays in that process's resident set (about 17 MiB for pynvml's 330 KB of source).
    Returns what could not be compiled (a read-only directory)."""
    import compileall
    import importlib.util

    missed: list[str] = []
    targets: list[Path] = [ROOT / "agent", ROOT / "exporter"]
    for name in DEPENDENCIES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None or spec.origin is None:
            continue
        origin = Path(spec.origin)
        targets.append(origin.parent if origin.name == "__init__.py" else origin)
    for target in targets:
        if target.is_dir():
            ok = compileall.compile_dir(target, quiet=1, workers=0)
        else:
            ok = compileall.compile_file(target, quiet=1)
        if not ok:
            missed.append(str(target))
    return missed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the stand-ins for the cluster ---------------------------------------------------------


def pod(i: int, gpu: bool) -> dict[str, Any]:
    name = f"llm-{i}" if gpu else f"side-{i}"
    return {
        "metadata": {
            "name": name,
            "namespace": "training" if gpu else "kube-system",
            "uid": f"00000000-0000-4000-8000-{i:012d}",
            "resourceVersion": str(1000 + i),
            "creationTimestamp": "2026-11-20T10:00:00Z",
            "labels": {"app": name.rsplit("-", 1)[0], "job-name": "llm"},
            "ownerReferences": [{"kind": "Job", "name": "llm", "uid": "j", "apiVersion": "v1"}]
            if gpu
            else [],
        },
        "spec": {"nodeName": NODE, "containers": [{"name": "trainer", "image": "x"}]},
        "status": {
            "phase": "Running",
            "hostIP": "10.0.0.11",
            "containerStatuses": [
                {
                    "name": "trainer",
                    "containerID": f"containerd://{i:064x}",
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": "2026-11-20T10:00:05Z"}},
                }
            ],
        },
    }


@contextlib.contextmanager
def api_server(pods: int, gpu_pods: int) -> Iterator[str]:
    """The API server's pod list and a watch that stays open (a bookmark every 20 s), as
    a real API server holds one for the watch's timeout."""
    from pytest_httpserver import HTTPServer
    from werkzeug.wrappers import Request, Response

    items = [pod(i, i < gpu_pods) for i in range(pods)]

    def handle(request: Request) -> Response:
        if request.args.get("watch") == "true":
            timeout = min(float(request.args.get("timeoutSeconds", "300")), 300.0)

            def events() -> Iterator[str]:
                end = time.monotonic() + timeout
                while time.monotonic() < end:
                    time.sleep(20)
                    yield (
                        json.dumps(
                            {
                                "type": "BOOKMARK",
                                "object": {
                                    "kind": "Pod",
                                    "apiVersion": "v1",
                                    "metadata": {"resourceVersion": "5000"},
                                },
                            }
                        )
                        + "\n"
                    )

            return Response(events(), mimetype="application/json")
        body = {"kind": "PodList", "apiVersion": "v1",
                "metadata": {"resourceVersion": "5000"}, "items": items}  # fmt: skip
        return Response(json.dumps(body), mimetype="application/json")

    server = HTTPServer(threaded=True)
    server.expect_request("/api/v1/pods").respond_with_handler(handle)
    server.start()
    try:
        yield server.url_for("/").rstrip("/")
    finally:
        server.clear()
        server.stop()


@contextlib.contextmanager
def kubelet(sock: Path, gpu_uuids: list[str], gpu_pods: int) -> Iterator[None]:
    import grpc

    from agent.kubernetes import podresources_pb2 as pb
    from agent.kubernetes import podresources_pb2_grpc as pb_grpc

    class Lister(pb_grpc.PodResourcesListerServicer):
        def List(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC's name
            per = max(1, len(gpu_uuids) // max(gpu_pods, 1))
            return pb.ListPodResourcesResponse(
                pod_resources=[
                    pb.PodResources(
                        name=f"llm-{i}",
                        namespace="training",
                        containers=[
                            pb.ContainerResources(
                                name="trainer",
                                devices=[
                                    pb.ContainerDevices(
                                        resource_name="nvidia.com/gpu",
                                        device_ids=gpu_uuids[i * per : (i + 1) * per],
                                    )
                                ],
                            )
                        ],
                    )
                    for i in range(gpu_pods)
                ]
            )

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_PodResourcesListerServicer_to_server(Lister(), server)
    server.add_insecure_port("unix://" + str(sock))
    server.start()
    try:
        yield
    finally:
        server.stop(grace=None)


def busy_lines(stamp: str, batch: int, i: int, n: int) -> str:
    """One tick of rank ``i``'s log (CRI, newline-terminated): ``n - 1`` progress lines, and
    every 50th batch a Composer throughput block and an NCCL INFO line."""
    lines = [
        f"{stamp} stdout F step {batch} loss 2.{batch % 97:02d} lr 3e-4 "
        f"grad_norm 0.{i}1 data_time 0.002 [{'=' * (batch % 40)}>]"
        for _ in range(n - 1)
    ]
    if batch % 50 == 0:
        lines += [
            f"{stamp} stdout F [batch={batch}/100000]:",
            f"{stamp} stdout F \t Train time/batch: {batch}",
            f"{stamp} stdout F \t Train throughput/tokens_per_sec: 55803.1245",
            f"{stamp} stdout F node-0:{1000 + i}:{1000 + i} [{i}] NCCL INFO "
            f"Channel 00/0 : {i} -> {i + 1} via NET/IB/0/GDRDMA",
        ]
    return "".join(line + "\n" for line in lines)


class BusyLogs:
    """``n`` container logs written as the container runtime writes them (CRI): each rank's
    Composer throughput block every few seconds, NCCL INFO lines, and filler lines (a
    training job's progress bars and warnings) up to ``rate`` lines per second in all."""

    def __init__(self, root: Path, n: int, rate: float) -> None:
        self.files = []
        for i in range(n):
            d = root / f"training_llm-{i}_00000000-0000-4000-8000-{i:012d}" / "trainer"
            d.mkdir(parents=True)
            self.files.append(d / "0.log")
        self.rate = rate
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        batch = 0
        per_tick = max(1, int(self.rate / 10 / len(self.files)))
        handles = [f.open("a") for f in self.files]
        while not self.stop.wait(0.1):
            batch += 1
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime())
            for i, h in enumerate(handles):
                h.write(busy_lines(stamp, batch, i, per_tick))
                h.flush()
        for h in handles:
            h.close()

    def __enter__(self) -> BusyLogs:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(5)


def start_agent(
    work: Path,
    env: dict[str, str],
    *,
    url: str,
    port: int,
    sock: Path,
    logs: Path,
    sysfs: str,
    flags: tuple[str, ...] = (),
) -> subprocess.Popen[bytes]:
    """``fabricscope agent`` as the chart runs it, against the stand-ins: the API server at
    ``url`` (a kubeconfig written in ``work``), the kubelet's socket ``sock``, the pod logs
    under ``logs``; ``flags`` added. Its log goes to ``work/agent.log``."""
    kubeconfig = work / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": url}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
            }
        )
    )
    return subprocess.Popen(
        [
            sys.executable, "-m", "exporter.cli", "agent",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--path.sysfs={sysfs}",
            f"--kubelet.pod-resources-socket={sock}",
            f"--kubernetes.node-name={NODE}",
            f"--path.pod-logs={logs}",
            "--throughput.pods=all",
            "--log.level=warning",
            *flags,
        ],
        cwd=ROOT, env={**env, "KUBECONFIG": str(kubeconfig)}, stdout=subprocess.DEVNULL,
        stderr=(work / "agent.log").open("wb"),
    )  # fmt: skip


# --- measuring -----------------------------------------------------------------------------


def vmdata(pid: int) -> int:
    """``VmData`` of ``pid`` in bytes (what ``RLIMIT_DATA`` counts)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmData:"):
            return int(line.split()[1]) * 1024
    return 0


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            kids = (task / "children").read_text().split()
        except OSError:
            continue
        for k in kids:
            out += [int(k), *children(int(k))]
    return out


def role(pid: int, logs: Path) -> str:
    """Which supervised child ``pid`` is (every child runs ``python -S -m
    agent.core.childproc``): the one that mapped NVML's library, or the one holding the pod
    logs open."""
    try:
        if "libnvidia-ml" in Path(f"/proc/{pid}/maps").read_text():
            return "nvml child"
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd).startswith(str(logs)):
                    return "throughput child"
    except OSError:
        return "gone"
    return "child"


def memory(pid: int) -> tuple[int, int]:
    """(RSS, PSS) bytes."""
    rss = pss = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key == "Rss":
            rss = int(rest.split()[0]) * 1024
        elif key == "Pss":
            pss = int(rest.split()[0]) * 1024
    return rss, pss


def cpu_seconds(pid: int) -> float:
    return parse_stat(Path(f"/proc/{pid}/stat").read_text())[0] / TICK


def sampler_cpu(body: str) -> dict[str, float]:
    """``fabricscope_sampler_cpu_seconds_total`` by sampler, from a /metrics body."""
    return {
        name: float(value)
        for name, value in re.findall(
            r'^fabricscope_sampler_cpu_seconds_total\{sampler="([^"]*)"\} (\S+)$', body, re.M
        )
    }


def thread_cpu(pid: int) -> dict[tuple[str, str], float]:
    """CPU seconds (user + system) of each of ``pid``'s threads, keyed by (thread id, the
    thread's name as the kernel has it: ``python`` for Python's own threads, which do not
    name themselves there, a library's name for its native threads, e.g. gRPC's
    ``event_engine``)."""
    out: dict[tuple[str, str], float] = {}
    tasks = Path(f"/proc/{pid}/task")
    for task in tasks.iterdir():
        try:
            name = (task / "comm").read_text().strip()
            ticks = parse_stat((task / "stat").read_text())[0]
        except OSError:  # a thread that ended between the listing and the read
            continue
        out[(task.name, name)] = ticks / TICK
    return out


#: what a process spent in threads that ended between two readings (the kernel adds an ended
#: thread's CPU to its process's and keeps no record of it by name)
ENDED_THREADS = "(ended threads)"


def by_thread_name(
    before: dict[tuple[str, str], float],
    after: dict[tuple[str, str], float],
    seconds: float,
    process_millicores: float | None = None,
) -> dict[str, float]:
    """Millicores per thread name between two :func:`thread_cpu` readings (one started
    between them counts all it spent). A thread that ended between them is in no name: given
    the process's own figure, what the named threads do not account for is
    :data:`ENDED_THREADS` (a runner's pass in a thread of its own, say)."""
    spent: dict[str, float] = {}
    for key, cpu in after.items():
        spent[key[1]] = spent.get(key[1], 0.0) + cpu - before.get(key, 0.0)
    out = {name: round(1000 * cpu / seconds, 2) for name, cpu in sorted(spent.items()) if cpu}
    if process_millicores is not None:
        rest = process_millicores - 1000 * sum(spent.values()) / seconds
        if rest > 0.005:
            out[ENDED_THREADS] = round(rest, 2)
    return out


def nvml_per_gpu(live: bool) -> dict[str, float]:
    """Python memory the NVML sampler keeps per GPU: tracemalloc after three passes of
    the real sampler over ``n`` GPUs, two values of ``n``; the slope."""
    import tracemalloc

    from agent.nvml.record import ReplayNvml, load
    from agent.nvml.sampler import NvmlSampler

    def recording(n: int) -> dict[str, Any]:
        rec = load(RECORDING)
        calls = dict(rec["calls"])  # type: ignore[arg-type]
        for key, entry in list(calls.items()):
            m = re.match(r"(\w+)\(0((?:,\d+)*)\)$", key)
            if m:
                for g in range(2, n):
                    e = json.loads(json.dumps(entry))
                    if m.group(1) == "nvmlDeviceGetUUID":
                        e["value"] = e["value"][:-2] + f"{g:02d}"
                    calls[f"{m.group(1)}({g}{m.group(2)})"] = e
        calls["nvmlDeviceGetCount()"] = {"value": n}
        return {**rec, "calls": calls, "events": []}

    def held(make: Any, passes: int = 3) -> float:
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        sampler = NvmlSampler(make, watch_xid=False)
        snaps = [sampler.sample() for _ in range(passes)]
        size = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        del snaps, sampler
        return float(size)

    if live:
        from agent.nvml.api import LiveNvml

        api = LiveNvml()
        api.init()
        n = api.device_count()
        api.shutdown()
        total = held(LiveNvml)
        return {"gpus": float(n), "bytes": total, "per_gpu_bytes": total / max(n, 1)}
    counts = (2, 8)
    sizes = [held(lambda n=n: ReplayNvml(recording(n))) for n in counts]
    slope = (sizes[1] - sizes[0]) / (counts[1] - counts[0])
    return {"gpus_2_bytes": sizes[0], "gpus_8_bytes": sizes[1], "per_gpu_bytes": slope}


#: attempts of the per-GPU measurement (:func:`nvml_per_gpu_apart`) before it is given up
PER_GPU_ATTEMPTS = 3


def nvml_per_gpu_apart(
    live: bool, attempts: int = PER_GPU_ATTEMPTS, argv: Sequence[str] | None = None
) -> dict[str, Any]:
    """:func:`nvml_per_gpu` in a process of its own: NVIDIA's library has crashed the process
    that loaded it (a corrupted heap inside nvmlDeviceGetFieldValues, on a 2x H200 with
    NVLinks: docs/performance.md), which must not take this run's other figures with it. A
    process that crashes is started again, up to ``attempts`` in all; each crash is kept in
    ``crashes`` (how it ended and what it printed, Python's fault handler on:
    :func:`crash_line`) and printed, never hidden. When every attempt crashes, ``gpus`` is 0
    and ``error`` says why, which ``scripts/gpu_sizing.sh`` fails on. ``argv``: the command
    instead of this script's own (tests)."""
    mode = "live" if live else "replay"
    cmd = list(
        argv or [sys.executable, "-X", "faulthandler", __file__, "--nvml-per-gpu-only", mode]
    )
    crashes: list[str] = []
    for _ in range(max(1, attempts)):
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        except subprocess.TimeoutExpired:
            crashes.append("took over 600 s")
            continue
        lines = done.stdout.strip().splitlines()
        if done.returncode == 0 and lines:
            got = cast(dict[str, Any], json.loads(lines[-1]))
            if crashes:
                got["crashes"] = crashes
            return got
        how = f"signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
        last = crash_line(done.stderr)
        crashes.append(f"ended by {how}" + (f": {last}" if last else ""))
        print(f"bench_sizing: the per-GPU measurement {crashes[-1]}", file=sys.stderr)
    error = f"the per-GPU measurement failed {len(crashes)} times, last {crashes[-1]}"
    print(f"bench_sizing: {error}", file=sys.stderr)
    return {"gpus": 0.0, "bytes": 0.0, "per_gpu_bytes": 0.0, "error": error, "crashes": crashes}


def crash_line(text: str, limit: int = 300) -> str:
    """What a crashed process printed, in one line: the message before Python's fault
    handler report (glibc's ``free(): invalid pointer``, NVML's own), the report's first line
    and its innermost frame (the call it died in); else its last line. Printable characters
    only, at most ``limit``."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    fatal = next((i for i, ln in enumerate(lines) if ln.startswith("Fatal Python error")), None)
    if fatal is None:
        picked = lines[-1:]
    else:
        frame = next((ln for ln in lines[fatal:] if ln.startswith("File ")), "")
        picked = [*lines[max(0, fatal - 1) : fatal + 1], frame]
    out = " | ".join(p for p in picked if p)
    return "".join(c if c.isprintable() else "?" for c in out)[:limit]


def build_standin(libdir: Path) -> None:
    gcc = shutil.which("gcc")
    if not gcc:
        raise SystemExit("bench_sizing: gcc is needed for the stand-in NVML (apt-get install gcc)")
    subprocess.run(
        [gcc, "-shared", "-fPIC", "-o", str(libdir / "libnvidia-ml.so.1"), str(STANDIN)],
        check=True,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=90.0)
    ap.add_argument("--warmup", type=float, default=30.0)
    ap.add_argument("--pods", type=int, default=110, help="pods on the node (kubelet default max)")
    ap.add_argument("--logs", type=int, default=8, help="busy container logs (one per GPU)")
    ap.add_argument("--lines-per-second", type=float, default=2000.0)
    ap.add_argument("--live-nvml", action="store_true", help="the node's own NVML (GPU node)")
    ap.add_argument("--sysfs", default=str(DGX))
    ap.add_argument("--per-gpu", action="store_true", help="also the NVML sampler's memory per GPU")
    ap.add_argument("--extrapolate-to", type=int, default=8, help="GPUs (with --per-gpu)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--nvml-per-gpu-only", choices=("live", "replay"), help=argparse.SUPPRESS)
    ap.add_argument(
        "--memory-limit",
        type=int,
        default=None,
        help="bytes: the pod's memory limit, given to the agent as the chart does "
        "(--agent.memory-limit: each child's memory ceiling is its share of it)",
    )
    ns = ap.parse_args()
    if ns.nvml_per_gpu_only:  # the measurement apart (nvml_per_gpu_apart)
        print(json.dumps(nvml_per_gpu(ns.nvml_per_gpu_only == "live")))
        return 0

    missed = compile_bytecode()
    work = Path(tempfile.mkdtemp(prefix="fabricscope-sizing-"))
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    gpu_uuids = [f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(8)]
    if not ns.live_nvml:
        build_standin(work)
        env["LD_LIBRARY_PATH"] = f"{work}:{env.get('LD_LIBRARY_PATH', '')}"
        gpu_uuids = gpu_uuids[:1]
    result: dict[str, Any] = {
        "machine": f"{platform.node()}: {os.cpu_count()} CPUs, {platform.platform()}",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "nvml": "live" if ns.live_nvml else "stand-in libnvidia-ml.so.1 (one GPU)",
        "pods": ns.pods,
        "busy_logs": ns.logs,
        "log_lines_per_second": ns.lines_per_second,
        "duration_s": ns.duration,
        "bytecode": "compiled before the agent starts, as the image ships it"
        + (f" (not: {', '.join(missed)})" if missed else ""),
    }
    port = free_port()
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(api_server(ns.pods, ns.logs))
        sock = work / "kubelet.sock"
        stack.enter_context(kubelet(sock, gpu_uuids, ns.logs))
        logs = work / "pods"
        stack.enter_context(BusyLogs(logs, ns.logs, ns.lines_per_second))
        limit = (f"--agent.memory-limit={ns.memory_limit}",) if ns.memory_limit else ()
        agent = start_agent(
            work, env, url=url, port=port, sock=sock, logs=logs, sysfs=ns.sysfs, flags=limit
        )
        result["memory_limit"] = ns.memory_limit
        try:
            metrics = f"http://127.0.0.1:{port}/metrics"
            started = time.monotonic()
            deadline = started + ns.warmup
            scraped = 0
            first_answer: dict[str, float] | None = None
            while time.monotonic() < deadline:
                time.sleep(1)
                with contextlib.suppress(OSError):
                    _OPENER.open(metrics, timeout=10).read()
                    if first_answer is None:  # start-up: imports, first passes, ready to serve
                        first_answer = {
                            "after_s": round(time.monotonic() - started, 1),
                            "main_cpu_s": round(cpu_seconds(agent.pid), 3),
                        }
            result["startup"] = first_answer
            body = _OPENER.open(metrics, timeout=10).read().decode()
            result["series"] = sum(1 for line in body.splitlines() if line[:1] not in ("#", ""))
            result["throughput_series"] = len(
                re.findall(r"^fabricscope_throughput_tokens", body, re.M)
            )
            pids = [agent.pid, *children(agent.pid)]
            cpu0 = {p: cpu_seconds(p) for p in pids}
            threads0 = {p: thread_cpu(p) for p in pids}
            samplers0, window0 = sampler_cpu(body), time.monotonic()
            # the window measures the steady state only: what each process spent before it
            # (start-up, its first passes and the warm-up) is its own figure
            result["cpu_seconds_before_window"] = {
                ("main" if p == agent.pid else role(p, logs)): round(c, 3) for p, c in cpu0.items()
            }
            peak: dict[int, list[int]] = {p: [0, 0] for p in pids}
            t0 = time.monotonic()
            next_scrape = t0
            while time.monotonic() - t0 < ns.duration:
                if time.monotonic() >= next_scrape:
                    _OPENER.open(metrics, timeout=10).read()
                    scraped += 1
                    next_scrape += 30
                for p in pids:
                    with contextlib.suppress(OSError):
                        rss, pss = memory(p)
                        peak[p] = [max(peak[p][0], rss), max(peak[p][1], pss)]
                time.sleep(5)
            elapsed = time.monotonic() - t0
            procs = []
            for p in pids:
                with contextlib.suppress(OSError):
                    threads, cpu = thread_cpu(p), 1000 * (cpu_seconds(p) - cpu0[p]) / elapsed
                    procs.append({
                        "role": "main" if p == agent.pid else role(p, logs),
                        "pid": p,
                        "rss_mib": round(peak[p][0] / 2**20, 1),
                        "pss_mib": round(peak[p][1] / 2**20, 1),
                        "cpu_millicores": round(cpu, 1),
                        "cpu_millicores_by_thread": by_thread_name(
                            threads0[p], threads, elapsed, cpu
                        ),
                        # what RLIMIT_DATA counts against a child's memory ceiling
                        "vmdata_mib": round(vmdata(p) / 2**20, 1),
                    })  # fmt: skip
            result["processes"] = procs
            result["total"] = {
                "rss_mib": round(sum(p["rss_mib"] for p in procs), 1),
                "pss_mib": round(sum(p["pss_mib"] for p in procs), 1),
                "cpu_millicores": round(sum(p["cpu_millicores"] for p in procs), 1),
            }
            result["scrapes"] = scraped
            # children ended at their memory ceiling over the whole run (none, on a healthy node)
            body = _OPENER.open(metrics, timeout=10).read().decode()
            # the main process's CPU by sampler (the agent's own counter), over the window
            span = time.monotonic() - window0
            result["main_cpu_millicores_by_sampler"] = {
                name: round(1000 * (cpu - samplers0.get(name, 0.0)) / span, 2)
                for name, cpu in sorted(sampler_cpu(body).items())
            }
            result["memory_ceiling_errors"] = sum(
                float(m)
                for m in re.findall(
                    r'^fabricscope_sampler_errors_total\{[^}]*reason="memory_ceiling"[^}]*\} (\S+)',
                    body,
                    re.M,
                )
            )
        finally:
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(20)
            except subprocess.TimeoutExpired:
                agent.kill()
    failed = False
    if ns.per_gpu:
        per = nvml_per_gpu_apart(ns.live_nvml)
        failed = "error" in per
        result["nvml_sampler_memory"] = per
        # to 8 GPUs: each more GPU adds what the sampler keeps for one, in the NVML child and
        # again in the main process (the snapshot it receives and renders)
        gpus = int(per.get("gpus", 0)) if ns.live_nvml else 1
        extra = max(ns.extrapolate_to - gpus, 0) * float(per["per_gpu_bytes"]) * 2 / 2**20
        result["extrapolated"] = {
            "from_gpus": gpus,
            "to_gpus": ns.extrapolate_to,
            "added_mib": round(extra, 1),
            "rss_mib": round(result["total"]["rss_mib"] + extra, 1),
            "pss_mib": round(result["total"]["pss_mib"] + extra, 1),
        }
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=2))
    print()
    print("| process | RSS peak | PSS peak | CPU (average) |")
    print("| --- | --- | --- | --- |")
    for p in result["processes"]:
        print(f"| {p['role']} | {p['rss_mib']} MiB | {p['pss_mib']} MiB | {p['cpu_millicores']}m |")
    t = result["total"]
    print(f"| all | {t['rss_mib']} MiB | {t['pss_mib']} MiB | {t['cpu_millicores']}m |")
    if ns.json:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(result, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
