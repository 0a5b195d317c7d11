"""Benchmark: `denpex run` pass-through of a command writing a large log, against cat/script.

Measures, in the same run, the median of N runs of each pipeline and prints JSON with MB/s and
the ratios to the baselines (targets: pipes >= 0.9x a cat relay, PTY >= 1.0x script(1)).
It must never report a number it did not measure in this run.

Two rates per pipeline: `passthrough` (bytes / time from the first to the last byte reaching
the final reader: what the wrapper does to a job's output) and `wall` (start of the pipeline
to its end, including denpex's start-up, the analysis backlog and the report). Beside each
denpex ratio, `read_fraction`: the share of the output the analysis actually read (the
report's `dropped_analysis_bytes` is what it skipped to keep up; `spilled_analysis_bytes`, what
it read late from the spill file). `--paced-mb-s` adds a job
printing at that rate (default 200 MB/s), whose analysis must drop nothing.

Runs the denpex of the interpreter that runs it (`pip install .` into a venv, as a user
would); it never puts the source tree on the path.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The final reader of every pipeline: records when the first and the last byte arrived.
SINK = r"""
import json, os, sys, time
buf = bytearray(1 << 20)
n, first, last = 0, None, None
while True:
    k = os.readv(0, [buf])
    if not k:
        break
    last = time.monotonic()
    first = last if first is None else first
    n += k
json.dump({"bytes": n, "first": first, "last": last}, open(sys.argv[1], "w"))
"""

# A job printing a file at a fixed rate (MB/s), in 1 MiB writes on a steady schedule.
PACER = r"""
import os, sys, time
path, rate = sys.argv[1], float(sys.argv[2]) * 1e6
start, sent = time.monotonic(), 0
with open(path, "rb") as f:
    while chunk := f.read(1 << 20):
        ahead = start + sent / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
        view = memoryview(chunk)
        while view:
            view = view[os.write(1, view):]
        sent += len(chunk)
