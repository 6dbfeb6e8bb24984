"""Tests of agent/kubernetes/ (pod attribution, cgroups, pod-resources)."""
