"""Which container logs to read: the kubelet's log layout, and the pod selection.

The kubelet writes each container's output under ``<pod-logs>/<namespace>_<pod>_<uid>/
<container>/<restart>.log`` (``/var/log/pods`` by default), in the CRI log format; it
rotates ``N.log`` to ``N.log.<YYYYMMDD-hhmmss>`` and compresses older ones to ``.gz``.
Namespaces and pod names are DNS labels, so ``_`` separates the three parts unambiguously.

Selection: by default the pods that hold a GPU of this node (the attribution sampler's
latest pass); ``--throughput.pods=all`` takes every pod; ``--throughput.namespace`` and
``--throughput.selector`` (a Kubernetes label selector) narrow either set.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

POD_SELECTIONS = ("gpu", "all")


@dataclass(frozen=True, slots=True)
class PodDir:
    """One pod's log directory name, split."""

    namespace: str
    pod: str
    uid: str


def parse_pod_dir(name: str) -> PodDir | None:
    """``training_llm-0_5f1c...`` -> PodDir; None for a name not in that layout."""
    parts = name.split("_")
    if len(parts) != 3 or not all(parts):
        return None
    return PodDir(*parts)


_LOG = re.compile(r"^(\d+)\.log$")
_ROTATED = re.compile(r"^(\d+)\.log\.(\d{8}-\d{6})(\.gz)?$")


def current_log(names: list[str]) -> str | None:
    """The live log of a container directory: the highest restart number's ``N.log``."""
    best: tuple[int, str] | None = None
    for n in names:
        m = _LOG.match(n)
        if m and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), n)
    return best[1] if best else None


def newest_rotated(names: list[str], current: str) -> str | None:
    """The most recent rotated file of ``current`` (``0.log.20240101-120000[.gz]``)."""
    restart = current.split(".", 1)[0]
    best: tuple[str, str] | None = None
    for n in names:
        m = _ROTATED.match(n)
        if m and m.group(1) == restart and (best is None or m.group(2) > best[0]):
            best = (m.group(2), n)
    return best[1] if best else None


# --- label selectors ----------------------------------------------------------------------

_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_VALUE = r"[-A-Za-z0-9_.]*"
_REQ = re.compile(
    rf"^\s*(?:(?P<not>!)\s*(?P<nkey>{_KEY})"
    rf"|(?P<key>{_KEY})\s*(?:(?P<op>==|!=|=)\s*(?P<value>{_VALUE})"
    rf"|\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\))?)\s*$"
)


@dataclass(frozen=True, slots=True)
class Requirement:
    """One term of a label selector: ``key`` with op ``=``, ``!=``, ``in``, ``notin``,
    ``exists`` or ``!exists``."""

    key: str
    op: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        v = labels.get(self.key)
        if self.op == "exists":
            return v is not None
        if self.op == "!exists":
            return v is None
        if self.op in ("=", "in"):
            return v is not None and v in self.values
        return v is None or v not in self.values  # != and notin


def _split_terms(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return out


def parse_selector(text: str) -> tuple[Requirement, ...]:
    """A Kubernetes label selector (``app=llm,tier!=eval,env in (a,b),gpu,!spot``) as
    requirements, all of which must hold. Raises ValueError naming the bad term."""
    reqs = []
    for term in _split_terms(text):
        if not term.strip():
            raise ValueError(f"empty term in label selector {text!r}")
        m = _REQ.match(term)
        if m is None:
            raise ValueError(f"bad label selector term {term.strip()!r}")
        if m.group("not"):
            reqs.append(Requirement(m.group("nkey"), "!exists"))
        elif m.group("op"):
            op = "=" if m.group("op") in ("=", "==") else "!="
            reqs.append(Requirement(m.group("key"), op, (m.group("value"),)))
        elif m.group("setop"):
            values = tuple(v.strip() for v in m.group("values").split(","))
            if not all(re.fullmatch(_VALUE, v) for v in values):
                raise ValueError(f"bad value in label selector term {term.strip()!r}")
            op = "in" if m.group("setop") == "in" else "notin"
            reqs.append(Requirement(m.group("key"), op, values))
        else:
            reqs.append(Requirement(m.group("key"), "exists"))
    return tuple(reqs)


def selector_matches(reqs: tuple[Requirement, ...], labels: Mapping[str, str]) -> bool:
    return all(r.matches(labels) for r in reqs)
