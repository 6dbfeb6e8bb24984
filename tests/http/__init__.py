"""Tests of exporter/http/ (the /metrics server, its limits, TLS and basic auth)."""
