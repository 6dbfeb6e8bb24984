"""Tests of agent/ras/ (the NCCL RAS client: hang detection)."""
