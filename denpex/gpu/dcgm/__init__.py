"""The DCGM collector family: the collector (collector.py), the ctypes binding of libdcgm
(api.py) and the C structure layouts it needs (layouts.py)."""
