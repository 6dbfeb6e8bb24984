"""``fabricscope topology`` and ``fabricscope topology-controller``'s flags, without importing
the map itself (so ``fabricscope --help`` stays fast)."""

from __future__ import annotations

import argparse
from typing import Any

from agent.core.logsetup import LEVELS
from exporter.cli.argtypes import (
    add_choice,
    add_prometheus_timeout,
    byte_size,
    duration,
    positive_duration,
)

OUTPUTS = ("labels", "kueue", "volcano", "slurm", "slurm-block", "graph")


def _prometheus(p: argparse.ArgumentParser, required: bool = True) -> None:
    g = p.add_argument_group("Prometheus")
    g.add_argument(
        "--prometheus.url",
        dest="prom_url",
        required=required,
        default="",
        metavar="URL",
        help=None if required else "where the agents' series are (or --exposition.dir)",
    )
    add_prometheus_timeout(g)
    g.add_argument(
        "--prometheus.max-body-bytes",
        dest="prom_max_body",
        type=byte_size,
        default=64 << 20,
        metavar="BYTES",
        help="the largest answer read; a bigger one is an error (default: 67108864, 64 MiB)",
    )
    g.add_argument(
        "--prometheus.selector",
        dest="prom_selector",
        default='job="fabricscope"',
        metavar="MATCHERS",
        help="label matchers added to every query, to pick one fabric's agents "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--prometheus.node-label",
        dest="prom_node_label",
        default="instance",
        metavar="LABEL",
        help="the label naming the node (the chart relabels instance to the node's name; "
        "default: %(default)s)",
    )
    g.add_argument("--prometheus.ca-file", dest="prom_ca", metavar="FILE")
    g.add_argument("--prometheus.bearer-token-file", dest="prom_token_file", metavar="FILE")
    g.add_argument("--prometheus.username", dest="prom_user", metavar="NAME")
    g.add_argument("--prometheus.password-file", dest="prom_password_file", metavar="FILE")


def _labels(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--label.prefix",
        dest="label_prefix",
        default="fabric.topograph.run/",
        metavar="PREFIX",
        help="node label keys are PREFIX + tier-0 (the leaf), tier-1 (the spine block) and "
        "tier-2 (the core group, where one is seen); the default is topograph's, which "
        "schedulers set up for it read unchanged",
    )
    p.add_argument(
        "--label.accelerator",
        dest="label_accelerator",
        default="accelerator.topograph.run/domain",
        metavar="KEY",
        help="the node label key of the NVLink domain (<cluster UUID>.<clique ID>, where the "
        "GPUs report one; '' for none; default: topograph's, %(default)s)",
    )


def _logging(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log.level", dest="log_level", choices=LEVELS, default="info")
    p.add_argument("--log.format", dest="log_format", choices=("text", "json"), default="text")


def add_parsers(sub: Any) -> None:
    """Register ``topology`` and ``topology-controller``."""
    p = sub.add_parser(
        "topology",
        help="the fabric's tiers for schedulers (labels, Kueue, Volcano, Slurm), from Prometheus",
        description="Derive each node's leaf and spine block from the InfiniBand neighbours "
        "the agents export, and print them for a scheduler.",
        epilog="Exit codes: 0 printed; 1 no node placed (no agent series matched); 2 could "
        "not run (bad flags, Prometheus unreachable or refusing, an unreadable directory).",
    )
    _prometheus(p, required=False)
    p.add_argument(
        "--exposition.dir",
        dest="exposition_dir",
        default="",
        metavar="DIR",
        help="instead of Prometheus: every NODE.prom file in DIR is node NODE's /metrics text "
        "(e.g. written by `fabricscope agent --once` from cron)",
    )
    _labels(p)
    p.add_argument(
        "--output",
        choices=OUTPUTS,
        default="labels",
        help="labels (node -> labels, JSON), kueue (a Topology, YAML), volcano (HyperNodes, "
        "YAML), slurm (topology.conf, tree plugin), slurm-block (topology.conf, block plugin: "
        "one block per NVLink domain), graph (switches, nodes, links, JSON) "
        "(default: %(default)s)",
    )
    p.add_argument("--kueue.name", dest="kueue_name", default="fabricscope", metavar="NAME")
    add_choice(
        p,
        "--kueue.api-version",
        "kueue_api_version",
        choices=("v1beta1", "v1beta2"),
        default="v1beta2",
        help="Kueue's Topology version (v1beta1 for a Kueue that serves no v1beta2)",
    )
    add_choice(
        p,
        "--volcano.members",
        "volcano_members",
        choices=("name", "label"),
        default="name",
        help="a leaf HyperNode's nodes: by name (exactMatch), or by their tier-0 label "
        "(labelMatch: follows the controller's labels; needs a Volcano whose HyperNode has "
        "labelMatch)",
    )
    _logging(p)

    c = sub.add_parser(
        "topology-controller",
        help="keep nodes' fabric tier labels true, after a hold-down (one Deployment)",
        description="Every interval, read the fabric map from Prometheus and patch the nodes' "
        "labels under --label.prefix only; a change is applied once the map has said the "
        "same for --hold-down.",
    )
    _prometheus(c)
    _labels(c)
    g = c.add_argument_group("Kubernetes")
    g.add_argument(
        "--kubernetes.api-url",
        dest="kube_url",
        default="",
        metavar="URL",
        help="the API server (default: in the cluster, from KUBERNETES_SERVICE_HOST/PORT)",
    )
    g.add_argument(
        "--kubernetes.token-file",
        dest="kube_token_file",
        default="/var/run/secrets/kubernetes.io/serviceaccount/token",
        metavar="FILE",
    )
    g.add_argument(
        "--kubernetes.ca-file",
        dest="kube_ca_file",
        default="/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
        metavar="FILE",
    )
    g.add_argument(
        "--kubernetes.timeout",
        dest="kube_timeout",
        type=positive_duration,
        default=10.0,
        metavar="DURATION",
        help="per request (default: 10s)",
    )
    c.add_argument(
        "--interval",
        type=positive_duration,
        default=60.0,
        metavar="DURATION",
        help="how often the map is read (default: 1m)",
    )
    c.add_argument(
        "--hold-down",
        dest="hold_down",
        type=duration,
        default=600.0,
        metavar="DURATION",
        help="how long a node's new tiers must stay the same before they are applied: a "
        "flapping cable never flaps a placement (default: 10m)",
    )
    c.add_argument(
        "--max-removals",
        dest="max_removals",
        type=float,
        default=0.1,
        metavar="FRACTION",
        help="in one pass, remove the labels of at most this fraction of the labelled nodes "
        "(at least one): a Prometheus that lost the agents' series does not unlabel the "
        "fleet (default: %(default)s)",
    )
    c.add_argument(
        "--dry-run",
        dest="dry_run",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="log and count the changes, patch nothing",
    )
    c.add_argument(
        "--once",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="one pass, then exit (a hold-down longer than 0 then applies nothing)",
    )
    c.add_argument(
        "--web.listen-address",
        dest="listen",
        default=":10119",
        metavar="[HOST]:PORT",
        help="serve the controller's own /metrics here ('' for none; default: %(default)s)",
    )
    _logging(c)
