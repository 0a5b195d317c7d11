"""The NCCL topology family: the XML model of NCCL_TOPO_DUMP_FILE (model.py), the same model
built from sysfs (sysfs.py), the comparison with a golden profile (diff.py), and the
collector that reports differences (collector.py)."""
