"""A small training run with every dx.watch() feature on, for a venv that holds torch and
denpex and nothing else (no numpy, no xxhash): prints one JSON summary line of what the SDK
did; any SDK failure or lost coverage shows in it.

Usage: minimal_sdk_job.py OUT_DIR
"""

from __future__ import annotations

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

import denpex._native as native
import denpex.sdk as dx


def main() -> int:
    out = sys.argv[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("PORT", "29531"))
    dist.init_process_group("gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    got: list = []
    guard = dx.watch(
        model,
        optimizer,
        every=2,
        canary_batch=torch.randn(4, 8),
        canary_every=4,
        replicas="always",  # one gather even in a group of one: the collective path runs
        checksum_optimizer=True,
        emit=got.append,
        hang_floor_s=60,
    )
    for _ in range(12):
        x = torch.randn(16, 8)
        loss = (model(x) - x.sum(1, keepdim=True)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        guard.step(loss=loss)
    with torch.no_grad():  # a write outside the optimizer: weight integrity must see it
        model[0].weight.view(-1).view(torch.int32)[0] ^= 1 << 22
    guard.step(loss=1.0)
    x = torch.randn(16, 8)
    loss = model(x).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    guard.step(loss=loss)
    guard.close()
    path = os.path.join(out, "ckpt.pt")
    dx.save(model.state_dict(), path)
    restored = dx.load(path)
    with open(path, "r+b") as handle:  # one flipped byte: the sidecar must refuse it
        handle.seek(100)
        byte = handle.read(1)
        handle.seek(100)
        handle.write(bytes([byte[0] ^ 0xFF]))
    try:
        dx.load(path)
        refused = False
    except dx.CheckpointCorrupt:
        refused = True
    dist.destroy_process_group()
    summary = {
        "backend": native.backend("checksum"),
        "numpy": "numpy" in sys.modules,
        "xxhash": "xxhash" in sys.modules,
        "errors": guard.errors,
        "disabled": sorted(guard.disabled),
        "evidence": sorted({getattr(e, "signature", "") for e in got} - {""}),
        "events": sorted({e.body for e in got if not hasattr(e, "signature")}),
        "restored": sorted(restored),
        "corrupt_refused": refused,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
