"""The HTTP server behind ``/metrics`` and ``/healthz``.

Owns: the server (``server``), one connection's HTTP/1.1 framing (``connection``),
connection limits (``limits``), TLS reload (``tlsreload``), basic auth (``basicauth``),
the exporter-toolkit web config (``webconfig``), listen addresses (``listen``) and what
each path answers (``site``). Its request counters render through
:mod:`exporter.metrics.httpstats`.

May import: :mod:`agent.core.errors` and :mod:`exporter.metrics` (the exposition);
never :mod:`exporter.cli`.
"""
