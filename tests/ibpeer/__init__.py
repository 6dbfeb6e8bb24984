"""Tests of agent/ibpeer/ (the far end of each InfiniBand cable)."""
