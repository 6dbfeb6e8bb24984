"""fabricscope's tests, grouped to mirror the packages they test (``tests/probe/`` for
``agent/probe/``, ``tests/explain/`` for ``exporter/explain/`` ...); whole-agent tests and
the shared helpers (``promharness``, ``agentrun``, ``ibsim_lab``, ``explain_lab``,
``helmchart``, ``slowloris``, ``gil_hog``; the scenario lab in ``lab/``) stay at the top."""
