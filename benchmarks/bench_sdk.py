"""Benchmark: training step time with and without `dx.watch()`, in the same run (DESIGN §10:
<= 2 % overhead at default settings on a CPU model), and the cost of each feature on its own.

Blocks of steps with and without the SDK alternate (A B A B ...) on one model, so load from
other processes hits both alike; the ratio is the median of the paired block ratios, in process
CPU time (robust on a shared machine) and in wall time. Prints JSON with the ratios. It never reports a number it did not measure in this run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

TARGET_DEFAULT_OVERHEAD = 0.02
NEVER = 10**9  # an interval no benchmark reaches: the feature is off

# each configuration's options for watch(); "defaults" is what a user gets with no options
CONFIGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "health_only": {
        "checksum_every": NEVER,
        "replicas": False,
        "weight_integrity": False,
        "progress": False,
    },
    "checksums_only": {
        "every": NEVER,
        "nan_scan": "off",
        "checksum_every": 50,
        "replicas": False,
        "progress": False,
    },
    "replicas_only": {
        "every": NEVER,
        "nan_scan": "off",
        "checksum_every": 50,
        "replicas": "always",
        "weight_integrity": False,
        "progress": False,
    },
    "canary_only": {
        "every": NEVER,
        "nan_scan": "off",
        "checksum_every": NEVER,
        "weight_integrity": False,
        "replicas": False,
        "progress": False,
        "canary_every": 200,
    },
    # every feature off: what the A/B measurement itself reads as overhead (its bias)
    "nothing": {
        "every": NEVER,
        "nan_scan": "off",
        "checksum_every": NEVER,
        "weight_integrity": False,
        "replicas": False,
        "progress": False,
    },
    "progress_only": {
        "every": NEVER,
        "nan_scan": "off",
        "checksum_every": NEVER,
        "weight_integrity": False,
        "replicas": False,
    },
}


def build(width: int, depth: int, seed: int) -> tuple[Any, Any]:
    import torch
    from torch import nn

    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(width // 2, width), nn.GELU()]
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.LayerNorm(width), nn.GELU()]
    layers.append(nn.Linear(width, 1))
    model = nn.Sequential(*layers)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def run_block(
    model: Any, optimizer: Any, batches: list, steps: int, guard: Any
) -> tuple[float, float]:
    """(CPU seconds, wall seconds) per step over `steps` steps; the guard, when given, is
    stepped each time."""
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(steps):
        x, y = batches[i % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        optimizer.step()
        if guard is not None:
            guard.step(loss)
    return (time.process_time() - cpu) / steps, (time.perf_counter() - wall) / steps


def summarize(base: list[tuple[float, float]], watched: list[tuple[float, float]]) -> dict:
    out: dict[str, float] = {}
    for index, clock in enumerate(("cpu", "wall")):
        b = [pair[index] for pair in base]
        w = [pair[index] for pair in watched]
        ratio = statistics.median(y / x for x, y in zip(b, w, strict=True))
        out[f"{clock}_step_ms_without"] = round(statistics.median(b) * 1e3, 3)
        out[f"{clock}_step_ms_with"] = round(statistics.median(w) * 1e3, 3)
        out[f"{clock}_ratio"] = round(ratio, 4)
    out["overhead"] = round(out["cpu_ratio"] - 1, 4)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--block", type=int, default=50, help="steps per block (a multiple of 50)")
    parser.add_argument("--rounds", type=int, default=8, help="A/B rounds per configuration")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    import denpex.sdk as dx

    torch.set_num_threads(args.threads)
    print(f"# seed {args.seed}", flush=True)
    model, optimizer = build(args.width, args.depth, args.seed)
    params = sum(p.numel() for p in model.parameters())
    gen = torch.Generator().manual_seed(args.seed)
    batches = [
        (torch.randn(args.batch, args.width // 2, generator=gen), torch.randn(args.batch, 1))
        for _ in range(8)
    ]
    canary = batches[0][0][:4].clone()
    # a single-process gloo group, so the replica gather runs through a real collective
    store_dir = tempfile.mkdtemp()
    dist.init_process_group(
        "gloo", init_method=f"file://{os.path.join(store_dir, 'store')}", rank=0, world_size=1
    )
    sink: list[Any] = []
    run_block(model, optimizer, batches, 20, None)  # warm-up
    results: dict[str, Any] = {}
    for name in args.configs.split(","):
        options = dict(CONFIGS[name])
        if name == "canary_only":
            options["canary_batch"] = canary
        base, watched = [], []
        for _ in range(args.rounds):
            base.append(run_block(model, optimizer, batches, args.block, None))
            guard = dx.watch(model, optimizer, emit=sink.append, **options)
            watched.append(run_block(model, optimizer, batches, args.block, guard))
            guard.close()
        results[name] = summarize(base, watched)
    dist.destroy_process_group()
    report = {
        "benchmark": "sdk_step_overhead",
        "params": params,
        "torch_threads": torch.get_num_threads(),
        "block_steps": args.block,
        "rounds": args.rounds,
        "results": results,
        "emitted_items": len(sink),
    }
    if "defaults" in results:
        report["target_default_overhead"] = TARGET_DEFAULT_OVERHEAD
        report["meets_target"] = results["defaults"]["overhead"] <= TARGET_DEFAULT_OVERHEAD
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
