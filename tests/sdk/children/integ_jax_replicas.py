"""Two CPU devices hold replicated parameters; after step 2 device 1's copy is corrupted (one
flipped bit). Prints key=value lines the JAX integration test reads. Needs XLA_FLAGS with
--xla_force_host_platform_device_count=2 set by the caller."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import denpex.sdk as dx

devices = jax.devices()
assert len(devices) == 2, devices
replicated = NamedSharding(Mesh(np.array(devices), ("d",)), PartitionSpec())
params = {"w": jax.device_put(np.arange(8, dtype=np.float32), replicated)}
got: list = []
calls = {"n": 0}


def step(params):
    calls["n"] += 1
    if calls["n"] < 2:
        return params, 0.0
    copies = [np.asarray(s.data) for s in params["w"].addressable_shards]
    bad = copies[1].copy()
    bad.view(np.uint32)[3] ^= 1 << 7  # one flipped bit in device 1's copy
    arrays = [jax.device_put(copies[0], devices[0]), jax.device_put(bad, devices[1])]
    w = jax.make_array_from_single_device_arrays((8,), replicated, arrays)
    return {"w": w}, 0.0


watched = dx.jax.watch_step(step, every=1, checksum_every=1, emit=got.append, hang_floor_s=60)
params, _ = watched(params)
print(f"healthy_evidence={len(got)}")
params, _ = watched(params)
watched.close()
sdc = [e for e in got if getattr(e, "category", None) == "train.sdc"]
print(f"signature={sdc[0].signature}")
print(f"devices={sdc[0].captures['devices']}")
print(f"step={sdc[0].captures['step']}")
