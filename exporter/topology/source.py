"""Read the map from Prometheus: five instant queries (the nodes' leaves, their ports' state,
the leaves' uplinks, the spines' cables, the GPUs' NVLink domains), narrowed by a selector,
parsed by :mod:`exporter.topology.parse`."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from exporter.explain.client import PrometheusClient
from exporter.topology import model, parse

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Read:
    fmap: model.FabricMap
    rejects: dict[str, int]


def _with(query: str, selector: str) -> str:
    if not selector:
        return query
    if query.endswith("}"):
        return f"{query[:-1]},{selector}}}"
    return f"{query}{{{selector}}}"


def read(
    client: PrometheusClient, at: float, *, selector: str = "", node_label: str = "instance"
) -> Read:
    """The fabric map as Prometheus holds it at ``at``."""
    rejects = parse.Rejects()
    peers = client.query(_with(parse.PEER_QUERY, selector), at)
    up = client.query(_with(parse.PORT_UP_QUERY, selector), at)
    uplinks = client.query(_with(parse.UPLINK_QUERY, selector), at)
    spines = client.query(_with(parse.SPINE_QUERY, selector), at)
    gpus = client.query(_with(parse.DOMAIN_QUERY, selector), at)
    atts = parse.attachments(
        ((s.labels, s.value) for s in peers),
        ((s.labels, s.value) for s in up),
        rejects,
        node_label=node_label,
    )
    links = parse.switch_links(((s.labels, s.value) for s in uplinks), rejects)
    core = parse.switch_links(((s.labels, s.value) for s in spines), rejects)
    domains = parse.domains(((s.labels, s.value) for s in gpus), rejects, node_label=node_label)
    if rejects.total:
        log.warning("samples left out of the fabric map: %s", rejects.counts)
    return Read(model.build(atts, links, core, domains), dict(rejects.counts))
