"""The machinery every source shares, and nothing source-specific.

Owns: the sampler protocol (``sampler``), the runner that schedules, times out and counts
every sampler (``runner``), supervised child processes for risky work (``isolation``, the
child's side ``childproc``, the pipe between them ``frames``; the C allocator: ``allocator``), the
rooted sysfs seam and its issues-as-data (``sysfs``), one bounded run of an external tool
(``tools``), the error vocabulary (``errors``), the findings registry every source's
findings are declared in (``findings``), logging set-up (``logsetup``), and the key per-client
limits count a network peer by (``clientaddr``).

May import: the standard library and third-party libraries only; never a source package
(``agent.infiniband``, ``agent.nvml`` ...), the composition above them, or ``exporter``.
"""
