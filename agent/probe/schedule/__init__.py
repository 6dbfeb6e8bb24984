"""Who probes whom, and when: membership and the coordinator-free pairing schedule.

- ``circle``       the round-robin (circle method) schedule every agent computes alike from
                   the sorted member list.
- ``localise``     bad-node / bad-link localisation from the probes' shared outcomes.
- ``pairing``      the schedule that also localises: suspects meet good referees, failing
                   pairs are retested.
- ``plan``         the simulation behind ``fabricscope probe plan``.
- ``membership``   membership sources: a fixed list, a peers file re-read on change.
- ``k8s_members``  membership from the Kubernetes API: the Ready pods of the agent's
                   DaemonSet.

May import: :mod:`agent.core`, :mod:`agent.config` and, as a declared join,
:mod:`agent.kubernetes` (the agent pods as members). Nothing else of the probe.
"""
