"""A week of a fleet, sampled: what the alert budget counts per 1,000 node-days.

A week at 1,000 nodes at one-minute resolution is about 2.4 billion samples, more than a
benchmark can write and a Prometheus can evaluate on a development machine. Alerts only
start where something changes, so the week is cut into two-hour slots per node (84 a node)
and rendered where it matters, at the same one-minute resolution as the earlier 2-hour benchmark:

- **the fleet window**: every node over the week's first slot (with an hour of warm-up
  before it), with the background drawn at the week's rates, the fleet-wide settings
  (every node's PCIe bridges with ACS redirect on, its 32-bit counters stopped), job churn
  and the planted faults. Alerts firing at the slot's start are the week's standing alerts,
  counted once; alerts that start within the slot on a node with no event are the quiet
  sample, scaled to the week's quiet slots.
- **event windows**: every later node slot with a background event in it or in the hour
  before it (a single flap, an application XID, a reboot, a drain), rendered as a node of
  its own over that slot and the hour before, with every event of those three hours. A
  fraction ``sample`` of them is rendered; their alerts are scaled by its inverse.

An alert episode belongs to the slot it starts in, so every episode of the week is counted
once. What is not rendered is said by the report: rates between the sampled windows are
extrapolated, not measured.

The week's event rates, each with its source (``RATES``): where no public fleet figure was
found, the rate is the earlier 2-hour benchmark's, and says so.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import fleet_history as fh

SLOT = 2 * 3600.0  # one slot of a node's week
WARMUP = 3600.0  # the rules' windows reach an hour back
DAY = 86400.0


@dataclass(frozen=True, slots=True)
class Rate:
    per_1000_node_days: float
    source: str


#: the week's background, per 1,000 node-days
RATES: dict[str, Rate] = {
    "single link flaps": Rate(
        48.0,
        "model: the earlier 2-hour benchmark's one an hour in 500 nodes (no public figure for "
        "self-healing flaps found; the link failures that stopped Meta's Llama 3 405B run, "
        "35 switch or cable interruptions in 54 days on 2,048 H100 nodes, are 0.32); "
        "ByteDance acts on a network alert only when it repeats within 5 minutes because "
        "single flaps heal themselves",
    ),
    "application XIDs": Rate(
        192.0,
        "model: the earlier 2-hour benchmark's four an hour in 500 nodes (no public fleet "
        "figure found); 13 and 31 followed half the time by 45, NVIDIA's Xid catalog",
    ),
    "reboots (8 min, counters reset)": Rate(
        20.0,
        "model: 2 % of nodes a day, about five times the rate at which Meta's Llama 3 405B "
        "run lost a node (below)",
    ),
    "drains (cordoned, down 1-3 h)": Rate(
        5.0,
        "Meta's Llama 3 405B run: 466 job interruptions (419 unexpected, 47 planned "
        "maintenance) in 54 days on 16,384 H100 GPUs (2,048 nodes): 4.2 per 1,000 "
        "node-days, most of them a faulty host taken out of service (the Llama 3 paper, "
        "section 3.3.4), rounded up; kube_node_spec_unschedulable set while drained",
    ),
}
#: symbol errors, post-FEC, by port (NDR, 4e11 bits/s): ibdiagnet fails a port above 1e-12
BER_HEALTHY = (1e-16, 1e-14)  # a tenth of ports, log-uniform: 0.0014 to 1.4 errors an hour
BER_MARGINAL = 1e-13  # a hundredth of ports: passing, 144 an hour (12 in 5 minutes)
NDR_BITS = 4e11
#: the planted pause storm's port (a ConnectX-6 Dx RoCE port of the DGX tree)
STORM_NETDEV = "ens40f0np0"
#: nodes whose ConnectX-7 rails run the previous firmware release (the fixture's is
#: 28.39.1002): a rollout not finished, modelled
OLD_FW_SHARE = 0.03
OLD_RAIL_FW = "28.38.1002"
#: job churn: a 50-node job runs 12 to 48 hours, then the next starts after 10 minutes
JOB_HOURS = (12.0, 48.0)
JOB_GAP = 600.0


@dataclass(slots=True)
class Week:
    plan: fh.Plan  # the fleet window's nodes first, then the event windows
    nodes: int
    days: float
    fleet_nodes: set[str]
    #: the fleet window's nodes with a background event in the counted slot
    busy: set[str]
    #: event window node -> weight (1 / sample)
    weights: dict[str, float]
    #: counts of the week (drawn), and rendered
    events: dict[str, int]
    rendered: dict[str, int]
    quiet_slots: int  # node slots of the week after the first with no event
    job_transitions: int  # in the week
    fleet_job_transitions: int  # in the fleet window's counted slot
    background: dict[str, int] = field(default_factory=dict)


def _ber_ports(rng: random.Random, n: fh.NodePlan) -> int:
    noisy = 0
    for dev in fh.RAILS:
        r = rng.random()
        if r < 0.01:
            n.noisy_ports[dev] = BER_MARGINAL * NDR_BITS * 3600
            noisy += 1
        elif r < 0.11:
            lo, hi = BER_HEALTHY
            n.noisy_ports[dev] = lo * (hi / lo) ** rng.random() * NDR_BITS * 3600
            noisy += 1
    return noisy


def _events(rng: random.Random, nodes: int, days: float) -> list[tuple[float, int, str]]:
    """(second of the week, node, kind) for every background event of the week."""
    out = []
    span = days * DAY
    for kind, rate in RATES.items():
        per_s = rate.per_1000_node_days / 1000 * nodes / DAY
        t = rng.expovariate(per_s)
        while t < span:
            out.append((t, rng.randrange(nodes), kind))
            t += rng.expovariate(per_s)
    return sorted(out)


def _apply(n: fh.NodePlan, rng: random.Random, kind: str, at: float, step: float) -> None:
    """Event ``kind`` at ``at`` (seconds into the window) on ``n``."""
    if kind == "single link flaps":
        n.flaps.append((at, rng.choice(fh.RAILS)))
    elif kind == "application XIDs":
        gpu = str(rng.randrange(fh.GPUS))
        code = rng.choices(fh.APP_XIDS, (35, 35, 15, 15))[0]
        n.xids.append((at, gpu, code))
        if code in ("13", "31") and rng.random() < 0.5:
            n.xids.append((at + step, gpu, "45"))
    elif kind.startswith("reboots"):
        n.down.append((at, at + 8 * 60))
    else:  # a drain: cordoned, down for a firmware update, back, uncordoned
        hours = rng.uniform(1, 3) * 3600
        n.cordons.append((at, at + hours + 1200))
        n.down.append((at + 600, at + 600 + hours))


def week(
    nodes: int,
    days: float,
    step: float,
    seed: int = 35,
    *,
    sample: float = 1.0,
    job_size: int = 50,
) -> Week:
    rng = random.Random(seed)
    seconds = WARMUP + SLOT
    # the fleet window: the earlier 2-hour benchmark's fleet (its faults in the slot), with
    # the week's background in place of its own
    base = fh.plan(nodes, seconds / 3600, step, seed, job_size)
    for n in base.nodes:
        n.flaps.clear()
        n.xids = [x for x in n.xids if x[2] == "79"]  # the lost GPU's
        n.down.clear()
        n.segments = [s for s in n.segments if s[0] == 0.0 or s[1] in ("rate", "x8", "lost")]
        n.noisy_ports.clear()
    faults = {f.node for f in base.faults}
    for n in base.nodes:  # the agents' uptime: since a reboot some time in the last week
        n.agent_age = rng.uniform(0, days * DAY)
    by_index = dict(enumerate(base.nodes))
    noisy = sum(_ber_ports(rng, n) for n in base.nodes)
    # a planted hung rank: one rank of a job stops in a collective, every rank of the job
    # waits on it (their logs stop, their pods keep their GPUs)
    jobs = sorted({n.job for n in base.nodes})
    fault_jobs = {n.job for n in base.nodes if n.name in faults}
    hung_job = rng.choice([j for j in jobs if j not in fault_jobs])
    hung_nodes = [n for n in base.nodes if n.job == hung_job]
    hung_at = base.faults[-1].at + 300
    for n in hung_nodes:
        n.hung_at = hung_at
    # RAS, asked by the job's rank-0 node, names the stopped rank: GPU 3 of its last node
    hung_nodes[0].hung_rank = ((len(hung_nodes) - 1) * fh.GPUS + 3, 3)
    base.faults.append(
        fh.Fault("hung_rank", hung_nodes[0].name, (), hung_at,
                 f"a rank of {hung_job} stopped in a collective: NCCL's RAS calls it "
                 "unresponsive, every rank's log stops")
    )  # fmt: skip
    # a node's congestion: its host stops draining a RoCE port's receive queues, the NIC
    # sends PFC pause frames until its pause storm prevention stops it
    busy_nodes = faults | {n.name for n in hung_nodes} | {base.nodes[1].name}
    storm = rng.choice([n for n in base.nodes if n.name not in busy_nodes])
    storm.pause_storm = (hung_at + 300, STORM_NETDEV)
    base.faults.append(
        fh.Fault("congestion", storm.name, (("netdev", STORM_NETDEV),), hung_at + 300,
                 f"{STORM_NETDEV} sends PFC pause frames without end (a host that stopped "
                 "draining): the NIC's pause storm prevention stops it")
    )  # fmt: skip
    faults.add(storm.name)
    # a fleet-wide setting: a few nodes' compute rails run the previous firmware release
    old_fw = rng.sample(
        [n for n in base.nodes if n.name not in faults], max(1, round(OLD_FW_SHARE * nodes))
    )
    for n in old_fw:
        n.rail_fw = OLD_RAIL_FW
    # job churn: jobs run 12 to 48 hours, so the week has days * 24 / 30 transitions a job;
    # in the fleet window two jobs (one where the fleet has a single one) end within the
    # counted slot and the next starts after a 10-minute gap: its alerts, per transition,
    # are scaled to the week's
    per_job = round(days * DAY / (sum(JOB_HOURS) / 2 * 3600))
    job_transitions = per_job * len(jobs)
    churn = [j for j in jobs if j not in fault_jobs and j != hung_job][:2]
    for j in churn:
        end = WARMUP + rng.uniform(0, SLOT - 3 * JOB_GAP)
        for n in base.nodes:
            if n.job == j:
                n.job_gone = end
                n.next_job = (end + JOB_GAP, f"{j}-next", f"{n.pod}-next")
    fleet_transitions = len(churn)
    # NVLink bypass: the first churned job's successor starts on one node with its ranks in
    # containers that cannot share GPU memory: NCCL joins its NVLinked GPUs over SHM
    if churn:
        bypass = next(n for n in base.nodes if n.job == churn[0] and n.next_job)
        assert bypass.next_job is not None
        bypass.nvlink_bypassed = True
        at, next_job, _ = bypass.next_job
        base.faults.append(
            fh.Fault("nvlink_bypass", bypass.name, (("job_name", next_job),), at,
                     f"{next_job} starts with its NVLinked GPUs joined over SHM, not P2P")
        )  # fmt: skip
    events = _events(rng, nodes, days)
    drawn: dict[str, int] = {}
    for _, _, kind in events:
        drawn[kind] = drawn.get(kind, 0) + 1
    busy: set[str] = set()
    # events of the week's first slot (and its warm-up hour, at negative week time: none)
    for t, i, kind in events:
        if t < SLOT and by_index[i].name not in faults:
            _apply(by_index[i], rng, kind, WARMUP + t, step)
            busy.add(by_index[i].name)
    # event windows: the later slots with an event in them or in the hour before
    slots: dict[tuple[int, int], list[tuple[float, str]]] = {}
    for t, i, kind in events:
        for s in {int(t // SLOT), int((t + WARMUP) // SLOT)}:
            if 1 <= s < int(days * DAY // SLOT):
                slots.setdefault((i, s), []).append((t, kind))
    total_slots = nodes * (int(days * DAY // SLOT) - 1)
    windows: list[fh.NodePlan] = []
    weights: dict[str, float] = {}
    rendered: dict[str, int] = {}
    for (i, s), evs in sorted(slots.items()):
        if rng.random() >= sample:
            continue
        src = by_index[i]
        w = fh.NodePlan(f"w{s:03d}-{src.name}", [(0.0, src.segments[0][1])])
        w.noisy_ports = dict(src.noisy_ports)
        w.rail_fw = src.rail_fw
        w.agent_age = src.agent_age + s * SLOT - WARMUP
        for t, kind in evs:
            at = t - (s * SLOT - WARMUP)
            _apply(w, rng, kind, at, step)
            if at >= WARMUP:
                rendered[kind] = rendered.get(kind, 0) + 1
        if w.down and w.segments[0][1].startswith("saturated"):
            w.segments.append((min(b for _, b in w.down), "healthy"))  # reset by the reboot
        windows.append(w)
        weights[w.name] = 1 / sample
    background = {
        "nodes": nodes,
        "node-days": round(nodes * days),
        "nodes with saturated 32-bit counters": sum(
            1 for n in base.nodes if n.segments[0][1].startswith("saturated")
        ),
        "nodes with ACS redirect on every PCIe switch port (a BIOS default)": nodes,
        f"nodes whose compute rails run firmware {OLD_RAIL_FW}": len(old_fw),
        "ports counting symbol errors at a BER of 1e-16 to 1e-13": noisy,
        **{f"{k} in the week": v for k, v in sorted(drawn.items())},
        f"job transitions in the week ({job_size}-node jobs of 12-48 h)": job_transitions,
        "event windows rendered": len(windows),
    }
    plan = fh.Plan(base.nodes + windows, base.faults, seconds, step, background)
    return Week(
        plan,
        nodes,
        days,
        {n.name for n in base.nodes},
        busy,
        weights,
        drawn,
        rendered,
        total_slots - len(slots),
        job_transitions,
        fleet_transitions,
        background,
    )
