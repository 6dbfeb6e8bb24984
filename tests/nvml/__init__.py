"""Tests of agent/nvml/ (the NVML sampler, its recordings and its isolation)."""
