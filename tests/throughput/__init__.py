"""Tests of agent/throughput/ (training throughput and NCCL's lines from logs)."""
