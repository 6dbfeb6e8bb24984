"""``fabricscope agent``'s body: build the samplers from the flags, then either print one
pass's exposition (``--once``) or serve /metrics (and /healthz) until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

from agent import __version__
from agent.core.errors import ConfigError
from exporter.cli.agent_flags import config_from_args

if TYPE_CHECKING:
    from agent.config import AgentConfig
    from exporter.app import AgentApp

log = logging.getLogger("fabricscope")


def cmd_agent(ns: argparse.Namespace) -> int:
    from contextlib import ExitStack
    from dataclasses import replace

    from agent.core.allocator import hold_heap, limit_arenas
    from agent.core.sysfs import SysfsReader
    from agent.samplers import Latest, build_specs
    from exporter.app import AgentApp
    from exporter.cli.source import open_source

    config = config_from_args(ns)
    limit_arenas()  # before any thread: the main process's RSS stays flat (see the module)
    hold_heap()  # no trim-and-refault sawtooth in its RSS (see the module)
    if config.probe.enabled:
        from agent.probe.measure.launch import PROBE_EXTRA_HINT, missing_worker_modules

        missing = missing_worker_modules()
        if missing:
            raise ConfigError(
                f"--probe: the probe needs {' and '.join(missing)}, not installed here: "
                f"{PROBE_EXTRA_HINT}"
            )
    with ExitStack() as stack:
        src = open_source(stack, ns)
        dropped = config.sampling.enabled & src.unavailable
        if dropped:
            log.info(
                "replaying %s: it holds nothing for %s; disabled",
                src.label,
                ", ".join(sorted(dropped)),
            )
        config = replace(
            config,
            paths=replace(config.paths, sysfs=src.sysfs),
            sampling=replace(config.sampling, enabled=config.sampling.enabled - dropped),
        )
        if getattr(ns, "snapshot", None):  # a snapshot holds no PMA to ask: sysfs only
            config = replace(config, infiniband=replace(config.infiniband, perfquery="off"))
        _say_nothing_kept(config)
        latest = Latest()
        specs = build_specs(
            config,
            SysfsReader(src.sysfs),
            nvml_api=src.nvml_api,
            watch_xid=not ns.once,
            run_probes=not ns.once,
            latest=latest,
            once=ns.once,
        )
        if ns.memory_limit:  # how the limit is divided; one line, a warning if too small
            _say_memory_plan(ns.memory_limit, (s.sampler.name for s in specs))
        app = AgentApp(
            specs, latest, detail=ns.collector_detail, memory_limit_bytes=ns.memory_limit or None
        )
        if not ns.once:
            return _serve(app, ns)
        sys.stdout.buffer.write(app.run_once())
        sys.stdout.flush()
        _warn_unread_once(app, config.sampling.timeout_seconds)
    _exit_past_abandoned_passes()
    return 0


def _say_nothing_kept(config: AgentConfig) -> None:
    """One line at start when the PMA counters run without a state file (the chart's
    ``nonRoot: true`` turns it off): an agent restart may then show as a counter reset."""
    ib = config.infiniband
    if "infiniband" not in config.sampling.enabled or ib.perfquery == "off" or ib.state_file:
        return
    log.info(
        "infiniband: no --infiniband.state-file: nothing the PMA counters carry is kept across "
        "a restart, so a restart can show as a counter reset%s",
        " (always, for counters --infiniband.reset-saturated cleared)"
        if ib.reset_saturated
        else "",
    )


def _say_memory_plan(limit: int, samplers: Iterable[str]) -> None:
    """Log how ``--agent.memory-limit`` is divided between the children's memory ceilings
    and the main process: a warning when it is too small to hold them (also exported as
    ``fabricscope_agent_memory_overcommit_bytes``)."""
    from agent.core.ceiling import plan, running_children

    division = plan(limit, running_children(samplers))
    (log.warning if division.over else log.info)("%s", division.summary())


def _exit_past_abandoned_passes() -> None:
    """A ``--once`` pass the runner gave up on still runs in its thread, perhaps inside C
    code (RE2, a vendor library) that aborts the interpreter as it finalises: once the
    output is written and everything cleaned up, exit without finalising."""
    import threading

    if any(t.name.startswith("sample-") and t.is_alive() for t in threading.enumerate()):
        sys.stderr.flush()
        os._exit(0)


def _warn_unread_once(app: AgentApp, timeout: float) -> None:
    """``--once`` reads the throughput logs whole; when that did not finish within the
    sampling timeout the exposition holds no throughput series: say so on stderr."""
    if "throughput" not in app.runner.names:
        return
    status = app.runner.status("throughput")
    if status.snapshot is None and status.error_count("timeout"):
        print(
            f"fabricscope: warning: the throughput logs were not read whole within "
            f"--sampling.timeout ({timeout:g}s): no throughput series printed; raise it",
            file=sys.stderr,
        )


def _serve(app: AgentApp, ns: argparse.Namespace) -> int:
    # imported here: `topo` and `--once` need no server
    import signal
    import threading
    import time

    from agent.core.allocator import freeze_startup
    from exporter.http.limits import ConnectionLimits
    from exporter.http.server import serve, serve_health
    from exporter.http.webconfig import load_web_config
    from exporter.metrics.httpstats import HEALTH_OWNER

    web_config = load_web_config(ns.web_config) if ns.web_config else None
    limits = ConnectionLimits(
        max_requests=ns.max_requests,
        max_connections=ns.max_connections,
        max_per_address=ns.max_per_address,
        header_timeout=ns.header_timeout,
        idle_timeout=ns.idle_timeout,
    )
    server = serve(app.cache, ns.listen, web_config=web_config, ready=app.ready, limits=limits)
    try:
        health = (
            serve_health(
                ns.health_listen,
                app.ready,
                limits=limits,
                publish=lambda data: app.cache.set_fragment(HEALTH_OWNER, data),
            )
            if ns.health_listen
            else None
        )
    except ConfigError:
        server.shutdown()
        raise
    log.info(
        "fabricscope %s listening on %s (samplers: %s; TLS %s, basic auth %s)",
        __version__,
        server.address,
        ", ".join(app.runner.names) or "none",
        "on" if web_config and web_config.tls else "off",
        "on" if web_config and web_config.basic_auth_users else "off",
    )
    # Scrapes are served from cached bytes in a few hundred microseconds, but a request
    # thread waiting for the GIL waits up to the switch interval (5 ms by default): that wait
    # is the scrape latency tail. 1 ms keeps it short at negligible cost.
    sys.setswitchinterval(0.001)
    stop = threading.Event()

    def _handle(signum: int, _frame: object) -> None:
        log.info("received signal %d, shutting down", signum)
        stop.set()

    def _hangup(_signum: int, _frame: object) -> None:
        log.info(
            "received SIGHUP: ignored (TLS files are re-read when they change, pods on every "
            "pass; a changed flag or web config user needs a restart)"
        )

    signal.signal(signal.SIGTERM, _handle)
    signal.signal(signal.SIGINT, _handle)
    signal.signal(signal.SIGHUP, _hangup)
    app.runner.start()
    # once every sampler has made its first pass (or a minute on), what start-up built is
    # the agent's for good: frozen, so that a collection after each pass walks only what the
    # passes made (agent.core.runner)
    settle = time.monotonic() + 60
    while not stop.is_set() and not app.ready() and time.monotonic() < settle:
        stop.wait(0.5)
    if not stop.is_set():
        freeze_startup()
    stop.wait()
    server.shutdown()
    if health is not None:
        health.shutdown()
    app.runner.stop()
    return 0
