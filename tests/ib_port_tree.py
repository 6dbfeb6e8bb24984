"""A minimal sysfs tree of ACTIVE InfiniBand ports with chosen ``counters/`` files, for the
PMA tests and benchmark: only the files the InfiniBand sampler reads for a port."""

from __future__ import annotations

from pathlib import Path


def write_ib_port(
    root: Path,
    dev: str,
    counters: dict[str, int],
    *,
    lid: int = 2,
    rate: str = "400 Gb/sec (4X NDR)",
) -> Path:
    """Port 1 of ``dev`` under ``root/class/infiniband``: ACTIVE, LinkUp, ``lid``, ``rate``,
    and one ``counters/<name>`` file per entry of ``counters``. Returns ``root``."""
    port = root / "class/infiniband" / dev / "ports/1"
    (port / "counters").mkdir(parents=True, exist_ok=True)
    for name, text in (
        ("link_layer", "InfiniBand"),
        ("state", "4: ACTIVE"),
        ("phys_state", "5: LinkUp"),
        ("lid", hex(lid)),
        ("rate", rate),
    ):
        (port / name).write_text(text + "\n")
    for name, value in counters.items():
        (port / "counters" / name).write_text(f"{value}\n")
    return root
