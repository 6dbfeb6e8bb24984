"""A port's PMA for tests that run whole agents: stands in for ``perfquery`` over a sysfs
fixture tree whose ``counters/`` files play the hardware counters.

    python pma_standin.py SYSROOT perfquery -C DEV -P PORT -t MS -x LID PORT
    python pma_standin.py SYSROOT perfquery -C DEV -P PORT -t MS -r LID PORT MASK

``-x`` prints the simulator's real PortCountersExtended answer (``tests/fixtures/ibpeer/sim``:
CapabilityMask2 0, so no 64-bit error counters), for the asked LID and port. ``-r`` does
what perfquery's read-and-reset does to a PMA: under the tree's lock it reads each counter
the mask selects, prints the simulator's real PortCounters answer with those values (every
other counter 0), and sets those counters to 0. A test adding "hardware" errors takes the
same lock (:func:`add`), so no error is lost between a read and a clear and the test knows
the true count. Files are replaced by rename, never seen half-written.
"""

from __future__ import annotations

import fcntl
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "ibpeer" / "sim"
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agent.infiniband.parse import PMA_WIDTHS  # noqa: E402
from agent.infiniband.perfquery import PERFQUERY_NAMES, RESET_BITS  # noqa: E402


def counters_dir(root: Path, device: str, port: int) -> Path:
    return root / "class/infiniband" / device / "ports" / str(port) / "counters"


@contextmanager
def locked(root: Path) -> Iterator[None]:
    with open(root / ".pma.lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def write(path: Path, value: int) -> None:
    # the temporary file lies in the port's directory, which the agent reads by name, not in
    # counters/, which it lists: one there is listed, renamed away and then read as a counter
    # that vanished (a read error: one CI run saw FabricscopeSamplerReadErrors turn pending)
    tmp = path.parent.parent / f".{path.parent.name}.{path.name}.new"
    tmp.write_text(f"{value}\n")
    os.replace(tmp, path)


def add(root: Path, device: str, port: int, name: str, by: int) -> None:
    """``by`` more errors on the hardware counter ``name`` (held at its width's maximum)."""
    with locked(root):
        path = counters_dir(root, device, port) / name
        width = PMA_WIDTHS.get(name, 64)
        write(path, min(int(path.read_text()) + by, (1 << width) - 1))


def _answer(name: str, lid: str, port: str, values: dict[str, int]) -> str:
    out = []
    for line in (FIX / name).read_text().splitlines():
        if line.startswith("#"):
            out.append(re.sub(r"Lid \d+ port \d+", f"Lid {lid} port {port}", line))
            continue
        field, _, _ = line.partition(":")
        kernel = PERFQUERY_NAMES.get(field)
        if field == "PortSelect":
            out.append(f"{field}:{'.' * (33 - len(field))}{port}")
            continue
        if kernel is None:
            out.append(line)
            continue
        out.append(f"{field}:{'.' * (33 - len(field))}{values.get(kernel, 0)}")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    root = Path(argv[0])
    args = argv[2:]  # after "perfquery"
    device = args[args.index("-C") + 1]
    port = int(args[args.index("-P") + 1])
    if "-x" in args:
        lid, p = args[args.index("-x") + 1 : args.index("-x") + 3]
        sys.stdout.write(_answer("perfquery-x-peer.txt", lid, p, {}))
        return 0
    if "-r" in args:
        lid, p, mask = args[args.index("-r") + 1 : args.index("-r") + 4]
        names = [n for n, bit in RESET_BITS.items() if int(mask, 16) >> bit & 1]
        values: dict[str, int] = {}
        with locked(root):
            for name in names:
                path = counters_dir(root, device, port) / name
                if path.exists():
                    values[name] = int(path.read_text())
                    write(path, 0)
        sys.stdout.write(_answer("perfquery-peer.txt", lid, p, values))
        return 0
    print(f"pma_standin: unsupported call {args}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
