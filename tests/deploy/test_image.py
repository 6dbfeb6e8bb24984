"""The container image, built from the Dockerfile by scripts/image.sh (buildah, a Debian 12
base bootstrapped from Debian's packages), run as a user would run it.

scripts/test.sh builds the image before pytest and names it in ``FABRICSCOPE_IMAGE``; CI
fails there, loudly, if the build fails. Run alone::

    FABRICSCOPE_IMAGE=$(bash scripts/image.sh | tail -1) \\
        .venv/bin/python -m pytest tests/deploy/test_image.py

Every command runs in one working container made from the image (``buildah from``) with
``buildah run --isolation chroot``: it shares the host's network namespace, so the agent's
``/metrics`` is scraped on 127.0.0.1 by a real Prometheus. (podman cannot run containers on
the CI machine: crun is refused ``setrlimit`` there.) ``buildah run`` applies the image's
user, environment and working directory but not its entrypoint, so the commands name
``fabricscope`` themselves; the entrypoint is checked in the image's config.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agentrun import normalise
from tests.promharness import free_port, start_prometheus, wait_until

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GOLDEN = Path(__file__).resolve().parents[1] / "golden"
CACHE = Path(os.environ.get("FABRICSCOPE_IMAGE_CACHE", "/var/cache/fabricscope-ci"))
BUILDAH = [
    "buildah",
    "--root",
    str(CACHE / "containers"),
    "--runroot",
    os.environ.get("FABRICSCOPE_IMAGE_RUNROOT", "/run/fabricscope-ci"),
    "--storage-driver",
    "vfs",
]
#: what the image may weigh (uncompressed, all layers). Measured 327 MB on 2026-11-25: the
#: Debian base 78 MB, Debian's python3 and ibpeer's two tools 54 MB, the venv 198 MB
#: (kubernetes' generated client is 126 MiB of it). Debian's infiniband-diags package with its
#: perl made it 393 MB. A regression past this bound is a dependency to look at.
MAX_SIZE_BYTES = 360_000_000
#: the agent's flags for the fixture tree (as tests/test_golden.py runs it)
AGENT_FLAGS = [
    "--no-sampler.netdev",
    "--path.sysfs=/host/sys",
    "--path.procfs=/host/proc",
    "--kubelet.pod-resources-socket=",
    "--kubernetes.node-name=",
    "--path.pod-logs=/tmp/no-pod-logs",
    "--log.level=error",
]

pytestmark = pytest.mark.skipif(
    not os.environ.get("FABRICSCOPE_IMAGE"),
    reason="no FABRICSCOPE_IMAGE: scripts/test.sh builds the image and sets it (CI always does)",
)


def buildah(*args: str, timeout: float = 300) -> str:
    result = subprocess.run(
        [*BUILDAH, *args], capture_output=True, text=True, check=False, timeout=timeout
    )
    assert result.returncode == 0, f"buildah {' '.join(args)}: {result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def image() -> str:
    return os.environ["FABRICSCOPE_IMAGE"]


@pytest.fixture(scope="module")
def empty_procfs() -> Iterator[Path]:
    """An empty directory every uid may list, for --path.procfs (the host's /proc would
    let the workload sampler see this machine's processes)."""
    path = Path(tempfile.mkdtemp(prefix="fabricscope-proc-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@pytest.fixture(scope="module")
def container(image: str) -> Iterator[str]:
    name = f"fabricscope-test-{os.getpid()}"
    buildah("from", "--pull-never", "--name", name, image)
    try:
        yield name
    finally:
        buildah("rm", name)


def mounts(empty_procfs: Path) -> list[str]:
    return [
        "-v",
        f"{FIXTURES / 'dgx-h100' / 'sys'}:/host/sys:ro",
        "-v",
        f"{empty_procfs}:/host/proc:ro",
    ]


def run(
    container: str, *cmd: str, volumes: list[str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*BUILDAH, "run", "--isolation", "chroot", *(volumes or []), container, "--", *cmd],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


def oci(image: str) -> dict[str, Any]:
    """The image's OCI configuration (config, rootfs)."""
    data: dict[str, Any] = json.loads(buildah("inspect", "--type", "image", image))["OCIv1"]
    return data


def test_version(container: str) -> None:
    result = run(container, "fabricscope", "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "fabricscope 0.1.0"


def test_config_user_entrypoint_and_environment(image: str, container: str) -> None:
    config = oci(image)["config"]
    assert config["User"] == "65534:65534"
    assert config["Entrypoint"] == ["fabricscope"]
    assert config["Cmd"] == ["agent"]
    assert "NVIDIA_DRIVER_CAPABILITIES=utility" in config["Env"]
    assert list(config["ExposedPorts"]) == ["10118/tcp"]
    # and the process really runs as nobody, not root
    result = run(container, "id", "-u")
    assert result.stdout.strip() == "65534", result.stderr


def test_no_compiler_no_pip_no_package_installer(container: str) -> None:
    """The runtime stage holds Debian's python3 and the venv: nothing that builds or installs
    code (the builder's pip, setuptools, venv module and build tools stayed behind)."""
    for tool in ("gcc", "cc", "c++", "make", "pip", "pip3", "python3-config"):
        found = run(container, "sh", "-c", f"command -v {tool}")
        assert found.returncode != 0 and not found.stdout.strip(), (tool, found.stdout)
    # control: the same check finds what is there, the ibpeer sampler's tools included
    for tool, path in (
        ("fabricscope", "/opt/fabricscope/bin/fabricscope"),
        ("smpquery", "/usr/sbin/smpquery"),
        ("perfquery", "/usr/sbin/perfquery"),
    ):
        assert run(container, "sh", "-c", f"command -v {tool}").stdout.strip() == path, tool
    # the two tools run: their libraries are there, though the perl package (which Debian's
    # infiniband-diags package pulls in for its scripts, ~68 MB) is not; perl-base, essential
    # in every Debian, is
    for tool in ("smpquery", "perfquery"):
        result = run(container, tool, "-V")
        assert result.returncode == 0 and "BUILD VERSION: 44.0" in result.stderr, result
    assert run(container, "dpkg", "-s", "python3").returncode == 0  # control
    assert run(container, "dpkg", "-s", "perl").returncode != 0
    for module in ("pip", "ensurepip", "setuptools"):
        result = run(container, "python3", "-c", f"import {module}")
        assert result.returncode != 0, module
        assert "No module named" in result.stderr, result.stderr
    python = run(container, "python3", "-c", "import sys; print(sys.version_info[:2])")
    assert python.stdout.strip() == "(3, 11)", "Debian 12's interpreter, as CI tests"


def test_agent_once_on_a_read_only_fixture_tree_matches_the_golden_file(
    container: str, empty_procfs: Path
) -> None:
    """The image, on the DGX fixture tree mounted read-only, prints exactly what CI's
    virtualenv prints (tests/golden/dgx-h100.prom, which tests/test_golden.py checks)."""
    result = run(
        container, "fabricscope", "agent", "--once", *AGENT_FLAGS, volumes=mounts(empty_procfs)
    )
    assert result.returncode == 0, result.stderr
    assert normalise(result.stdout) == (GOLDEN / "dgx-h100.prom").read_text()
    # and the golden file is not a near-empty one: every source of the tree is in it
    for series in ("fabricscope_infiniband_port_up{", "fabricscope_pci_link_width{"):
        assert series in result.stdout, series


def rootfs_listing(container: str) -> dict[str, tuple[int, int]]:
    """path -> (size, mtime_ns) of every file in the container's root, outside /tmp."""
    root = Path(buildah("mount", container).strip())
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel.split(os.sep)[0] in ("tmp", "proc", "sys", "dev", "run", "host"):
            dirnames.clear()
            continue
        for name in filenames:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.join(rel, name)] = (st.st_size, st.st_mtime_ns)
    return out


def test_metrics_served_and_scraped_by_prometheus(
    container: str, empty_procfs: Path, tmp_path: Path
) -> None:
    """The image's agent serves /metrics on the host network; a real Prometheus scrapes it.
    It writes nothing to its root filesystem (the DaemonSet mounts it read-only)."""
    before = rootfs_listing(container)
    port = free_port()
    cmd = [
        *BUILDAH,
        "run",
        "--isolation",
        "chroot",
        *mounts(empty_procfs),
        container,
        "--",
        "fabricscope",
        "agent",
        *AGENT_FLAGS,
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    log = (tmp_path / "agent.log").open("wb")
    agent = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"

        def healthy() -> bool | None:
            assert agent.poll() is None, (tmp_path / "agent.log").read_text()
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=2) as r:
                    return True if r.status == 200 else None
            except OSError:
                return None

        wait_until(healthy, timeout=60, what="the agent in the image to serve /healthz")
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
            body = r.read().decode()
        assert 'fabricscope_sampler_success{sampler="infiniband"} 1' in body
        with start_prometheus(
            tmp_path / "prom",
            [{"job_name": "fabricscope", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}],
        ) as prom:
            (target,) = prom.wait_for_targets(job="fabricscope")
            assert target.health == "up" and not target.last_error
            samples = prom.wait_for_query('fabricscope_sampler_success{sampler="infiniband"}')
            assert [s.value for s in samples] == [1.0]
            ports = prom.wait_for_query("count(fabricscope_infiniband_port_up)")
            assert ports[0].value > 0
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGTERM)
        try:
            agent.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
        log.close()
    assert rootfs_listing(container) == before


def test_size_and_layers(image: str) -> None:
    """Recorded in docs/install.md (The image): size, layers. dcgm-exporter's image is ~1.45 GB
    (its PR #228); this one must stay far below."""
    (listed,) = json.loads(buildah("images", "--json", image))
    number, unit = listed["size"].split()  # "325 MB": decimal units
    size = int(float(number) * {"kB": 1e3, "MB": 1e6, "GB": 1e9}[unit])
    layers = len(oci(image)["rootfs"]["diff_ids"])
    print(f"image {image}: {size / 1e6:.0f} MB, {layers} layers")
    assert size <= MAX_SIZE_BYTES, f"{size / 1e6:.0f} MB"
    assert layers == 3  # Debian base, Debian's python3, the venv
