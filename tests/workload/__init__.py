"""Tests of agent/workload/ (process placement and NCCL settings)."""
