"""The throughput sampler, one file per job: ``tail`` reads logs incrementally, ``formats``
parses lines (pure), ``linear`` compiles every regular expression applied to untrusted text
(RE2: linear time; a new line format uses it too), ``pods`` knows the kubelet's log layout
and the pod selection, ``sources`` finds the logs a pass reads and names their job,
``nccl`` parses NCCL's own lines (pure), ``nccl_run`` adds them up per stream in bounded
state, ``nccl_join`` joins the streams' NCCL state with the node's NUMA and NVLink map,
``stream`` keeps what one log's lines made, ``sampler`` schedules the pass and joins the
streams into a frozen :class:`~agent.throughput.records.ThroughputSnapshot` (``records``:
what a pass gives and takes), and ``child`` runs it in a supervised child process in the
agent (:mod:`agent.core.isolation`).

May import: :mod:`agent.core`, :mod:`agent.config` and, as a declared join,
:mod:`agent.kubernetes` (the pod watch that says whose logs to read)."""
