"""RoCE ports: PFC pause counters and storms, ECN/CNP congestion, and the port's physical and
PCIe health from `ethtool -S` (collector.py, ethtool.py, phy.py)."""
