"""`fabricscope snapshot` captures exactly what the samplers read; `--snapshot` replays it
to the same exposition the live tree gives."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from agent.snapshot import capture, extract
from tests.agentrun import fabricscope, normalise


def _once(*args: str) -> str:
    # attribution and workload read live process/Kubernetes state and ibpeer asks the
    # fabric: never part of a snapshot
    proc = fabricscope(
        [
            "agent",
            "--once",
            "--no-sampler.netdev",
            "--no-sampler.attribution",
            "--no-sampler.workload",
            "--no-sampler.ibpeer",
            "--log.level=error",
            *args,
        ]
    )
    assert proc.returncode == 0, proc.stderr
    return normalise(proc.stdout)


def test_snapshot_replays_to_the_same_metrics(dgx_sys_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "node.tar.gz"
    proc = fabricscope(
        ["snapshot", "--no-sampler.netdev", f"--path.sysfs={dgx_sys_root}", "-o", str(out)]
    )
    assert proc.returncode == 0, proc.stderr
    assert "sampling infiniband ... ok" in proc.stderr and f"wrote {out}" in proc.stderr
    # a replay runs NVML in-process (nothing to isolate: recorded answers), so the live run
    # does too; otherwise the only difference is the child's restart counter
    live = _once(f"--path.sysfs={dgx_sys_root}", "--no-nvml.isolate")
    replayed = _once(f"--snapshot={out}")
    assert replayed == live
    assert "fabricscope_infiniband_" in live and "fabricscope_pci_" in live


def test_snapshot_keeps_symlinks_and_only_what_was_read(dgx_sys_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "node.tar.gz"
    assert (
        fabricscope(
            ["snapshot", f"--path.sysfs={dgx_sys_root}", "--no-sampler.netdev", "-o", str(out)]
        ).returncode
        == 0
    )
    with tarfile.open(out) as tar:
        members = {m.name: m for m in tar.getmembers()}
        manifest = json.loads(tar.extractfile("MANIFEST.json").read())  # type: ignore[union-attr]
    links = [m for m in members.values() if m.issym()]
    assert any(n.startswith("sys/class/infiniband/") for n in (m.name for m in links))
    assert any(n.startswith("sys/bus/pci/devices/") for n in (m.name for m in links))
    on_disk = sum(len(files) for _, _, files in os.walk(dgx_sys_root))
    regular = [m for m in members.values() if m.isfile() and m.name.startswith("sys/")]
    assert 0 < len(regular) <= on_disk
    assert manifest["files"] == len(regular)


def test_capture_records_unreadable_files_and_true_sizes(tmp_path: Path) -> None:
    """sysfs files claim 4096 bytes whatever they hold; a probed file the host lacks is
    counted as absent (an optional attribute), not fatal and not 'unreadable'."""
    root = tmp_path / "sys"
    (root / "a").mkdir(parents=True)
    (root / "a" / "rate").write_text("100 Gb/sec (4X EDR)\n")
    (root / "class").mkdir()
    os.symlink("../a", root / "class" / "dev")
    out = tmp_path / "s.tar.gz"
    result = capture(str(root), ["class/dev/rate", "a/gone"], str(out))
    assert result.files == 1 and result.symlinks == 1
    assert result.unreadable == () and result.absent == 1
    tmp = extract(str(out))
    try:
        replay = Path(tmp.name) / "sys"
        assert (replay / "class" / "dev").is_symlink()
        assert (replay / "class" / "dev" / "rate").read_text() == "100 Gb/sec (4X EDR)\n"
    finally:
        tmp.cleanup()


def test_replay_refuses_a_file_that_is_not_a_snapshot(tmp_path: Path) -> None:
    bogus = tmp_path / "x.tar.gz"
    bogus.write_bytes(b"not a tarball")
    proc = fabricscope(["agent", "--once", f"--snapshot={bogus}"])
    assert proc.returncode == 2
    assert "cannot read snapshot" in proc.stderr and "Traceback" not in proc.stderr


def test_replay_skips_members_escaping_the_tree(tmp_path: Path) -> None:
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        for name, data in (("MANIFEST.json", b"{}"), ("../escape", b"x")):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            import io

            tar.addfile(ti, io.BytesIO(data))
        link = tarfile.TarInfo("sys/abs")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/passwd"
        tar.addfile(link)
    tmp = extract(str(evil))
    try:
        assert not (Path(tmp.name).parent / "escape").exists()
        assert not (Path(tmp.name) / "sys" / "abs").exists()
        assert (Path(tmp.name) / "MANIFEST.json").exists()
    finally:
        tmp.cleanup()


def _stuck_tree(root: Path) -> Path:
    """A sysfs tree whose InfiniBand port holds a FIFO where a file should be: the sampler's
    read waits on it until --sampling.timeout, so a snapshot of it runs long enough to be
    killed mid-way."""
    port = root / "sys/class/infiniband/mlx5_0/ports/1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    os.mkfifo(port / "rate")
    return root / "sys"


def _partials(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".partial"))


def _killed_snapshot(sysfs: Path, out: Path, sig: int) -> int:
    """Start ``fabricscope snapshot``, send ``sig`` once its temporary file exists; its
    exit status."""
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "exporter.cli", "snapshot", f"--path.sysfs={sysfs}"),
            *("--no-sampler.netdev", "--no-sampler.nvml", "--no-sampler.throughput"),
            *("--sampling.timeout=60s", "-o", str(out)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not _partials(out.parent):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.5)  # well inside the sampler stuck on the FIFO
        proc.send_signal(sig)
        return proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_killed_snapshot_leaves_no_partial_file(tmp_path: Path) -> None:
    sysfs = _stuck_tree(tmp_path / "stuck")
    outdir = tmp_path / "out"
    outdir.mkdir()
    out = outdir / "node.tar.gz"
    # SIGTERM (a job scheduler's, the kubelet's): the run removes its own temporary file
    assert _killed_snapshot(sysfs, out, signal.SIGTERM) == 128 + signal.SIGTERM
    assert _partials(outdir) == [] and not out.exists()
    # SIGKILL leaves it; the next snapshot into that directory removes it
    assert _killed_snapshot(sysfs, out, signal.SIGKILL) == -signal.SIGKILL
    assert len(_partials(outdir)) == 1
    (sysfs / "class/infiniband/mlx5_0/ports/1/rate").unlink()
    (sysfs / "class/infiniband/mlx5_0/ports/1/rate").write_text("400 Gb/sec (4X NDR)\n")
    done = fabricscope(
        [
            "snapshot",
            f"--path.sysfs={sysfs}",
            *("--no-sampler.netdev", "--no-sampler.nvml", "--no-sampler.throughput"),
            *("-o", str(out)),
        ]
    )
    assert done.returncode == 0, done.stderr
    assert "left by a snapshot that was killed" in done.stderr
    assert _partials(outdir) == [] and out.exists()
