"""``fabricscope snapshot``: capture the sysfs files the samplers read, and NVML's answers,
into a tarball that ``agent --snapshot`` and ``topo --snapshot`` replay.

The tarball is written to a temporary file beside the output (``.<name>.<pid>.<random>.partial``)
and renamed when whole, so a reader never sees half of one. A run stopped by SIGTERM, SIGHUP or
SIGINT removes its temporary file; one killed outright (SIGKILL, the machine going down) cannot,
so each run first removes those left beside its output by runs that are no longer alive.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from agent.config import AgentConfig
from agent.core.errors import ConfigError
from agent.core.runner import Runner, SamplerSpec
from agent.core.sysfs import RecordingReader
from agent.nvml.record import ChildRecording
from agent.samplers import build_specs
from agent.snapshot import NVML_RECORDING, capture

#: samplers a snapshot never captures: live Kubernetes state, and process environments
#: (which hold secrets: the workload sampler refuses a recording reader)
NOT_CAPTURED = frozenset({"attribution", "workload"})


#: a temporary file of an older version (no pid in its name) is taken as left behind after this
LEGACY_PARTIAL_AGE_SECONDS = 3600.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def remove_stale_partials(directory: Path, name: str) -> list[str]:
    """Remove the temporary files that runs writing ``name`` into ``directory`` left behind:
    those whose run (the pid in the name) is gone, and pid-less ones of older versions over
    an hour old. Returns the names removed."""
    tagged = re.compile(rf"^\.{re.escape(name)}\.(\d+)\.[^/]+\.partial$")
    legacy = re.compile(rf"^\.{re.escape(name)}\.[a-z0-9_]{{8}}\.partial$")
    removed: list[str] = []
    try:
        entries = os.listdir(directory)
    except OSError:
        return removed
    for entry in entries:
        m = tagged.match(entry)
        path = directory / entry
        if m is not None:
            if _alive(int(m.group(1))):
                continue
        elif legacy.match(entry) is not None:
            try:
                if time.time() - path.stat().st_mtime < LEGACY_PARTIAL_AGE_SECONDS:
                    continue
            except OSError:
                continue
        else:
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(entry)
    return removed


def open_output(output: str) -> str:
    """Check ``output`` before anything is sampled: a file name (not a directory) in a
    directory that exists and takes a new file. Returns a temporary file beside it (created
    with the mode a new file gets), which :func:`take_snapshot` renames to ``output`` once
    written. ConfigError with one line saying what is wrong."""
    path = Path(output)
    if path.is_dir():
        raise ConfigError(f"-o {output} is a directory: name a file, e.g. {path / 'node.tar.gz'}")
    parent = path.parent
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist"
        raise ConfigError(f"cannot write {output}: {parent} {what}")
    for stale in remove_stale_partials(parent, path.name):
        print(f"removed {parent / stale}, left by a snapshot that was killed", file=sys.stderr)
    try:
        fd, tmp = tempfile.mkstemp(
            prefix=f".{path.name}.{os.getpid()}.", suffix=".partial", dir=parent
        )
    except OSError as exc:
        raise ConfigError(f"cannot write {output}: {exc.strerror or exc}") from None
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)
    os.close(fd)
    return tmp


def take_snapshot(config: AgentConfig, output: str) -> int:
    """Run every enabled sampler once (but those :data:`NOT_CAPTURED`) against a recording
    reader and NVML recorder, and write the files they read and the NVML answers to
    ``output`` (checked first: :func:`open_output`); progress on stderr."""
    partial = open_output(output)
    try:
        with _stopped_by_signals():
            return _take(config, output, partial)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP end the run the way Ctrl-C does: by an exception, so the temporary
    file is removed on the way out (exit status 128 + the signal's number)."""

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _take(config: AgentConfig, output: str, partial: str) -> int:
    config = replace(
        config,
        sampling=replace(config.sampling, enabled=config.sampling.enabled - NOT_CAPTURED),
        # a capture is of files: no MAD is sent, no counter cleared
        infiniband=replace(config.infiniband, perfquery="off", reset_saturated=False),
    )
    reader = RecordingReader(config.paths.sysfs)
    enabled = config.sampling.enabled
    others = replace(config, sampling=replace(config.sampling, enabled=enabled - {"nvml"}))
    specs = build_specs(others, reader, watch_xid=False)
    recorder: ChildRecording | None = None
    if "nvml" in enabled:  # recorded in a child process: a crash costs only the recording
        timeout = max(config.sampling.timeout_seconds, 30.0)
        recorder = ChildRecording(timeout)
        specs.append(SamplerSpec(recorder, timeout, timeout))
    runner = Runner(specs)
    for spec in specs:
        name = spec.sampler.name
        print(f"sampling {name} ...", end=" ", file=sys.stderr, flush=True)
        st = runner.run_sampler(name)
        if st.snapshot is not None:
            n = len(st.snapshot.issues)
            print(f"ok ({n} unreadable file{'s' if n != 1 else ''})", file=sys.stderr)
        elif st.success:
            print("no hardware", file=sys.stderr)
        else:
            print("failed (see log)", file=sys.stderr)
    if recorder is not None:
        recorder.close()
    extra: dict[str, bytes] = {}
    # a recording exists when the nvml sampler ran; "no driver" is an answer worth recording
    # too: replay then says "no hardware", exactly as the host did
    if recorder is not None and recorder.calls:
        extra[NVML_RECORDING] = recorder.recording.encode()
    try:
        result = capture(config.paths.sysfs, reader.touched, partial, extra=extra)
        os.replace(partial, output)
    except OSError as exc:  # the disk filled up, the directory went away meanwhile
        raise ConfigError(f"cannot write {output}: {exc.strerror or exc}") from None
    print(
        f"wrote {output}: {result.files} files, {result.symlinks} symlinks, "
        f"{result.directories} directories; {len(result.unreadable)} unreadable"
        + (f"; NVML recording of {recorder.calls} calls" if extra and recorder else ""),
        file=sys.stderr,
    )
    if recorder is not None and not runner.status("nvml").success:
        print(
            "note: no NVML recording: the nvml sampler failed (see the log); a replay of this "
            "snapshot shows no GPU",
            file=sys.stderr,
        )
    print(
        "note: netdev statistics (netlink), pod attribution and workload checks (live "
        "process state) are not part of a snapshot",
        file=sys.stderr,
    )
    return 0
