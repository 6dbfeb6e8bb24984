"""``fabricscope topology`` (print the map for a scheduler) and ``fabricscope
topology-controller`` (keep the nodes' labels true): the commands' bodies."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Iterator

import yaml

from exporter.explain.client import ClientSettings, PrometheusClient, PrometheusError
from exporter.topology import files, render, source
from exporter.topology.controller import Controller, Counters, labels_reader
from exporter.topology.hold import HoldDown
from exporter.topology.kubeapi import KubeError, KubeSettings, NodesApi
from exporter.topology.parse import MapError

log = logging.getLogger(__name__)


def _client(ns: argparse.Namespace) -> PrometheusClient:
    return PrometheusClient(
        ClientSettings(
            url=ns.prom_url,
            timeout=ns.prom_timeout,
            max_body_bytes=ns.prom_max_body,
            ca_file=ns.prom_ca,
            username=ns.prom_user,
            password_file=ns.prom_password_file,
            bearer_token_file=ns.prom_token_file,
        )
    )


def _keys(ns: argparse.Namespace) -> render.LabelKeys | None:
    flag = "--label.prefix"
    try:
        render.LabelKeys(ns.label_prefix, "")
        flag = "--label.accelerator"
        return render.LabelKeys(ns.label_prefix, ns.label_accelerator)
    except ValueError as exc:
        print(f"fabricscope {ns.command}: error: {flag}: {exc}", file=sys.stderr)
        return None


def cmd_topology(ns: argparse.Namespace) -> int:
    keys = _keys(ns)
    if keys is None:
        return 2
    if bool(ns.prom_url) == bool(ns.exposition_dir):
        print(
            "fabricscope topology: error: give one of --prometheus.url and --exposition.dir",
            file=sys.stderr,
        )
        return 2
    try:
        if ns.exposition_dir:
            fmap, _ = files.read_dir(ns.exposition_dir)
            where = f"the *.prom files of {ns.exposition_dir}"
        else:
            fmap = source.read(
                _client(ns), time.time(), selector=ns.prom_selector, node_label=ns.prom_node_label
            ).fmap
            where = f"series matching {ns.prom_selector!r}"
    except (PrometheusError, MapError) as exc:
        print(f"fabricscope topology: {exc}", file=sys.stderr)
        return 2
    if not fmap.places:
        print(
            "fabricscope topology: no node placed: no fabricscope_infiniband_peer_info of a "
            f"switch neighbour in {where} (are the agents' ibpeer samplers on?)",
            file=sys.stderr,
        )
        return 1
    out = sys.stdout
    if ns.output == "labels":
        out.write(json.dumps(render.node_labels(fmap, keys), indent=2, sort_keys=True) + "\n")
    elif ns.output == "kueue":
        topo = render.kueue_topology(
            keys,
            ns.kueue_name,
            ns.kueue_api_version,
            depth=fmap.depth,
            domains=bool(fmap.domains),
        )
        out.write(yaml.safe_dump(topo, sort_keys=False))
    elif ns.output == "volcano":
        hypernodes = render.volcano_hypernodes(fmap, keys, by_label=ns.volcano_members == "label")
        out.write(yaml.safe_dump_all(hypernodes, sort_keys=False))
    elif ns.output == "slurm":
        out.write(render.slurm_tree(fmap))
    elif ns.output == "slurm-block":
        if not fmap.domains:
            print(
                "fabricscope topology: no NVLink domain: no GPU of the placed nodes reports "
                "one (fabricscope_nvml_gpu_fabric_info with state completed)",
                file=sys.stderr,
            )
            return 1
        out.write(render.slurm_block(fmap))
    else:
        out.write(json.dumps(render.graph(fmap, keys), indent=2) + "\n")
    return 0


class _Collector:
    """The controller's counters as the catalog's families (:mod:`exporter.metrics.
    topology`), rendered at each scrape."""

    def __init__(self, counters: Counters) -> None:
        self.c = counters

    def collect(self) -> Iterator[object]:
        from exporter.metrics import topology as specs
        from exporter.metrics.exposition import to_metrics
        from exporter.metrics.spec import Families

        out = Families("full")
        specs.render(
            out,
            changes=self.c.changes,
            passes=self.c.passes,
            patch_errors=self.c.patch_errors,
            removals_refused=self.c.removals_refused,
            placed=self.c.placed,
            pending=self.c.pending,
            last_success=self.c.last_success,
        )
        yield from to_metrics(out)


def _listen(listen: str) -> tuple[str, int] | None:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]") or "0.0.0.0", int(port)


def _serve(addr: tuple[str, int], counters: Counters) -> None:
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(counters))  # type: ignore[arg-type]
    start_http_server(addr[1], addr=addr[0], registry=registry)


def cmd_controller(ns: argparse.Namespace) -> int:
    keys = _keys(ns)
    if keys is None:
        return 2
    addr = _listen(ns.listen) if ns.listen else None
    if ns.listen and addr is None:
        print(
            f"fabricscope topology-controller: error: --web.listen-address {ns.listen!r} is "
            "not [HOST]:PORT",
            file=sys.stderr,
        )
        return 2
    if not 0 <= ns.max_removals <= 1:
        print(
            "fabricscope topology-controller: error: --max-removals is a fraction in [0, 1]",
            file=sys.stderr,
        )
        return 2
    try:
        nodes = NodesApi(
            KubeSettings.in_cluster(
                ns.kube_url, ns.kube_token_file, ns.kube_ca_file, ns.kube_timeout
            )
        )
    except KubeError as exc:
        print(f"fabricscope topology-controller: {exc}", file=sys.stderr)
        return 2
    client = _client(ns)

    def read() -> object:
        return source.read(
            client, time.time(), selector=ns.prom_selector, node_label=ns.prom_node_label
        ).fmap

    ctl = Controller(
        labels_reader(read, keys),
        nodes,
        keys,
        HoldDown(ns.hold_down),
        max_removals=ns.max_removals,
        dry_run=ns.dry_run,
    )
    if ns.once:
        ctl.run_pass()
        return 0 if ctl.counters.passes["ok"] else 1
    if addr is not None:
        try:
            _serve(addr, ctl.counters)
        except OSError as exc:
            print(
                f"fabricscope topology-controller: cannot serve {ns.listen}: {exc.strerror}",
                file=sys.stderr,
            )
            return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info(
        "topology controller: keys %s, every %gs, hold-down %gs%s",
        ",".join(keys.keys),
        ns.interval,
        ns.hold_down,
        " (dry run)" if ns.dry_run else "",
    )
    while not stop.is_set():
        ctl.run_pass()
        stop.wait(ns.interval)
    return 0
