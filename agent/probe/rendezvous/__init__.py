"""The probe rendezvous: two nodes prove a shared secret and agree on a probe before either
starts a worker.

- ``wire``      the protocol: framing, proofs, failure kinds, a bounded channel.
- ``messages``  the guest's Offer and the host's Answer (strict JSON, validated).
- ``server``    the host's listener (port 10119): bounded, fair connection slots.
- ``client``    the guest's ``propose``.
- ``secret``    the shared secret file.

May import: :mod:`agent.core`. Nothing else of the probe or of the agent.
"""
