"""The PromQL template pieces the check table is built from (InfiniBand counters, the switch
end of a cable, per-GPU sums, NCCL's per-pod series, NCCL's RAS ranks). Templates keep
``{sel}``, ``{d}`` and ``{peers}`` for :meth:`~exporter.explain.checks.check.Check.expr`."""

from __future__ import annotations


def ib_rate(counter: str) -> str:
    return f"rate(fabricscope_infiniband_port_{counter}_total{{{{{{sel}}}}}}[{{d}}])"


def peer_rate(counter: str) -> str:
    """The switch end of a port's cable (the ibpeer sampler), per local port: a cable moved
    within the period has two far ends; the worse counts. Below full detail a healthy
    cable's counter is not exported until it counts: 0 then, for every port whose far end
    is known."""
    return (
        "max by (instance, device, port) "
        f"(rate(fabricscope_infiniband_peer_port_{counter}_total{{{{{{sel}}}}}}[{{d}}])) "
        "or 0 * max by (instance, device, port) "
        "(last_over_time(fabricscope_infiniband_peer_info{{{sel}}}[{d}]))"
    )


def per_gpu(fn: str, metric: str, per_link: str) -> str:
    """``fn`` of a per-GPU series summed per GPU, or of the per-link series older agents
    exported in its place."""
    return " or ".join(
        f"sum by (instance, gpu) ({fn}({m}{{{{{{sel}}}}}}[{{d}}]))" for m in (metric, per_link)
    )


def ib_increase(counter: str) -> str:
    return f"increase(fabricscope_infiniband_port_{counter}_total{{{{{{sel}}}}}}[{{d}}])"


PORT = ("device", "port")

#: NCCL's network transports (agent/throughput/records.py NET_TRANSPORTS)
NCCL_NET = 'transport=~"NET/.+"'
#: a pod-scoped row: its pod, or on bare metal (no pod) the job on its node
BY_POD = "instance, namespace, pod, job_name"
ANY_HCA = 'device=~".+"'


def nccl_latest(metric: str, matchers: str, agg: str = "sum") -> str:
    """The latest value of an NCCL series in the range, per pod (``agg``: sum or count)."""
    inner = f"last_over_time(fabricscope_nccl_{metric}{{{{{{sel}},{matchers}}}}}[{{d}}])"
    if agg == "count":
        inner += " > 0"
    return f"{agg} by ({BY_POD}) ({inner})"


def or_zero(expr: str) -> str:
    """``expr``, or 0 for a pod that set up network channels but has none of these (its
    series is absent, not 0: a run that stopped using a transport renders no series for it)."""
    return f"({expr} or 0 * {nccl_latest('channels', NCCL_NET)})"


#: a pod's channel connections between NVLinked GPUs of its node: not over P2P, and all
NVLINK_BYPASS = nccl_latest("nvlink_peer_channels", 'transport!~"P2P/.*"')
NVLINK_ALL = nccl_latest("nvlink_peer_channels", 'transport=~".+"')


def nccl_share(matchers: str) -> str:
    """The share of a pod's network channel connections that match ``matchers``."""
    return f"{or_zero(nccl_latest('channels', matchers))} / {nccl_latest('channels', NCCL_NET)}"


#: a rank NCCL's RAS service names (exported by the node that asks the job), moved to the node
#: that owns the rank's host address (its own fabricscope_nccl_ras_node_address_info), per GPU:
#: 1 when named unresponsive, dead or lagging in the range
RAS_RANK = (
    "max by (instance, gpu) ("
    "max by (host, gpu) (max_over_time(fabricscope_nccl_ras_rank_info{{{sel},"
    'state=~"unresponsive|dead|lagging"}}[{d}]))'
    " * on (host) group_left (instance) "
    "topk by (host) (1, max by (instance, host) ("
    "max_over_time(fabricscope_nccl_ras_node_address_info{{{sel}}}[{d}]))))"
)
