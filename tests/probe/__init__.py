"""Tests of agent/probe/ (the NCCL probe) and `fabricscope probe`."""
