"""The InfiniBand/RoCE port collector family: the collector (collector.py), the sysfs port
reader (ports.py) and the per-port detectors (detect.py)."""
