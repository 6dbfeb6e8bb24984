"""Every child attacked at once cannot take the agent's container to its memory limit: a real
agent under the chart's limit (``--agent.memory-limit``, deploy/helm values) with each
supervised child given its worst case at the same time (bench/bench_ceilings.py's
``run_together``): the NVML library (the stand-in, built with gcc) leaking 64 MiB a pass until
its child is ended at its ceiling, a throughput log of a 48 MiB line and 16 MiB of digit lines,
an ibpeer tool trying to allocate 400 MiB, 15 RAS jobs answering the largest answers the RAS
child reads (one the worst that decodes) beside a healthy 4-rank job.

The resident memory of the agent's whole process tree, summed every 0.1 s (shared pages
counted once per process: more than the memory cgroup charges), stays under the limit, so the
kubelet's cgroup would not OOM-kill the container; the healthy job is in every scrape; only
the leaking child is ended (at its ceiling), the tool's allocation is refused by the kernel.
Under the ceilings before they partitioned the limit (the NVML child's 192 MiB floor under
256 MiB) the same attack summed past the limit."""

from __future__ import annotations

from pathlib import Path

from bench.bench_ceilings import POD_LIMIT, run_together

MIB = 1 << 20


def test_every_child_at_its_worst_at_once_stays_within_the_pod_limit(tmp_path: Path) -> None:
    got = run_together(tmp_path, seconds=8)
    assert got["scrapes"] >= 5, got
    assert got["healthy_job_in_scrapes"] == got["scrapes"], got
    assert got["peak_tree_rss_mib"] * MIB < POD_LIMIT, got
    ended = got["ended_at_ceiling"]
    assert isinstance(ended, dict)
    assert ended["nvml"] >= 1, got  # the attack reached a ceiling
    assert ended["ras"] == ended["throughput"] == ended["ibpeer"] == 0, got
    assert got["tool_allocation_refused"] is True, got
