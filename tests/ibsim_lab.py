"""A real simulated InfiniBand fabric for tests: ``ibsim`` (ibsim-utils) serving a net file
the test writes, OpenSM assigning LIDs, and the real infiniband-diags tools attached through
``libumad2sim`` (``ibsim-run``). Faults are planted through ibsim's console (its stdin).

Each lab gets its own control-socket name (``IBSIM_SOCKNAME``, read by both ibsim and
libumad2sim), so it never meets another ibsim on the machine; :meth:`IbsimLab.close` stops
the simulator (resuming it first if a test stopped it) and removes nothing it did not make.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

#: the diags and simulator binaries a lab needs (Debian: ibsim-utils infiniband-diags opensm)
TOOLS = ("ibsim", "ibsim-run", "opensm", "smpquery", "perfquery", "ibportstate")


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None and not Path("/usr/sbin", t).exists()]


class IbsimLab:
    """``ibsim -s NETFILE`` with its console on a pipe, plus OpenSM run once (``-o``)."""

    def __init__(self, workdir: Path, net: str) -> None:
        self.workdir = workdir
        self.net_file = workdir / "net"
        self.net_file.write_text(net)
        self.console_log = workdir / "ibsim.out"
        self.sockname = f"fabricscope-test-{os.getpid()}-{time.monotonic_ns()}"
        self.env = {**os.environ, "IBSIM_SOCKNAME": self.sockname}
        self.env.pop("SIM_HOST", None)
        self._start()

    def _start(self) -> None:
        mark = len(self.console_text()) if self.console_log.exists() else 0
        self._out = self.console_log.open("ab")
        self.proc = subprocess.Popen(
            ["ibsim", "-s", str(self.net_file)],
            stdin=subprocess.PIPE,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.workdir,
            start_new_session=True,
        )
        try:
            self.wait_for("Network simulator ready", timeout=10, after=mark)
            self.run_opensm()
        except BaseException:
            self.close()
            raise

    def console_text(self) -> str:
        return self.console_log.read_text(errors="replace")

    def wait_for(self, text: str, *, timeout: float = 5.0, after: int = 0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.console_text()
            if text in out[after:]:
                return out
            if self.proc.poll() is not None:
                raise RuntimeError(f"ibsim exited {self.proc.returncode}: {out[-2000:]}")
            time.sleep(0.02)
        raise TimeoutError(f"ibsim console never printed {text!r}: {self.console_text()[-2000:]}")

    def command(self, line: str, expect: str | None = None) -> str:
        """Send one console command; wait for ``expect`` in what it prints, if given."""
        mark = len(self.console_text())
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()
        if expect is not None:
            return self.wait_for(expect, after=mark)[mark:]
        self.wait_for("sim>", after=mark)
        return self.console_text()[mark:]

    def run_opensm(self) -> None:
        """One OpenSM sweep (``-o``: configure the subnet once and exit): assigns LIDs."""
        subprocess.run(
            ["ibsim-run", "opensm", "-o", "-f", str(self.workdir / "opensm.log")],
            env={**self.env, "OSM_CACHE_DIR": str(self.workdir)},
            cwd=self.workdir,
            capture_output=True,
            timeout=60,
            check=True,
        )

    def tool(self, host: str, *argv: str, timeout: float = 10) -> str:
        """Run a diags tool attached at node ``host``; its stdout."""
        done = subprocess.run(
            ["ibsim-run", *argv],
            env={**self.env, "SIM_HOST": host},
            cwd=self.workdir,  # libumad2sim writes a stand-in sysfs (sys-PID/) into its cwd
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )
        return done.stdout

    def restart(self) -> None:
        """A fresh simulator on the same control socket and net file, swept by OpenSM."""
        self.close()
        self._start()

    def stop_answering(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        self._out.close()
