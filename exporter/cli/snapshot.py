"""``fabricscope snapshot``: capture the sysfs files the samplers read, and NVML's answers,
into a tarball that ``agent --snapshot`` and ``topo --snapshot`` replay."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
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
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=parent)
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
        return _take(config, output, partial)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)


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
