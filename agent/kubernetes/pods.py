"""The node's pods as the agent keeps them: :class:`PodMeta` (the few fields of a pod the
agent uses), :func:`parse_pod` (one pod of the API's JSON to a :class:`PodMeta`) and
:class:`PodIndex` (the node's pods by UID), apart from the watch that fills them
(:mod:`agent.kubernetes.podwatch`). A supervised child that is handed the pod index (the
throughput child) imports this module alone, never the watch's HTTP and TLS.

Imports the standard library and :mod:`agent.kubernetes.cgroup` only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import cast

from agent.kubernetes.cgroup import PodContainer


@dataclass(frozen=True, slots=True)
class PodMeta:
    """What the index keeps of one pod (from its API object).

    ``mirror_uid`` is a static pod's config hash (annotation ``kubernetes.io/config.mirror``):
    its cgroup carries that hash, not the mirror pod's UID. ``containers`` maps runtime
    container ids (``containerd://<id>`` less the scheme) to container names.
    ``labels``: the pod's labels (for label selectors); ``annotations``: only those under
    :data:`KEPT_ANNOTATION_PREFIX` (fabricscope's own settings); ``owner``: the name of the
    controller that owns the pod (a ReplicaSet's pod-template-hash suffix removed), the
    job a training pod belongs to. ``host_network``: the pod runs in the node's network
    namespace (``spec.hostNetwork``); ``ip``: its address (``status.podIP``; None until the
    kubelet reports one).
    """

    uid: str
    namespace: str
    name: str
    mirror_uid: str | None = None
    containers: tuple[tuple[str, str], ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    owner: str | None = None
    host_network: bool = False
    ip: str | None = None

    def annotation(self, key: str) -> str | None:
        return dict(self.annotations).get(key)

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)

    def job_name(self) -> str:
        """The training job the pod belongs to: its ``fabricscope.io/job`` annotation, else
        its controller's name, else empty."""
        return self.annotation(JOB_ANNOTATION) or self.owner or ""


#: pod annotations the index keeps (others may hold anything, secrets included)
KEPT_ANNOTATION_PREFIX = "fabricscope.io/"
#: the pod annotation naming the training job a pod belongs to
JOB_ANNOTATION = "fabricscope.io/job"


def text_field(obj: Mapping[str, object], key: str) -> str | None:
    """``obj[key]`` if it is a non-empty string, else None (API JSON is untrusted)."""
    value = obj.get(key)
    return value if isinstance(value, str) and value else None


def mapping_field(obj: Mapping[str, object], key: str) -> Mapping[str, object]:
    """``obj[key]`` if it is an object, else an empty mapping."""
    value = obj.get(key)
    return cast("Mapping[str, object]", value) if isinstance(value, dict) else {}


def parse_pod(obj: object) -> PodMeta | None:
    """A pod's index entry from its API JSON (``metadata``, ``status.*containerStatuses``);
    None when it lacks a uid, name or namespace."""
    if not isinstance(obj, dict):
        return None
    meta = mapping_field(obj, "metadata")
    uid, name, namespace = (
        text_field(meta, "uid"),
        text_field(meta, "name"),
        text_field(meta, "namespace"),
    )
    if uid is None or name is None or namespace is None:
        return None
    raw_annotations = mapping_field(meta, "annotations")
    mirror = text_field(raw_annotations, "kubernetes.io/config.mirror")
    labels = _strings(mapping_field(meta, "labels"))
    annotations = tuple(
        (k, v) for k, v in _strings(raw_annotations) if k.startswith(KEPT_ANNOTATION_PREFIX)
    )
    status = mapping_field(obj, "status")
    spec = mapping_field(obj, "spec")
    containers: dict[str, str] = {}
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        statuses = status.get(key)
        for cs in statuses if isinstance(statuses, list) else ():
            if not isinstance(cs, dict):
                continue
            cid, cname = text_field(cs, "containerID"), text_field(cs, "name")
            if cid is not None and cname is not None:
                containers[cid.split("://", 1)[-1]] = cname
    return PodMeta(
        uid,
        namespace,
        name,
        mirror,
        tuple(sorted(containers.items())),
        labels,
        annotations,
        _owner(meta, dict(labels)),
        host_network=spec.get("hostNetwork") is True,
        ip=text_field(status, "podIP"),
    )


def _strings(obj: Mapping[str, object]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in obj.items() if isinstance(v, str)))


def _owner(meta: Mapping[str, object], labels: Mapping[str, str]) -> str | None:
    """The controlling owner's name; a ReplicaSet's ``-<pod-template-hash>`` is removed so
    a Deployment's pods share one name."""
    refs = meta.get("ownerReferences")
    for ref in refs if isinstance(refs, list) else ():
        if not isinstance(ref, dict) or ref.get("controller") is not True:
            continue
        name = text_field(ref, "name")
        if name is None:
            continue
        tmpl = labels.get("pod-template-hash")
        if text_field(ref, "kind") == "ReplicaSet" and tmpl and name.endswith("-" + tmpl):
            name = name[: -len(tmpl) - 1]
        return name
    return None


def resource_version(obj: object) -> str | None:
    if not isinstance(obj, dict):
        return None
    return text_field(mapping_field(obj, "metadata"), "resourceVersion")


class PodIndex:
    """An immutable index of the node's pods by UID (and static pods' config hash)."""

    __slots__ = ("_by_uid", "_pods")

    def __init__(self, pods: Iterable[PodMeta] = ()) -> None:
        self._pods = {p.uid: p for p in pods}
        self._by_uid = dict(self._pods)
        for p in self._pods.values():
            if p.mirror_uid:
                self._by_uid.setdefault(p.mirror_uid, p)

    def __len__(self) -> int:
        return len(self._pods)

    def pods(self) -> list[PodMeta]:
        return sorted(self._pods.values(), key=lambda p: (p.namespace, p.name))

    def with_pod(self, pod: PodMeta) -> PodIndex:
        return PodIndex([*(p for u, p in self._pods.items() if u != pod.uid), pod])

    def without(self, uid: str) -> PodIndex:
        return PodIndex(p for u, p in self._pods.items() if u != uid)

    def by_uid(self, uid: str) -> PodMeta | None:
        return self._pods.get(uid)

    def lookup(self, where: PodContainer) -> tuple[PodMeta, str] | None:
        """(pod, container name) of a process's cgroup identity; the name is "" when the
        pod's status does not (yet) list that container id."""
        pod = self._by_uid.get(where.pod_uid)
        if pod is None:
            return None
        names = dict(pod.containers)
        return pod, names.get(where.container_id or "", "")
