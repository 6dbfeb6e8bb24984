"""Tests of agent/core/ (the runner, the findings registry)."""
