"""Benchmark: `denpex scan` end to end against the native matcher alone, on the same bytes.

Writes bench_matcher.py's seeded training-log corpus (many failure lines among NCCL INFO,
progress bars, warnings, metrics JSON, long lines) as one log per rank (`node*/rank*.log`),
then times, in this run:
- the catalog's native matcher alone over every file's bytes (in this process, best of N);
- `denpex scan --json FILES…` in a child process, as a user runs it (start-up, catalog,
  scanning, the diagnosis and its report), with its default `--jobs` (the cores available):
  its CPU time is summed over its worker processes, its wall time is what a user waits;
- the scanning alone in this process (a session's scan of every file and its diagnosis, the
  catalog already loaded): what each byte costs once start-up is paid;
- the same command with the pure-Python twins (`DENPEX_NO_EXTENSIONS=1`) on a sample of the
  files, extrapolated per byte;
- optionally another denpex (`--baseline-python`, e.g. a venv of an older commit) on the
  same files, for a before/after in one run.
Each child is measured by wall time and by its CPU time (user + system: steadier on a shared
host). Prints JSON with MB/s (10^6 bytes per second), the ratios, the targets and the load
average before and after. It never reports a number it did not measure in this run; run it
from an installed denpex (`pip install .`), as a user would.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_matcher import make_corpus  # the same corpus, beside this file

from denpex._native import backend, load
from denpex.catalog import load_catalog, load_signatures
from denpex.lite.prefixes import hints_from_path
from denpex.lite.session import LiteSession, ReportOptions

TARGETS = {"scan_vs_matcher": 0.5, "scan_vs_pure_python": 10.0}


def write_ranks(folder: Path, buf: bytes, files: int) -> list[Path]:
    """The corpus cut at line ends into `files` logs of about equal size, 8 ranks a node."""
    paths, start = [], 0
    for rank in range(files):
        end = len(buf) if rank == files - 1 else buf.find(b"\n", len(buf) * (rank + 1) // files)
        end = len(buf) if end < 0 else end + 1
        path = folder / f"node{rank // 8}" / f"rank{rank}.log"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(buf[start:end])
        paths.append(path)
        start = end
    return paths


def run_scan(python: str, paths: list[Path], env: dict[str, str]) -> dict:
    """One `denpex scan --json` child: wall and CPU seconds, its exit status and stats. A
    scan of one line first, untimed: the catalog's kept copy (denpex.catalog.cache) is one
    per install and backend, so the command timed before may have replaced this one's, and
    a user's every start but the first finds it."""
    warm = paths[0].parent.parent / "warm.log"
    warm.write_bytes(b"NCCL WARN Cuda failure 'out of memory'\n")
    subprocess.run(
        [python, "-m", "denpex", "scan", str(warm)], capture_output=True, env=env, check=False
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(
        [python, "-m", "denpex", "scan", "--json", *map(str, paths)],
        capture_output=True,
        env=env,
        check=False,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    try:
        diagnosis = json.loads(proc.stdout) if proc.returncode in (0, 1) else None
    except ValueError:
        diagnosis = None
    if diagnosis is None:
        raise SystemExit(
            f"{python} -m denpex scan failed ({proc.returncode}, {len(proc.stdout)} bytes on "
            f"stdout): {proc.stderr.decode(errors='replace')[-2000:]}"
        )
    return {
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "root_cause": diagnosis["root_cause"]["category"],
        "stats": diagnosis["stats"],
    }


def scan_in_process(paths: list[Path]) -> dict:
    """CPU seconds of scanning `paths` and concluding, as `denpex scan` does, in-process."""
    session = LiteSession(load_catalog(), ReportOptions(text=False))
    started = time.process_time()
    for path in paths:
        host, rank = hints_from_path(str(path))
        session.scan_file(str(path), host=host, rank=rank)
    diagnosis = session.conclude(None, None).to_dict()
    cpu = time.process_time() - started
    return {"cpu_s": round(cpu, 3), "root_cause": diagnosis["root_cause"]["category"]}


def rates(nbytes: int, run: dict) -> dict:
    return {
        **run,
        "mb_s_wall": round(nbytes / 1e6 / run["wall_s"], 1),
        "mb_s_cpu": round(nbytes / 1e6 / run["cpu_s"], 1),
    }


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=1000.0, help="corpus size (10^6 bytes)")
    parser.add_argument("--files", type=int, default=16, help="rank logs to cut it into")
    parser.add_argument("--seed", type=int, default=20261130)
    parser.add_argument("--repeat", type=int, default=3, help="best of N for the matcher")
    parser.add_argument("--pure-python-files", type=int, default=1, help="files in its sample")
    parser.add_argument("--baseline-python", help="the python of another denpex install")
    args = parser.parse_args()

    load_before = load_average()
    sigs = load_signatures()
    failure_lines = [text.encode("utf-8") for s in sigs for text in s.examples_match]
    buf, corpus = make_corpus(int(args.size_mb * 1e6), args.seed, failure_lines)
    matcher = load("matcher").Matcher([s.pattern for s in sigs])
    with tempfile.TemporaryDirectory(prefix="denpex-bench-scan-") as tmp:
        paths = write_ranks(Path(tmp), buf, args.files)
        del buf
        contents = [p.read_bytes() for p in paths]
        nbytes = sum(map(len, contents))
        best = float("inf")
        for _ in range(args.repeat):
            started = time.process_time()
            pairs = sum(len(matcher.scan(data)) for data in contents)
            best = min(best, time.process_time() - started)
        del contents
        native_matcher = {
            "backend": backend("matcher"),
            "cpu_s": round(best, 3),
            "mb_s_cpu": round(nbytes / 1e6 / best, 1),
            "pairs": pairs,
        }
        print(f"matcher: {native_matcher['mb_s_cpu']} MB/s", file=sys.stderr)
        scanning = scan_in_process(paths)
        scanning["mb_s_cpu"] = round(nbytes / 1e6 / scanning["cpu_s"], 1)
        print(f"scanning alone: {scanning['mb_s_cpu']} MB/s cpu", file=sys.stderr)
        env = {k: v for k, v in os.environ.items() if k != "DENPEX_NO_EXTENSIONS"}
        scan = rates(nbytes, run_scan(sys.executable, paths, env))
        print(f"scan: {scan['mb_s_wall']} MB/s wall, {scan['mb_s_cpu']} cpu", file=sys.stderr)
        sample = paths[: args.pure_python_files]
        sample_bytes = sum(p.stat().st_size for p in sample)
        pure = rates(
            sample_bytes, run_scan(sys.executable, sample, {**env, "DENPEX_NO_EXTENSIONS": "1"})
        )
        pure["sample_bytes"] = sample_bytes
        print(f"pure python: {pure['mb_s_cpu']} MB/s cpu", file=sys.stderr)
        baseline = None
        if args.baseline_python:
            baseline = rates(nbytes, run_scan(args.baseline_python, paths, env))
            print(f"baseline: {baseline['mb_s_cpu']} MB/s cpu", file=sys.stderr)
    ratios = {
        "scan_vs_matcher": round(scan["mb_s_cpu"] / native_matcher["mb_s_cpu"], 3),
        "scan_vs_matcher_wall": round(scan["mb_s_wall"] / native_matcher["mb_s_cpu"], 3),
        "scanning_alone_vs_matcher": round(scanning["mb_s_cpu"] / native_matcher["mb_s_cpu"], 3),
        "scan_vs_pure_python": round(scan["mb_s_cpu"] / pure["mb_s_cpu"], 1),
    }
    if baseline is not None:
        ratios["scan_vs_baseline"] = round(scan["mb_s_cpu"] / baseline["mb_s_cpu"], 2)
        ratios["scan_vs_baseline_wall"] = round(scan["mb_s_wall"] / baseline["mb_s_wall"], 2)
    result = {
        "benchmark": "scan",
        "load_average": {"before": load_before, "after": load_average()},
        "cpus": os.cpu_count(),
        "corpus": {**corpus, "files": args.files},
        "native_matcher": native_matcher,
        "scan": scan,
        "scanning_alone": scanning,
        "pure_python": pure,
        "baseline": baseline,
        "ratios": ratios,
        "targets": TARGETS,
        "targets_met": {k: ratios[k] >= v for k, v in TARGETS.items()},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
