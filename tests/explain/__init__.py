"""Tests of exporter/explain/ (`fabricscope explain`)."""
