"""Benchmark: training step time with and without `dx.watch()`, in the same run (DESIGN §10:
<= 2 % overhead at default settings on a CPU model), and the cost of each feature on its own.

Two identical models train side by side, one step each in turn (the order alternating every
pair), one of them watched. Interleaving single steps makes load from other processes hit both
alike, which blocks of steps do not on a shared machine. A round runs every configuration
twice, each model watched once, so a difference between the two models cancels (geometric
mean of the two phases); configurations take turns inside a round, so a change of load over
the run reaches all of them. Steps are grouped in chunks that hold each sampled step exactly
once (norms and checksums every 50 steps, the canary every 200); a phase's ratio is the median
over its chunks, so a chunk hit by another process does not decide it. The result is the
median over rounds, with their range. Two clocks: the training thread's wall time per step
(what the loop feels) and CPU time, where the SDK's own threads (the progress watchdog) are
added to the watched side. `no_sdk` watches neither model: what the method reads when there is
nothing to find. Prints JSON; it never reports a number it did not measure.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import threading
import time
from typing import Any

TARGET_DEFAULT_OVERHEAD = 0.02
NEVER = 10**9  # an interval no benchmark reaches: the feature is off

# every feature of watch() off
OFF: dict[str, Any] = {
    "every": NEVER,
    "nan_scan": "off",
    "checksum_every": NEVER,
    "weight_integrity": False,
    "replicas": False,
    "progress": False,
}
HEALTH = {"every": 50, "nan_scan": "auto"}
# each configuration's options for watch(); "defaults" is what a user gets with no options
CONFIGS: dict[str, dict[str, Any] | None] = {
    "defaults": {},
    # no SDK on either model: what the measurement reads when there is nothing to measure
    "no_sdk": None,
    # watch() with every feature off: the cost of the guard itself
    "nothing": OFF,
    "health_only": {**OFF, **HEALTH},
    "checksums_only": {**OFF, "checksum_every": 50, "weight_integrity": True},
    "replicas_only": {**OFF, "checksum_every": 50, "replicas": "always"},
    "progress_only": {**OFF, "progress": True},
    "canary_only": {**OFF, "canary_every": 200},
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


def timed_step(model: Any, optimizer: Any, batch: Any, guard: Any) -> tuple[float, float]:
    """One training step (and `guard.step`, when given): (thread CPU seconds, wall seconds)."""
    x, y = batch
    cpu, wall = time.thread_time(), time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    optimizer.step()
    if guard is not None:
        guard.step(loss)
    return time.thread_time() - cpu, time.perf_counter() - wall


def sdk_threads_cpu() -> dict[int, float]:
    """CPU seconds used so far by each of the SDK's own threads, by thread id."""
    found = {}
    for thread in threading.enumerate():
        if thread.name.startswith("denpex") and thread.ident is not None:
            try:
                clock = time.pthread_getcpuclockid(thread.ident)
                found[thread.ident] = time.clock_gettime(clock)
            except OSError:  # it ended meanwhile
                pass
    return found


def chunk_of(guard: Any) -> int:
    """Steps holding each of the guard's sampled steps exactly once (at least 50 steps: one
    step alone is too short a sample to compare)."""
    chunk = 50
    if guard is None:
        return chunk
    for interval in (guard.every, guard.checksum_every, guard.canary_every):
        if interval < NEVER and (interval != guard.canary_every or guard.canary is not None):
            chunk = math.lcm(chunk, interval)
    return chunk


