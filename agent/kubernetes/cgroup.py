"""Pure parsers for ``/proc/<pid>/cgroup``: which Kubernetes pod and container a process is in.

The kubelet names a pod's cgroup after the pod UID and the container runtime names the
container's cgroup after the container id; how they spell it depends on the cgroup driver and
the runtime (every form below is from a real host, see tests/fixtures/procfs-cgroup/):

- systemd driver, containerd / CRI-O / docker (cri-dockerd), cgroup v1 or v2::

    0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/cri-containerd-<id>.scope
    13:freezer:/kubepods.slice/.../kubepods-burstable-pod<uid_>.slice/crio-<id>.scope
    11:freezer:/kubepods.slice/.../kubepods-burstable-pod<uid_>.slice/docker-<id>.scope

  where ``<uid_>`` is the pod UID with ``-`` written as ``_`` (systemd reserves ``-``).
- systemd driver, containerd >= 1.5 on cgroup v1, where the runtime passes the kubelet's
  ``slice:prefix:name`` form through as one path component::

    6:devices:/system.slice/containerd.service/kubepods-besteffort-pod<uid_>.slice:cri-containerd:<id>

- cgroupfs driver (containerd, docker; CRI-O adds ``crio-``)::

    12:cpuset:/kubepods/pod<uid>/<id>
    5:memory:/kubepods/burstable/pod<uid>/<id>

The pod component may sit below other components (a kind node's ``/docker/<id>/kubelet/...``,
``kubelet.slice/kubelet-kubepods.slice/...``) or behind ``/../..`` when the reader is in
another cgroup namespace, so the parsers look for the innermost pod component anywhere in the
path and take the component right after it as the container. Static pods carry a 32-hex
config hash instead of a UUID; it is returned as is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: a pod component of the systemd driver: ``kubepods-pod<uid_>.slice``,
#: ``kubepods-burstable-pod<uid_>.slice``, ``kubelet-kubepods-besteffort-pod<uid_>.slice``
_SYSTEMD_POD = re.compile(r"^(?:[a-z0-9]+-)*kubepods(?:-[a-z]+)?-pod([0-9a-fA-F_-]+)\.slice$")
#: a pod component of the cgroupfs driver: ``pod<uid>``
_CGROUPFS_POD = re.compile(r"^pod([0-9a-fA-F-]+)$")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_HASH = re.compile(r"^[0-9a-f]{32}$")
_ID = re.compile(r"^[0-9a-f]{64}$")
#: a container component of the systemd driver: ``<prefix>-<id>.scope``
_SCOPE = re.compile(r"^([a-z-]+)-([0-9a-f]{64})\.scope$")
#: runtime names by the prefix they give a container's cgroup
_RUNTIMES = {"cri-containerd": "containerd", "crio": "crio", "docker": "docker"}


@dataclass(frozen=True, slots=True)
class CgroupLine:
    """One line of ``/proc/<pid>/cgroup``: ``hierarchy-ID:controller-list:cgroup-path``.

    ``controllers`` is empty for the cgroup v2 line (``0::/...``).
    """

    hierarchy: int
    controllers: tuple[str, ...]
    path: str


@dataclass(frozen=True, slots=True)
class PodContainer:
    """Where a process runs, as its cgroup path says.

    ``pod_uid`` is in the API's form (dashes; a static pod's 32-hex hash as is);
    ``container_id`` is the runtime's 64-hex id, None when the process is in the pod's cgroup
    but no container's (CRI-O's conmon, for one); ``runtime`` is containerd, crio or docker,
    None when the path does not say (the cgroupfs driver names containers by id alone).
    """

    pod_uid: str
    container_id: str | None
    runtime: str | None


def parse_cgroup(text: str) -> tuple[CgroupLine, ...]:
    """Every line of a ``/proc/<pid>/cgroup`` file. Raises ValueError on a malformed line.

    The path keeps any colons (the containerd v1 form has two), so a line splits on its first
    two colons only.
    """
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[0].isdigit() or not parts[2].startswith("/"):
            raise ValueError(f"not a cgroup line: {line!r}")
        controllers = tuple(c for c in parts[1].split(",") if c)
        out.append(CgroupLine(int(parts[0]), controllers, parts[2]))
    return tuple(out)


def _pod_uid(raw: str) -> str | None:
    uid = raw.replace("_", "-").lower()
    if _UUID.match(uid) or _HASH.match(uid):
        return uid
    return None


def _pod_of(component: str) -> str | None:
    m = _SYSTEMD_POD.match(component) or _CGROUPFS_POD.match(component)
    return _pod_uid(m.group(1)) if m else None


def _container_of(component: str) -> tuple[str | None, str | None]:
    """(container id, runtime) named by the component below a pod's, or (None, None)."""
    m = _SCOPE.match(component)
    if m:
        runtime = _RUNTIMES.get(m.group(1))
        return (m.group(2), runtime) if runtime else (None, None)
    if _ID.match(component):
        return component, None
    if component.startswith("crio-") and _ID.match(component[5:]):  # CRI-O, cgroupfs driver
        return component[5:], "crio"
    return None, None


def parse_cgroup_path(path: str) -> PodContainer | None:
    """The pod and container a cgroup path belongs to, or None outside any pod."""
    found: PodContainer | None = None
    components = path.split("/")
    for i, comp in enumerate(components):
        if comp.count(":") == 2:  # slice:prefix:id, containerd >= 1.5 on cgroup v1
            slice_, prefix, name = comp.split(":")
            uid = _pod_of(slice_)
            if uid is not None:
                kind = _RUNTIMES.get(prefix)
                ok = kind is not None and _ID.match(name) is not None
                found = PodContainer(uid, name if ok else None, kind)
            continue
        uid = _pod_of(comp)
        if uid is None:
            continue
        cid, runtime = _container_of(components[i + 1]) if i + 1 < len(components) else (None, None)
        found = PodContainer(uid, cid, runtime)
    return found


def pod_container(text: str) -> PodContainer | None:
    """The pod and container of the process whose ``/proc/<pid>/cgroup`` is ``text``.

    cgroup v1 files list one line per hierarchy, and not every hierarchy need place the
    process in its pod (hybrid hosts keep some controllers elsewhere): the first line naming a
    container wins, else the first naming a pod. None for a process outside any pod. Raises
    ValueError on a malformed file.
    """
    pod_only: PodContainer | None = None
    for line in parse_cgroup(text):
        found = parse_cgroup_path(line.path)
        if found is None:
            continue
        if found.container_id is not None:
            return found
        if pod_only is None:
            pod_only = found
    return pod_only
