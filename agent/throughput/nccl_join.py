"""What a node's NCCL lines say, joined across the streams the throughput sampler reads: one
:class:`~agent.throughput.records.NcclSeries` per label set, with the judgements that need
more than one stream or than the lines alone (which HCA is on another NUMA node than its
GPU; which channels join two of the node's NVLinked GPUs, their ranks matched to GPUs through
any stream's ``Init START`` lines). Pure: the sampler hands it the streams' parsed state
(:class:`agent.throughput.nccl_run.NcclRun`) and the agent's NUMA map and NVLink pairs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from agent.throughput.nccl_run import NcclRun
from agent.throughput.records import WARNING_KINDS, Labels, NcclSeries


def nccl_series(
    streams: Iterable[tuple[Labels, bool, NcclRun]],
    numa: tuple[tuple[str, int], ...] | None = None,
    nvlinks: tuple[tuple[str, str, int], ...] | None = None,
) -> tuple[NcclSeries, ...]:
    """One :class:`NcclSeries` per label set whose streams printed NCCL lines (streams with
    the same labels, a restarted pod's old and new directory, add up), sorted by labels;
    each stream is (its labels, whether it is a pod's CRI log, its :class:`NcclRun`);
    ``numa`` (:attr:`ThroughputInputs.numa`) judges which HCA each GPU's channels use,
    ``nvlinks`` (:attr:`ThroughputInputs.nvlinks`) which channels join NVLinked GPUs."""
    node_of = dict(numa or ())
    merged: dict[Labels, list[NcclRun]] = {}
    ranks = RankGpus()
    for labels, cri, run in streams:
        ranks.add(run.comm_gpus, local=cri)
        if run.heard:
            merged.setdefault(labels, []).append(run)
    joined = {(a, b) for a, b, n in nvlinks or () if n > 0}
    joined |= {(b, a) for a, b in joined}
    out = []
    for labels, runs in sorted(merged.items()):
        channels: Counter[tuple[str, bool]] = Counter()
        hcas: Counter[str] = Counter()
        warnings: Counter[str] = Counter()
        ib_errors: Counter[tuple[str, str]] = Counter()
        pairs: Counter[tuple[str, str]] = Counter()
        for run in runs:
            channels.update(run.channels)
            hcas.update(run.hca_channels)
            warnings.update(run.warnings)
            ib_errors.update(run.ib_errors)
            pairs.update(run.gpu_hca_channels)
        inits = [r.last_init_ts for r in runs if r.last_init_ts is not None]
        versions = [r.version for r in runs if r.version is not None]
        out.append(
            NcclSeries(
                *labels,
                lines=sum(r.lines for r in runs),
                version=versions[-1] if versions else None,
                channels=tuple((t, g, n) for (t, g), n in sorted(channels.items())),
                hca_channels=tuple(sorted(hcas.items())),
                warnings=tuple((k, warnings.get(k, 0)) for k in WARNING_KINDS),
                ib_errors=tuple((st, v, n) for (st, v), n in sorted(ib_errors.items())),
                inits=sum(r.inits for r in runs),
                aborts=sum(r.aborts for r in runs),
                last_init_timestamp_seconds=max(inits) if inits else None,
                gpu_hca_channels=tuple((g, h, n) for (g, h), n in sorted(pairs.items())),
                hca_numa=hca_numa(pairs, node_of),
                nvlink_channels=nvlink_channels(runs, ranks, joined),
            )
        )
    return tuple(out)


class RankGpus:
    """Node-wide: the GPU and host of every (communicator, rank) whose ``Init START`` a log
    read on this node printed. A pod's log holds only processes of this node, so its ranks
    are local whatever host name their lines print (each pod has its own); a plain file
    (``--throughput.file``, a Slurm job's output may hold every node's lines) vouches for a
    pair only when both ranks' lines name the same host."""

    def __init__(self) -> None:
        self._where: dict[tuple[str, int], tuple[str, str, bool]] = {}

    def add(self, comm_gpus: Mapping[tuple[str, int], tuple[str, str]], *, local: bool) -> None:
        for key, (bus, host) in comm_gpus.items():
            if key not in self._where or local:
                self._where[key] = (bus, host, local)

    def pair(self, comm: str, a: int, b: int) -> tuple[str, str] | None:
        """The two ranks' GPU addresses when both are known to be on this node."""
        wa, wb = self._where.get((comm, a)), self._where.get((comm, b))
        if wa is None or wb is None:
            return None
        if not (wa[2] and wb[2]) and not (wa[1] and wa[1] == wb[1]):
            return None
        return wa[0], wb[0]


def nvlink_channels(
    runs: Iterable[NcclRun], ranks: RankGpus, joined: set[tuple[str, str]]
) -> tuple[tuple[str, str, str, int], ...]:
    """(GPU, peer GPU, transport, connections) of the runs' channels whose two ranks are on
    GPUs of this node joined by NVLink (``joined``, both orders), the addresses sorted within
    each pair, sorted."""
    out: Counter[tuple[str, str, str]] = Counter()
    for run in runs:
        for (comm, a, b, transport), n in run.rank_channels.items():
            pair = ranks.pair(comm, a, b)
            if pair is None or pair[0] == pair[1] or pair not in joined:
                continue
            lo, hi = sorted(pair)
            out[(lo, hi, transport)] += n
    return tuple((a, b, t, n) for (a, b, t), n in sorted(out.items()))


def hca_numa(
    pairs: Mapping[tuple[str, str], int], node_of: Mapping[str, int]
) -> tuple[tuple[str, int, int], ...]:
    """(HCA, channels judged, channels whose GPU is on another NUMA node than the HCA) for
    every HCA with a channel whose GPU and HCA NUMA nodes are both known, sorted by HCA."""
    judged: Counter[str] = Counter()
    off: Counter[str] = Counter()
    for (gpu, hca), n in pairs.items():
        g, h = node_of.get(gpu), node_of.get(hca)
        if g is None or h is None:
            continue
        judged[hca] += n
        if g != h:
            off[hca] += n
    return tuple((hca, n, off.get(hca, 0)) for hca, n in sorted(judged.items()))
