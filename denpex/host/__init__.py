"""Layer 1: host collectors, one module per source (DESIGN §2, §8), and the eBPF loader.

Each collector turns what one source says (kernel log, PSI, cgroups, procfs, sysfs, eBPF)
into Events, or Evidence where a detector recognises a fault. Collectors never export,
spool or schedule: the agent (`denpex.agent`) does that.
"""
