"""Benchmark: start-up of the frozen denpex (onedir, onefile, static) against `python -c pass`.

Times a fresh process of `denpex --version`, of `denpex scan` on a small log and of
`denpex run -- true` for each build, interleaved with the baseline in the same run; prints
JSON with medians, ratios and sizes (targets: onedir start <= 2x `python -c pass`, static
binary <= 25 MB).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILDS = {"onedir": "denpex/denpex", "onefile": "denpex-onefile", "static": "denpex-static"}
SMALL_LOG = ROOT / "tests" / "corpus" / "oom_watchdog_2node.log"
TARGET_ONEDIR_RATIO = 2.0
TARGET_STATIC_MB = 25.0


def size_mb(path: Path) -> float:
    if path.is_dir():
        total = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    else:
        total = path.stat().st_size
    return round(total / 1e6, 1)


def once(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False)
    return time.perf_counter() - started


def measure(commands: dict[str, list[str]], runs: int, env: dict[str, str]) -> dict[str, dict]:
    """Every command `runs` times, round-robin (so drift hits all alike); ms statistics."""
    for argv in commands.values():  # one warm-up each: page cache, not the measurement
        once(argv, env)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, argv in commands.items():
            times[name].append(once(argv, env))
    return {
        name: {
            "median_ms": round(statistics.median(t) * 1e3, 1),
            "min_ms": round(min(t) * 1e3, 1),
        }
        for name, t in times.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dist", type=Path, default=ROOT / "dist", help="build_binary.sh output")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument(
        "--python", default=sys.executable, help="the baseline interpreter (`python -c pass`)"
    )
    parser.add_argument("--log", type=Path, default=SMALL_LOG, help="the log `denpex scan` reads")
    args = parser.parse_args()

    builds = {k: args.dist / v for k, v in BUILDS.items() if (args.dist / v).exists()}
    if "onedir" not in builds:
        sys.exit(f"no {args.dist / BUILDS['onedir']}: run dist_scripts/build_binary.sh first")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("_PYI_", "STATICX_"))}
    commands: dict[str, list[str]] = {"python -c pass": [args.python, "-c", "pass"]}
    if args.python != "/usr/bin/python3" and os.access("/usr/bin/python3", os.X_OK):
        commands["/usr/bin/python3 -c pass"] = ["/usr/bin/python3", "-c", "pass"]
    commands["python -m denpex --version"] = [args.python, "-m", "denpex", "--version"]
    for kind, path in builds.items():
        commands[f"{kind} --version"] = [str(path), "--version"]
    for kind, path in builds.items():
        commands[f"{kind} scan"] = [str(path), "scan", "-q", str(args.log)]
    for kind, path in builds.items():  # the wrapper around a job that does nothing
        commands[f"{kind} run -- true"] = [str(path), "run", "--", "true"]
    timings = measure(commands, args.runs, env)

    baseline = timings["python -c pass"]["median_ms"]
    for row in timings.values():
        row["ratio_to_python"] = round(row["median_ms"] / baseline, 2)
    # onedir: the whole folder (executable + _internal/), the others: the one file
    sizes = {
        kind: size_mb(path.parent if kind == "onedir" else path) for kind, path in builds.items()
    }
    result: dict = {
        "benchmark": "startup",
        "runs": args.runs,
        "baseline": f"{args.python} -c pass",
        "log_bytes": args.log.stat().st_size,
        "timings": timings,
        "sizes_mb": sizes,
        "targets": {
            "onedir_version_ratio_max": TARGET_ONEDIR_RATIO,
            "static_size_mb_max": TARGET_STATIC_MB,
        },
        "target_met": {
            "onedir_start": timings["onedir --version"]["ratio_to_python"] <= TARGET_ONEDIR_RATIO,
        },
    }
    if "static" in sizes:
        result["target_met"]["static_size"] = sizes["static"] <= TARGET_STATIC_MB
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
