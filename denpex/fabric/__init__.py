"""Layer 3: the training fabric: InfiniBand/RoCE ports, PFC and congestion, NCCL topology,
GPUDirect prerequisites, and clients of fabric managers (UFM, gNMI)."""
