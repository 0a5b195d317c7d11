"""The NVIDIA UFM collector family: the collector and its REST client (collector.py), and
what it makes of UFM's answers (detect.py)."""
