"""Benchmark: the worst case of every signature on crafted 64 KiB lines (DESIGN §5, §10).

A log line is capped at 64 KiB, and every line that holds a signature's required literal is
confirmed by a regex search on the whole line (`denpex._native.linesearch`: `re`, RE2 on long
lines), then its captures are taken, so one crafted line can cost a backtracking engine far
more than its length suggests. For each signature this builds hostile lines from
the signature itself (its examples repeated, cut short before their end, its required
literal repeated or followed by long runs of one character, and seeded random splices of
those pieces), times the confirm step (search, then captures when it matched) on each, and reports the
worst (`--engine re` measures Python's `re` alone, as it is without RE2):

- `worst_ms`: the slowest 64 KiB line, in milliseconds, and `worst_mb_s` its rate;
- `growth`: time on that line at 64 KiB over time at 16 KiB (a linear regex gives about 4;
  more than 6 is super-linear);
- `vs_typical`: the worst rate against the rate of the same confirm step on a 64 KiB line
  of ordinary training output that holds the literal once (measured here, same run).

A signature fails when its worst line costs more than `--budget-ms` (default 5 ms, about
13 MB/s) and either more than `--max-slowdown` (default 4) times the ordinary line or grows
super-linearly (growth is not judged below the budget, where timer noise dominates). The ordinary line is the baseline because `re.search` over 64 KiB costs a few
ms for many patterns whatever the text (it tries every position); what this benchmark hunts
is the line an attacker or a bad day writes that costs many times that. Prints JSON; exit
status 1 when any signature fails.
Usage: python benchmarks/bench_signature_worst_case.py [--seed N] [--fuzz N] [--only ID]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time

from denpex._native.linesearch import LineSearch, engine
from denpex._native.literals import compile_pattern, literal_plan
from denpex.catalog import load_signatures
from denpex.catalog.schema import Signature

LINE = 64 * 1024
FILLERS = (b"a", b"0", b" ", b":", b"-", b"/", b"x ", b"=")
ORDINARY = (
    b"[rank3]: step 1200/250000 | loss 2.3104 | lr 2.984e-04 | grad_norm 0.812 | tokens/s "
    b"118200 | mfu 41.3% "
)


def repeat_to(unit: bytes, size: int = LINE) -> bytes:
    return (unit * (size // max(1, len(unit)) + 1))[:size] if unit else b""


def crafted_lines(sig: Signature, rng: random.Random, fuzz: int) -> list[bytes]:
    """Hostile lines of about LINE bytes built from the signature's own examples and literal."""
    examples = [e.encode("utf-8") for e in sig.examples_match]
    plan = literal_plan(sig.pattern, min_length=1)
    literals = list(plan.alternatives) if plan else []
    pieces: list[bytes] = []
    lines: list[bytes] = []
    for example in examples:
        near_miss = example[: max(3, len(example) * 3 // 4)]
        pieces += [example, near_miss]
        lines += [repeat_to(example + b" "), repeat_to(near_miss + b" "), repeat_to(near_miss)]
        for literal in literals:
            at = example.lower().find(literal.lower())
            if at >= 0:  # everything up to and including the literal, then nothing that ends it
                head = example[: at + len(literal)]
                pieces.append(head)
                lines += [repeat_to(head + b" "), head + repeat_to(b" ", LINE - len(head))]
    for literal in literals:
        pieces.append(literal)
        lines += [repeat_to(literal + b" "), repeat_to(literal)]
        for filler in FILLERS:
            lines.append(literal + repeat_to(filler, LINE - len(literal)))
            lines.append(repeat_to(filler, LINE - len(literal)) + literal)
    for _ in range(fuzz):  # random splices of the pieces and fillers
        parts = [rng.choice(pieces or [b"x"]) for _ in range(rng.randint(2, 6))]
        parts.append(rng.choice(FILLERS) * rng.randint(1, 300))
        rng.shuffle(parts)
        lines.append(repeat_to(b"".join(parts)))
    return lines


def seconds(search, line: bytes, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        search(line)
        best = min(best, time.perf_counter() - start)
    return best


def confirm_step(pattern: str, engine: str):
    """What the scanner runs on a candidate line: search, then the captures of a match."""
    if engine == "re":
        search = compile_pattern(pattern).search

        def by_re(line: bytes) -> object:
            found = search(line)
            return found and found.groupdict()

        return by_re
    line_search = LineSearch(pattern)
    return lambda line: line_search.search(line) and line_search.groups(line)


def measure(sig: Signature, rng: random.Random, fuzz: int, repeat: int, engine: str) -> dict:
    search = confirm_step(sig.pattern, engine)
    worst, worst_line = 0.0, b""
    for line in crafted_lines(sig, rng, fuzz):
        took = seconds(search, line, 1)
        if took > worst:
            worst, worst_line = took, line
    worst = seconds(search, worst_line, repeat)
    quarter = seconds(search, worst_line[: LINE // 4], repeat)
    plan = literal_plan(sig.pattern, min_length=1)
    literal = plan.alternatives[0] if plan else b""
    typical_line = repeat_to(ORDINARY, LINE - len(literal) - 1) + b" " + literal
    typical = seconds(search, typical_line, repeat)
    return {
        "id": sig.id,
        "worst_ms": round(worst * 1e3, 3),
        "worst_mb_s": round(LINE / 1e6 / worst, 1) if worst else None,
        "growth": round(worst / quarter, 2) if quarter else None,
        "vs_typical": round(typical / worst, 4) if worst else None,
        "worst_line_head": worst_line[:60].decode("utf-8", "replace"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=20261201)
    parser.add_argument("--fuzz", type=int, default=40, help="random lines per signature")
    parser.add_argument("--repeat", type=int, default=3, help="timings per line (best kept)")
    parser.add_argument("--budget-ms", type=float, default=5.0)
    parser.add_argument("--max-slowdown", type=float, default=4.0)
    parser.add_argument("--max-growth", type=float, default=6.0)
    parser.add_argument("--only", action="append", default=[], help="signature id (repeatable)")
    parser.add_argument("--top", type=int, default=20, help="slowest signatures listed")
    parser.add_argument(
        "--engine", choices=("linesearch", "re"), default="linesearch", help="what confirms"
    )
    args = parser.parse_args()
    rng = random.Random(args.seed)
    signatures = [s for s in load_signatures() if not args.only or s.id in args.only]
    results = [measure(sig, rng, args.fuzz, args.repeat, args.engine) for sig in signatures]
    results.sort(key=lambda r: r["worst_ms"], reverse=True)
    failing = [
        r
        for r in results
        if r["worst_ms"] > args.budget_ms
        and ((r["vs_typical"] or 1) < 1 / args.max_slowdown or (r["growth"] or 0) > args.max_growth)
    ]
    report = {
        "benchmark": "signature_worst_case",
        "python": platform.python_version(),
        "seed": args.seed,
        "engine": args.engine if args.engine == "re" else f"linesearch ({engine()})",
        "line_bytes": LINE,
        "signatures": len(results),
        "budget_ms": args.budget_ms,
        "max_slowdown": args.max_slowdown,
        "max_growth": args.max_growth,
        "failing": len(failing),
        "slowest": results[: args.top],
        "failing_ids": [r["id"] for r in failing],
    }
    json.dump(report, sys.stdout, indent=2)
    print()
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
