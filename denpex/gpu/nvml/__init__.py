"""The NVML collector family: the collector (collector.py), its queries, detectors, Xid
event thread and table, metrics, and the fake libnvidia-ml with its scenario files."""
