"""The map from agents' expositions on disk, for a cluster without Prometheus (a Slurm
cluster running ``fabricscope agent --once`` from cron, node_exporter's textfile directory):
every ``NODE.prom`` file of one directory is node ``NODE``'s ``/metrics`` text.

Untrusted input, bounded: a file larger than :data:`MAX_FILE_BYTES`, a symbolic link or
anything but a regular file, a name that is not a Kubernetes/Slurm node name, or text the
exposition parser refuses is skipped with one log line and counted in the rejects; at most
:data:`MAX_FILES` files are read. Only the families the map needs are kept.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from exporter.topology import model, parse

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 16 << 20
MAX_FILES = 100_000
_WANTED = {
    "fabricscope_infiniband_peer_info": "peer",
    "fabricscope_infiniband_port_up": "up",
    "fabricscope_infiniband_switch_link_info": "uplink",
    "fabricscope_infiniband_spine_link_info": "spine",
    "fabricscope_gpu_fabric_info": "domain",
}

Samples = list[tuple[Mapping[str, str], float]]


def _read(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
        data = os.read(fd, MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
    return data.decode("utf-8", errors="replace")


def _samples(text: str, node: str, out: dict[str, Samples]) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        kind = _WANTED.get(family.name)
        if kind is None:
            continue
        for s in family.samples:
            if s.name == family.name:
                out[kind].append(({**s.labels, "instance": node}, float(s.value)))


def read_dir(directory: str) -> tuple[model.FabricMap, dict[str, int]]:
    """The map of every ``*.prom`` file in ``directory``; (map, rejects by reason)."""
    rejects = parse.Rejects()
    found: dict[str, Samples] = {kind: [] for kind in _WANTED.values()}
    root = Path(directory)
    if not root.is_dir():
        raise parse.MapError(f"--exposition.dir {directory}: not a directory")
    names = sorted(p.name for p in root.iterdir() if p.name.endswith(".prom"))
    if len(names) > MAX_FILES:
        raise parse.MapError(f"--exposition.dir {directory}: more than {MAX_FILES} files")
    for name in names:
        node = name.removesuffix(".prom")
        if not parse.NODE_NAME.fullmatch(node):
            rejects.add("file_name")
            log.warning("%s: not NODE.prom with a node name: skipped", name)
            continue
        try:
            _samples(_read(root / name), node, found)
        except (OSError, ValueError) as exc:
            rejects.add("file")
            log.warning("%s: skipped: %s", name, getattr(exc, "strerror", None) or exc)
    atts = parse.attachments(found["peer"], found["up"], rejects)
    links = parse.switch_links(found["uplink"], rejects)
    core = parse.switch_links(found["spine"], rejects)
    domains = parse.domains(found["domain"], rejects)
    return model.build(atts, links, core, domains), dict(rejects.counts)
