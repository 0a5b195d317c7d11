"""A small DDP job on gloo (spawned ranks) with a ProgressMonitor in every rank, for the
progress tests. One rank misbehaves as the scenario says; every rank writes the evidence its
monitor emits to OUT/evidence-<rank>.jsonl and notes times in OUT/marks-<rank>.jsonl.

Usage: progress_job.py SCENARIO OUT --port P [--world N] [--steps N] [--culprit R]
    [--straggler R] [--floor S] [--readers N]
SCENARIO: stop (the culprit SIGSTOPs itself after step 30), block (the culprit waits
forever outside any collective after step 30), healthy. --straggler R sleeps 50 ms a step.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import threading
import time
from pathlib import Path

import orjson
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from denpex.core.events import Event, Evidence
from denpex.core.wire import event_to_dict, evidence_to_dict
from denpex.sdk.progress import ProgressMonitor

MISBEHAVE_AT = 30  # the step after which the culprit hangs


def _append(path: Path, record: dict) -> None:
    with path.open("ab") as f:
        f.write(orjson.dumps(record) + b"\n")


def run_rank(rank: int, args: argparse.Namespace) -> None:
    out = Path(args.out)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    dist.init_process_group(
        "gloo", rank=rank, world_size=args.world, timeout=datetime.timedelta(seconds=60)
    )
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def emit(item: Evidence | Event) -> None:
        data = evidence_to_dict(item) if isinstance(item, Evidence) else event_to_dict(item)
        data["received_wall"] = time.time()
        _append(out / f"evidence-{rank}.jsonl", data)

    monitor = ProgressMonitor(
        rank=rank,
        world_size=args.world,
        group=None,
        emit=emit,
        host="localhost",
        options={
            "hang_floor_s": args.floor,
            "hang_startup_s": args.floor,
            "straggler_window": 10,
            "watchdog_interval_s": 0.25,
            "unresponsive_s": 2.0,
            "metric_every_s": 3600,
            "readers": args.readers,
        },
    )
    monitor.attach(model)
    data = torch.randn(16, 32)
    target = torch.randn(16, 1)
    for step in range(1, args.steps + 1):
        if rank == args.straggler:
            time.sleep(0.05)
        loss = torch.nn.functional.mse_loss(model(data), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(0.01)  # the rest of a step, equal on every rank
        monitor.on_step(step, float(loss.detach()), None)
        if rank == args.culprit and step == MISBEHAVE_AT and args.scenario in ("stop", "block"):
            _append(out / f"marks-{rank}.jsonl", {"hung_at": time.time(), "step": step})
            if args.scenario == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            threading.Event().wait()
    monitor.close()
    _append(out / f"marks-{rank}.jsonl", {"done": time.time()})
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=("stop", "block", "healthy"))
    parser.add_argument("out")
    parser.add_argument("--world", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--culprit", type=int, default=1)
    parser.add_argument("--straggler", type=int, default=-1)
    parser.add_argument("--readers", type=int, default=3)
    parser.add_argument("--floor", type=float, default=3.0)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    mp.spawn(run_rank, args=(args,), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
