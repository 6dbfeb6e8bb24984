"""NCCL's own view of a running job, asked of its RAS service: which ranks answer, which
stopped answering or are considered dead, which lag the others' collective counts, and
whether the counts still move at all (a hang).

Every process of an NCCL job (2.24 and later) runs a RAS thread; the threads watch each
other over TCP and answer clients on ``localhost:28028`` (``NCCL_RAS_ADDR``). A ``STATUS``
query gathers the state of every communicator from every process of the job, so it costs
the whole job a little: one node asks, at a bounded rate.

Owns: ``wire`` (one bounded client conversation: handshake, protocol version, deadline,
size cap), ``parse`` (a JSON answer into frozen records, pure, refusing anything out of
shape), ``track`` (what one job's answers mean across polls: counts moving, ranks behind,
the few ranks worth naming), ``addresses`` (this node's own IP addresses, so a rank's host
can be joined to the node that owns it), ``targets`` (which local GPU processes form a job,
how their RAS port is reached and whether this node is the one that asks), ``sampler`` (the
pass, run in a supervised child process: a job's answer is untrusted input).

May import: :mod:`agent.core`, :mod:`agent.config` and, as declared joins,
:mod:`agent.workload` (the GPU processes, their NCCL environment, namespace pid and pod) and
:mod:`agent.kubernetes` (a pod's job name, host network and IP from the pod watch).
"""
