"""Layer 2: GPU collectors (NVML through pynvml, DCGM through ctypes) and the scenario shim.

Every call into a GPU library runs under a deadline (`denpex.core.deadline`): a wedged
driver blinds one collector, never the agent.
"""
