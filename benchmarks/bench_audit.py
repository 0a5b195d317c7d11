"""Tamper detection of the hash-chained audit log (DESIGN §7): an export of N records, then
10,000 random tamperings (byte flips, record deletions, swaps, insertions of a copied or a
forged record, tail truncation by lines or bytes), each verified; prints JSON with the share
detected (target: 1.0) per kind, and verify throughput against hashing the same bytes with a
bare SHA-256 loop in the same run.
Usage: python benchmarks/bench_audit.py [--records N] [--trials N] [--seed S]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from denpex.core import audit

KINDS = ("byte_flip", "delete", "swap", "insert_copy", "insert_forged", "cut_lines", "cut_bytes")


def build(n: int, rng: random.Random) -> list[bytes]:
    head, lines = audit.EMPTY, []
    kinds = sorted(audit.kinds())
    for i in range(n):
        record = audit.seal(
            head,
            ts_ns=1_796_000_000_000_000_000 + i * 1_000_000,
            kind=rng.choice(kinds),
            actor=rng.choice(["policy:autosafe", "alice@example.com", "admin"]),
            tenant=rng.choice(["acme", "research", None]),
            subject=f"plan {i // 9} step {i % 9}",
            why={"incident": i // 9, "evidence": [f"ev-{i}-{j}" for j in range(rng.randint(0, 3))]},
            result={"ok": rng.random() > 0.1, "detail": "scontrol update nodename=n2 state=drain"},
        )
        lines.append(audit.canonical(record))
        head = audit.head_of(record)
    return [*lines, audit.anchor_line(head, None)]


def tamper(lines: list[bytes], kind: str, rng: random.Random) -> list[bytes]:
    out = list(lines)
    records = len(out) - 1  # the last line is the anchor
    if kind == "byte_flip":
        i = rng.randrange(len(out))
        line = bytearray(out[i])
        j = rng.randrange(len(line))
        line[j] ^= 1 << rng.randrange(8)
        out[i] = bytes(line)
    elif kind == "delete":
        del out[rng.randrange(len(out))]
    elif kind == "swap":
        i, j = rng.sample(range(records), 2)
        out[i], out[j] = out[j], out[i]
    elif kind == "insert_copy":
        out.insert(rng.randrange(len(out) + 1), out[rng.randrange(records)])
    elif kind == "insert_forged":
        i = rng.randrange(records + 1)
        prev = audit.head_of(audit.loads_record(out[i - 1])) if i else audit.EMPTY
        forged = audit.seal(
            prev,
            ts_ns=0,
            kind="plan.approved",
            actor="mallory",
            tenant="acme",
            subject="plan 1",
            why={},
            result={},
        )  # a well-formed record chained to its predecessor: its successor no longer is
        out.insert(i, audit.canonical(forged))
    elif kind == "cut_lines":
        out = out[: rng.randrange(len(out))]
    elif kind == "cut_bytes":
        blob = b"\n".join(out) + b"\n"
        out = blob[: rng.randrange(len(blob) - 1)].splitlines()
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=500)
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    lines = build(args.records, rng)
    assert audit.verify_lines(lines).ok
    tried, caught = Counter(), Counter()
    for _ in range(args.trials):
        kind = rng.choice(KINDS)
        tampered = tamper(lines, kind, rng)
        tried[kind] += 1
        if tampered == lines or not audit.verify_lines(tampered).ok:
            caught[kind] += 1  # an identical result (a flip undone) is no tampering
    blob = b"\n".join(lines)
    t0 = time.perf_counter()
    for _ in range(20):
        audit.verify_lines(lines)
    verify_s = (time.perf_counter() - t0) / 20
    t0 = time.perf_counter()
    for _ in range(20):
        for line in lines:
            hashlib.sha256(line).digest()
    sha_s = (time.perf_counter() - t0) / 20
    result = {
        "seed": seed,
        "records": args.records,
        "trials": args.trials,
        "detected": sum(caught.values()),
        "detected_share": sum(caught.values()) / args.trials,
        "per_kind": {k: f"{caught[k]}/{tried[k]}" for k in KINDS},
        "verify_records_per_s": round(len(lines) / verify_s),
        "verify_mb_per_s": round(len(blob) / verify_s / 1e6, 1),
        "verify_vs_bare_sha256": round(sha_s / verify_s, 3),
        "target": "detected_share == 1.0",
    }
    print(json.dumps(result, indent=2))
    return 0 if result["detected_share"] == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
