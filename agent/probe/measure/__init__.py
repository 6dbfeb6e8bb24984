"""The probe's measurement: the worker program and its contract.

- ``records``      the spec a worker is started with and the record it prints per message
                   size, and their parsers (pure; the contract the rest of the probe reads).
- ``formulas``     nccl-tests' algbw/busbw formulas (pure).
- ``timing``       adaptive timing of one message size (pure).
- ``nccl``         NCCL called directly, through ctypes, on torch's communicator.
- ``collectives``  one message size measured in the worker: allocate, check, time.
- ``worker``       the subprocess program (``python -m agent.probe.measure.worker``):
                   torch.distributed, NCCL on GPUs, gloo on CPU; one JSON record per line.
- ``launch``       one worker process per rank, a deadline, process-group kills, rank
                   records (used by the service, ``fabricscope probe`` and ``run_local``).

Only the worker process imports torch, inside :func:`agent.probe.measure.worker.run`.

May import: :mod:`agent.core`. Nothing else of the probe or of the agent.
"""