"""


def make_log(path: Path, size: int, seed: int = 1) -> None:
    """Training-log-like text: rank-prefixed step lines, NCCL chatter, progress bars with CR."""
    rnd = random.Random(seed)
    lines = []
    for step in range(100_000):
        k = rnd.random()
        if k < 0.7:
            lines.append(
                f"[rank{rnd.randrange(8)}]:[2026-11-30 05:{rnd.randrange(60):02d}:"
                f"{rnd.randrange(60):02d},{rnd.randrange(1000):03d}] INFO train.py:412 "
                f"step {step}/100000 loss={rnd.uniform(1, 4):.4f} lr=3.0e-04 "
                f"grad_norm={rnd.uniform(0, 3):.3f} tokens/s={rnd.randrange(100000, 200000)}\n"
            )
        elif k < 0.85:
            lines.append(
                f"node{rnd.randrange(16)}:{rnd.randrange(9999)}:{rnd.randrange(9999)} "
                f"[{rnd.randrange(8)}] NCCL INFO Channel {rnd.randrange(32):02d}/0 : "
                f"{rnd.randrange(8)}[{rnd.randrange(8)}] -> {rnd.randrange(8)}[0] via P2P/IPC\n"
            )
        else:
            bar = "#" * rnd.randrange(40)
            lines.append(f"Epoch {rnd.randrange(10)}: {rnd.randrange(100)}%|{bar:<40}| ")
            lines.append(f"{rnd.randrange(5000)}/5000 [00:12<00:34, {rnd.uniform(1, 9):.2f}it/s]\r")
    block = "".join(lines).encode()
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        left = size
        while left > 0:
            f.write(block[:left])
            left -= len(block)
    tmp.rename(path)


def timed(pipeline: str, sink_out: Path, env: dict[str, str]) -> dict[str, float]:
    start = time.monotonic()
    subprocess.run(["bash", "-c", f"set -o pipefail; {pipeline}"], check=True, env=env)
    wall = time.monotonic() - start
    got = json.loads(sink_out.read_text())
    return {"bytes": got["bytes"], "passthrough_s": got["last"] - got["first"], "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the log file lives")
    parser.add_argument("--skip-pty", action="store_true")
    parser.add_argument("--paced-mb-s", type=float, default=200.0, help="0: no paced job")
    args = parser.parse_args()

    size = args.size_mb << 20
    log = Path(args.dir) / f"denpex-bench-passthrough-{args.size_mb}mb.log"
    if not log.exists() or log.stat().st_size != size:
        make_log(log, size)
    work = Path(tempfile.mkdtemp(prefix="denpex-bench-"))
    env = dict(os.environ)
    py = shlex.quote(sys.executable)
    f = shlex.quote(str(log))
    sink_py = work / "sink.py"
    sink_py.write_text(SINK)
    out, report = work / "sink.json", work / "report.json"
    sink = f"{py} {sink_py} {out}"
    pacer_py = work / "pacer.py"
    pacer_py.write_text(PACER)

    def denpex(mode: str, analysis: bool = True, job: str = f"cat {f}") -> str:
        if not analysis:  # the wrapper alone: shows what the analysis backlog adds to wall time
            return f"{py} -m denpex run --{mode} --no-analysis -- {job}"
        return f"{py} -m denpex run --{mode} --quiet --report {report} -- {job} 2>/dev/null"

    pipelines = {
        "pipe_baseline": f"cat {f} | cat | {sink}",
        "pipe_denpex": f"{denpex('no-pty')} | {sink}",
        "pipe_denpex_no_analysis": f"{denpex('no-pty', analysis=False)} | {sink}",
    }
    if not args.skip_pty and shutil.which("script"):
        pipelines["pty_baseline"] = (
            f"script -qfec {shlex.quote('cat ' + str(log))} /dev/null | {sink}"
        )
        pipelines["pty_denpex"] = f"{denpex('pty')} | {sink}"
    if args.paced_mb_s > 0:
        paced = f"{py} {pacer_py} {f} {args.paced_mb_s}"
        pipelines["paced_pipe_denpex"] = f"{denpex('no-pty', job=paced)} | {sink}"
        if "pty_denpex" in pipelines:
            pipelines["paced_pty_denpex"] = f"{denpex('pty', job=paced)} | {sink}"
    subprocess.run(["cat", str(log)], stdout=subprocess.DEVNULL, check=True)  # warm the cache
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in pipelines}
    dropped: dict[str, list[int]] = {
        name: [] for name in pipelines if "denpex" in name and "no_analysis" not in name
    }
    spilled: dict[str, list[int]] = {name: [] for name in dropped}
    for _ in range(args.runs):  # interleaved, so drift hits every pipeline alike
        for name, pipeline in pipelines.items():
            samples[name].append(timed(pipeline, out, env))
            if name in dropped:
                stats = json.loads(report.read_text()).get("stats", {})
                dropped[name].append(stats.get("dropped_analysis_bytes", -1))
                spilled[name].append(stats.get("spilled_analysis_bytes", 0))
    result: dict[str, object] = {
        "size_mb": args.size_mb,
        "runs": args.runs,
        "denpex": f"{sys.executable} -m denpex run",
        "paced_mb_s": args.paced_mb_s,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    for name, runs in samples.items():
        mb = runs[0]["bytes"] / 1e6
        result[name] = {
            "passthrough_mb_s": round(mb / statistics.median(r["passthrough_s"] for r in runs), 1),
            "wall_mb_s": round(mb / statistics.median(r["wall_s"] for r in runs), 1),
            "wall_s": round(statistics.median(r["wall_s"] for r in runs), 3),
        }
        if name in dropped:
            lost = int(statistics.median(dropped[name]))
            result[name]["dropped_analysis_bytes"] = lost  # type: ignore[index]
            result[name]["dropped_analysis_bytes_max"] = max(dropped[name])  # type: ignore[index]
            result[name]["read_fraction"] = round(1 - lost / runs[0]["bytes"], 4)  # type: ignore[index]
            # what analysis read from the spill file, behind the job: the backlog it caught up on
            result[name]["spilled_analysis_bytes"] = int(statistics.median(spilled[name]))  # type: ignore[index]
    for kind, ours_name in (
        ("pipe", "pipe_denpex"),
        ("pty", "pty_denpex"),
        ("pipe", "pipe_denpex_no_analysis"),
    ):
        if ours_name in result:
            base, ours = result[f"{kind}_baseline"], result[ours_name]
            suffix = ours_name.removeprefix(f"{kind}_denpex")
            for metric in ("passthrough_mb_s", "wall_mb_s"):
                ratio = ours[metric] / base[metric]  # type: ignore[index]
                result[f"{kind}{suffix}_ratio_{metric.removesuffix('_mb_s')}"] = round(ratio, 3)
            if "read_fraction" in ours:  # type: ignore[operator]
                result[f"{kind}{suffix}_read_fraction"] = ours["read_fraction"]  # type: ignore[index]
    result["targets"] = {
        "pipe_ratio_passthrough": 0.9,
        "pty_ratio_passthrough": 1.0,
        "paced_dropped_analysis_bytes": 0,
    }
    result["paced_dropped_nothing"] = all(
        max(dropped[name]) == 0 for name in dropped if name.startswith("paced_")
    )
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
