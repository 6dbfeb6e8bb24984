"""Tests of agent/netdev/ and its renderer."""
