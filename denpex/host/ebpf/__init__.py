"""The eBPF collector family: the collector (collector.py), the libbpf loader (loader.py),
the ctypes mirrors of the programs' structs (layouts.py), the pids and cgroups it watches
(targets.py) and the builders of events and evidence from records (events.py)."""
