"""Tests of agent/pci/ (PCIe links, ACS, the GPU/NIC topology) and its renderer."""
