"""The NCCL probe: active bus-bandwidth measurements between GPUs and between node pairs.

Parts, one sub-package per job (each opens with what it owns and may import; imports run
downwards: ``run`` uses ``measure``, ``rendezvous`` and ``schedule``; those three and
``render`` use no other part of the probe); the resident agent never imports torch:

- ``measure/``     the worker program (``python -m agent.probe.measure.worker``) and its
                   contract: ``records`` (spec and record, pure), ``formulas``, ``timing``,
                   ``nccl``, ``collectives``, ``worker``, ``launch``.
- ``rendezvous/``  peer authentication (shared secret) and the offer/answer before any
                   worker starts: ``wire``, ``messages``, ``server``, ``client``, ``secret``.
- ``schedule/``    who probes whom and when: ``circle`` (the circle method), ``localise``
                   (bad node / bad link), ``pairing`` (the schedule that localises),
                   ``plan`` (``fabricscope probe plan``), ``membership``, ``k8s_members``.
- ``run/``         running probes on this node: ``service`` (the resident service),
                   ``devices``, ``budget``, ``specs``, ``guest``, ``addresses``, ``results``.
- ``render/``      ``fabricscope probe --matrix``: ``matrix`` and ``heatmap``.
- ``sampler``      the ``probe`` sampler (reports the service's results) and its wiring from
                   the ``--probe.*`` settings: the composition of the parts.

May import: :mod:`agent.core`, :mod:`agent.config` and, as declared joins,
:mod:`agent.kubernetes` (agent pods as peers) and :mod:`agent.nvml` (busy-GPU checks).

Record schema (one JSON object per line on the worker's stdout; ``measure/records.py`` is
the authority, this is the summary):

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
