"""The ``netdev`` source: RDMA-associated network interfaces through netlink (pyroute2) and
the ethtool ioctl (operstate, carrier changes, 64-bit stats, PFC pause, discards).

May import: :mod:`agent.core`. Nothing else of the agent.
"""
