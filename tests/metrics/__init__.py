"""Tests of exporter/metrics/ (the catalog and docs/metrics.md)."""
