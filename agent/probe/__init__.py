"""The NCCL probe: active bus-bandwidth measurements between GPUs and between node pairs.

Parts (each its own module; the resident agent never imports torch):

- ``records``   the JSON record a worker prints per measurement, and its parser (pure).
- ``formulas``  nccl-tests' algbw/busbw formulas (pure).
- ``timing``    adaptive timing of one message size (pure).
- ``worker``    the subprocess program (``python -m agent.probe.worker``): torch.distributed,
                NCCL on GPUs, gloo on CPU; prints one JSON record per line on stdout.
- ``schedule``  the coordinator-free pairing schedule (circle method) and fault localisation.
- ``plan``      the simulation behind ``fabricscope probe plan`` (rounds, wall time, when a
                fault is localised).
- ``rendezvous_*`` peer authentication (shared secret) and the offer/answer before any
                worker starts: ``rendezvous_wire`` (framing, proofs, errors; the protocol),
                ``rendezvous_messages`` (Offer, Answer), ``rendezvous_server`` (the host's
                listener), ``rendezvous_client`` (the guest's ``propose``), ``secret``
                (the secret file).
- ``membership`` / ``k8s_members``  who probes whom: a peers file, or the agent pods.
- ``launch``    one worker process per rank, a deadline, process-group kills, rank records
                (used by the service, ``fabricscope probe`` and ``launch.run_local``).
- ``service``   the agent side: runs probes on a schedule with hard timeouts and answers
                peers' offers, from its parts: ``devices`` (which devices, busy checks,
                locks), ``budget`` (GPU time), ``specs`` (the ranks' worker specs),
                ``guest`` (one offer and its run), ``addresses`` (peer addresses, probe
                ids), ``results`` (the latest result per (kind, peer, GPU pair, size), aged
                out, and the counters).
- ``sampler``   the ``probe`` sampler (reports the service's results) and its wiring from
                the ``--probe.*`` settings.
- ``matrix`` / ``heatmap``  ``fabricscope probe --matrix``: every GPU pair, CSV and PNG.

May import: :mod:`agent.core`, :mod:`agent.config` and, as declared joins,
:mod:`agent.kubernetes` (agent pods as peers) and :mod:`agent.nvml` (busy-GPU checks).

Record schema (one JSON object per line on the worker's stdout; ``records.py`` is the
authority, this is the summary):

    {"schema": "fabricscope-probe/1", "kind": "all_reduce" | "sendrecv" | "latency",
     "backend": "nccl" | "gloo", "world_size": 2, "ranks": [[host, device], ...],
     "peer": "" | "<host>", "src": "<host>:<device>", "dst": "<host>:<device>",
     "size_bytes": 67108864, "iterations": 20, "warmup": 5,
     "time_seconds": 0.00123,            # mean per iteration
     "algbw_bytes_per_second": ..., "busbw_bytes_per_second": ...,
     "correct": true | false | null,     # null: no result was checked (a failure)
     "error": null | {"reason": "...", "detail": "..."}}

Exactly one record per message size, in the spec's order, whatever happens. Failures are
records with ``null`` numbers; ``correct: false`` goes with reason ``wrong_result`` (a
wrong sum or wrong received bytes: silent data corruption). ``kind: "latency"`` is an
8-byte all_reduce: ``time_seconds`` is the latency, the bandwidths are ``null``. ``ranks``
is ``[]`` when the process group never formed; device is ``null`` on CPU (gloo).

Failure reasons (metric label ``reason``): ``timeout``, ``init_failure``,
``peer_unreachable``, ``auth_failure``, ``wrong_result``, ``gpu_busy``, ``crashed``.
"""
