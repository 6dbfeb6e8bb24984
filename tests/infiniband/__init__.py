"""Tests of agent/infiniband/ (the InfiniBand sampler and link capacity)."""
