"""Tests of exporter/cli/ (the command line)."""