def run_phase(
    pair: list[tuple[Any, Any]], watched: int, batches: list, options: dict | None, steps: int
) -> dict[str, Any]:
    """Train both models in turn, `watched` of them under dx.watch(options) (options None: no
    SDK on either, the benchmark's own bias); per-chunk (unwatched, watched) time sums."""
    import denpex.sdk as dx

    sink: list[Any] = []
    model, optimizer = pair[watched]
    guard = None if options is None else dx.watch(model, optimizer, emit=sink.append, **options)
    chunk = chunk_of(guard)
    steps = max(steps // chunk, 1) * chunk
    base_model, base_optimizer = pair[1 - watched]
    for i in range(chunk):  # warm-up: the guard's first samples and references are taken
        timed_step(base_model, base_optimizer, batches[i % len(batches)], None)
        timed_step(model, optimizer, batches[i % len(batches)], guard)
    before = sdk_threads_cpu()
    timings = []
    for i in range(steps):
        batch = batches[i % len(batches)]
        if i % 2 == 0:
            base = timed_step(base_model, base_optimizer, batch, None)
            with_sdk = timed_step(model, optimizer, batch, guard)
        else:
            with_sdk = timed_step(model, optimizer, batch, guard)
            base = timed_step(base_model, base_optimizer, batch, None)
        timings.append((base, with_sdk))
    after = sdk_threads_cpu()
    if guard is not None:
        guard.close()
    # the background threads' CPU, spread evenly over the watched steps
    extra = sum(cpu - before.get(ident, 0.0) for ident, cpu in after.items()) / steps
    chunks = []
    for start in range(0, steps, chunk):
        part = timings[start : start + chunk]
        chunks.append(
            {
                "wall": (sum(b[1] for b, _ in part), sum(w[1] for _, w in part)),
                "cpu": (sum(b[0] for b, _ in part), sum(w[0] + extra for _, w in part)),
            }
        )
    return {"chunks": chunks, "chunk": chunk, "background_cpu": extra * steps, "items": len(sink)}


def summarize(rounds: list[tuple[dict, dict]]) -> dict[str, Any]:
    """A phase's ratio is the median over its chunks; a round's is the geometric mean of its
    two phases (each model watched once: a difference between the models cancels); the
    result is the median over rounds, with the rounds' range beside it."""
    out: dict[str, Any] = {}
    phases = [phase for pair in rounds for phase in pair]
    steps = sum(len(phase["chunks"]) * phase["chunk"] for phase in phases)
    for clock in ("wall", "cpu"):

        def phase_ratio(phase: dict, clock: str = clock) -> float:
            return statistics.median(w / b for b, w in (c[clock] for c in phase["chunks"]))

        per_round = [math.sqrt(phase_ratio(a) * phase_ratio(b)) for a, b in rounds]
        base = sum(c[clock][0] for phase in phases for c in phase["chunks"])
        watched = sum(c[clock][1] for phase in phases for c in phase["chunks"])
        out[f"{clock}_step_ms_without"] = round(base / steps * 1e3, 3)
        out[f"{clock}_step_ms_with"] = round(watched / steps * 1e3, 3)
        out[f"{clock}_ratio"] = round(statistics.median(per_round), 4)
        out[f"{clock}_ratio_range"] = [round(min(per_round), 4), round(max(per_round), 4)]
    background = sum(phase["background_cpu"] for phase in phases)
    out["background_cpu_ms_per_step"] = round(background / steps * 1e3, 4)
    out["chunk_steps"] = phases[0]["chunk"]
    out["timed_step_pairs"] = steps
    out["overhead"] = round(max(out["wall_ratio"], out["cpu_ratio"]) - 1, 4)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument(
        "--steps", type=int, default=200, help="timed step pairs per phase (two per round)"
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="rounds; each runs every configuration once"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    unknown = sorted(set(args.configs.split(",")) - set(CONFIGS))
    if unknown:
        parser.error(f"unknown configuration(s) {', '.join(unknown)}; known: {', '.join(CONFIGS)}")

    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    pair = [build(args.width, args.depth, args.seed) for _ in range(2)]
    params = sum(p.numel() for p in pair[0][0].parameters())
    gen = torch.Generator().manual_seed(args.seed)
    batches = [
        (torch.randn(args.batch, args.width // 2, generator=gen), torch.randn(args.batch, 1))
        for _ in range(8)
    ]
    canary = batches[0][0][:4].clone()
    # a single-process gloo group on a TCPStore, as torchrun makes: the replica gather runs
    # through a real collective and the heartbeats through a real store
    store = dist.TCPStore("127.0.0.1", 0, world_size=1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    for i in range(20):  # warm-up of both models
        for model, optimizer in pair:
            timed_step(model, optimizer, batches[i % len(batches)], None)
    names = args.configs.split(",")
    rounds: dict[str, list[tuple[dict, dict]]] = {name: [] for name in names}
    emitted = 0
    # configurations take turns within each round, so a change in the machine's load over
    # the run reaches every one of them alike
    for round_index in range(args.rounds):
        for name in names:
            options = CONFIGS[name]
            if options is not None:
                options = dict(options)
                if name == "canary_only":
                    options["canary_batch"] = canary
            first, second = (run_phase(pair, w, batches, options, args.steps) for w in (0, 1))
            emitted += first["items"] + second["items"]
            rounds[name].append((first, second))
        print(f"# round {round_index + 1} of {args.rounds} done", flush=True)
    results = {name: summarize(rounds[name]) for name in names}
    dist.destroy_process_group()
    report: dict[str, Any] = {
        "benchmark": "sdk_step_overhead",
        "params": params,
        "torch_threads": torch.get_num_threads(),
        "steps_per_phase": args.steps,
        "rounds": args.rounds,
        "results": results,
        "emitted_items": emitted,
    }
    if "defaults" in results:
        report["target_default_overhead"] = TARGET_DEFAULT_OVERHEAD
        report["meets_target"] = results["defaults"]["overhead"] <= TARGET_DEFAULT_OVERHEAD
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
