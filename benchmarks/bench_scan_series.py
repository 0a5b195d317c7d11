"""Benchmark: what the training-series hook (denpex.series.log_watch) adds to `denpex scan`.

Writes bench_matcher.py's seeded training-log corpus to a temporary file, then runs
`python -m denpex scan --json FILE` in child processes, alternately as shipped and with the
scanner's series hook replaced by one that reads nothing, and compares their CPU time
(user + system of the child: steadier than wall time on a shared host). Prints JSON: the
median CPU seconds of each, the median over the pairs of runs of the ratio with/without the
hook, and the overhead against the target (at most 15 % of scan time). It never reports a
number it did not measure in this run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_matcher import make_corpus  # the same corpus, beside this file

from denpex.catalog import load_signatures

TARGET_OVERHEAD = 0.15
# the child without the hook: the scanner's LogSeries swapped for one that never reads a line
WITHOUT_HOOK = r"""
import sys
import denpex.lite.scanner as scanner

class NoSeries:
    parsed_lines = 0
    def __init__(self, *args, **kwargs):
        pass
    def observe(self, *args, **kwargs):
        return []
    def finish(self, *args, **kwargs):
        return []

scanner.LogSeries = NoSeries
from denpex.cli.main import main
sys.argv = ["denpex", *sys.argv[1:]]
raise SystemExit(main())
"""


def cpu_of(argv: list[str]) -> tuple[float, float, bytes]:
    """(CPU seconds, wall seconds, stdout) of one child run to its end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1, 2):  # scan exits non-zero when it finds failures
        raise SystemExit(f"{argv[:3]} failed ({done.returncode}): {done.stderr[-2000:]!r}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, done.stdout


def matches(stdout: bytes) -> int:
    """The report's count of evidence (signature matches plus the series hook's findings)."""
    return int(json.loads(stdout)["stats"]["matches"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=50.0, help="corpus size (10^6 bytes)")
    parser.add_argument("--seed", type=int, default=20261130)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each, medians compared")
    parser.add_argument("--file", type=Path, help="scan this log instead of the corpus")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        if args.file is not None:
            path, corpus = args.file, {"bytes": args.file.stat().st_size, "file": str(args.file)}
        else:
            failure_lines = [t.encode() for s in load_signatures() for t in s.examples_match]
            buf, corpus = make_corpus(int(args.size_mb * 1e6), args.seed, failure_lines)
            path = Path(tmp) / "corpus.log"
            path.write_bytes(buf)
            del buf
        print(f"corpus: {corpus['bytes'] / 1e6:.1f} MB", file=sys.stderr)
        env_argv = [sys.executable, "-m", "denpex", "scan", "--json", str(path)]
        bare_argv = [sys.executable, "-c", WITHOUT_HOOK, "scan", "--json", str(path)]
        runs: dict[str, list[tuple[float, float]]] = {"with_hook": [], "without_hook": []}
        found: dict[str, int] = {}
        for _ in range(args.repeat):  # alternated, so that a busy moment hits both alike
            cpu, wall, out = cpu_of(env_argv)
            runs["with_hook"].append((cpu, wall))
            found["with_hook"] = matches(out)
            cpu, wall, out = cpu_of(bare_argv)
            found["without_hook"] = matches(out)
            runs["without_hook"].append((cpu, wall))
            print(f"  {runs['with_hook'][-1]} / {runs['without_hook'][-1]}", file=sys.stderr)

    cpu_with = statistics.median(c for c, _ in runs["with_hook"])
    cpu_without = statistics.median(c for c, _ in runs["without_hook"])
    # each run with the hook against the run without it right after it: a busy moment of the
    # host lands in one pair, not in one side
    ratio = statistics.median(
        w / wo for (w, _), (wo, _) in zip(runs["with_hook"], runs["without_hook"], strict=True)
    )
    print(
        json.dumps(
            {
                "corpus": corpus,
                "python": sys.version.split()[0],
                "cpus": os.cpu_count(),
                "with_hook_cpu_s": round(cpu_with, 3),
                "without_hook_cpu_s": round(cpu_without, 3),
                "with_hook_wall_s": round(statistics.median(w for _, w in runs["with_hook"]), 3),
                "without_hook_wall_s": round(
                    statistics.median(w for _, w in runs["without_hook"]), 3
                ),
                "ratio": round(ratio, 3),
                "overhead_pct": round((ratio - 1) * 100, 1),
                "target_overhead_pct": TARGET_OVERHEAD * 100,
                "within_target": ratio <= 1 + TARGET_OVERHEAD,
                "matches": found,
                "series_evidence": found["with_hook"] - found["without_hook"],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
