"""The panel tables' vocabulary: :class:`Panel`, :class:`Show`, :class:`Board`, and the
PromQL fragments every dashboard shares (the cluster/node matchers, the rate interval)."""

from __future__ import annotations

from dataclasses import dataclass, field

#: matchers every query carries: the cluster and node variables
N = 'cluster=~"$cluster",instance=~"$node"'
RI = "$__rate_interval"
PROBE_SIZE = '"67108864"'  # 64 MiB: the probe's largest default size


@dataclass(frozen=True)
class Show:
    """This panel must rank the cause of a scenario of ``kinds`` first, compared on
    ``labels`` (cause field -> series label); ``order`` "desc": highest value first."""

    kinds: tuple[str, ...]
    labels: tuple[tuple[str, str], ...]
    order: str = "desc"


@dataclass(frozen=True)
class Panel:
    title: str
    kind: str  # timeseries | bargauge | table | matrix
    targets: tuple[tuple[str, str], ...]  # (expr, legend)
    unit: str
    description: str = ""
    w: int = 12
    h: int = 8
    shows: tuple[Show, ...] = ()
    #: may be empty in a scenario (a counter no scenario advances); says why
    may_be_empty: str = ""
    matrix: tuple[str, str] = ("", "")  # matrix: (row label, column label)
    stack: bool = False
    #: a data link on every value (Grafana's ${__field.labels.X} names a series' label)
    link: str = ""
    #: start a new row of the grid (a group of panels kept together)
    new_row: bool = False
    #: a data link from each series to the Node dashboard of its ``instance`` (only where
    #: the legend names the instance)
    node_link: bool = True


@dataclass(frozen=True)
class Board:
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...]
    variables: tuple[str, ...] = ("cluster", "node")
    single_node: bool = False
    extra_vars: tuple[tuple[str, str], ...] = field(default=())  # (name, label_values query)


NODE_PORT = (("node", "instance"), ("device", "device"))
NODE = (("node", "instance"),)
NODE_GPU = (("node", "instance"), ("gpu", "gpu"))
