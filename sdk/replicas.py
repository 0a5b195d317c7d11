"""Replica agreement: every replica of the same data (DDP ranks, or the ranks holding the same
FSDP/ZeRO shard) must hold bit-identical parameters after a step; a rank that disagrees with
the majority is silent data corruption (train.sdc).

One fixed-size all_gather of digests per check, entered by every rank of the group at the same
step; a second, equally deterministic gather only narrows down a mismatch. Never raises
past `check()`'s caller on its own account and never skips a collective the others enter.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from denpex.sdk.checksums import combine, to_signed
from denpex.series.findings import Finding

MAX_SLOTS = 1024  # digests per gather; more tensors than this are hashed in buckets
HEADER = 3  # valid flag, number of tensors, layout digest


@dataclass(frozen=True, slots=True)
class Disagreement:
    """`member` (index in the group) differs from the majority first at slot `slot`."""

    member: int
    slot: int


def bucket_bounds(count: int, slots: int = MAX_SLOTS) -> list[tuple[int, int]]:
    """Contiguous [start, end) ranges of tensors hashed into each slot (one per tensor when
    they fit)."""
    used = min(count, slots)
    return [(b * count // used, (b + 1) * count // used) for b in range(used)]


def slot_digests(digests: Sequence[int], slots: int = MAX_SLOTS) -> list[int]:
    bounds = bucket_bounds(len(digests), slots)
    if len(bounds) == len(digests):
        return list(digests)
    return [combine(digests[a:b]) for a, b in bounds]


def majority_disagreements(rows: Sequence[Sequence[int]]) -> tuple[list[Disagreement], bool]:
    """Members whose row differs from the per-column majority, each at its first differing
    column; and whether some column had no strict majority (a split nobody can arbitrate)."""
    if not rows:
        return [], False
    split = False
    first: dict[int, int] = {}
    for col in range(len(rows[0])):
        values = [row[col] for row in rows]
        (value, votes), *_ = Counter(values).most_common(1)
        if votes * 2 <= len(rows):
            if votes < len(rows):
                split = True
            continue
        for member, got in enumerate(values):
            if got != value and member not in first:
                first[member] = col
    found = [Disagreement(member, col) for member, col in sorted(first.items())]
    return found, split


def layout_digest(names: Sequence[str], shapes: Sequence[Sequence[int]]) -> int:
    text = ";".join(f"{n}:{tuple(s)}" for n, s in zip(names, shapes, strict=True))
    from denpex._native import load

    return int(load("checksum").xxh3_64(text.encode()))


class ReplicaChecker:
    """Compares this rank's tensor digests with the other members of `group` (None: WORLD)."""

    def __init__(
        self,
        group: Any,
        names: Sequence[str],
        shapes: Sequence[Sequence[int]],
        slots: int = MAX_SLOTS,
    ) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.group = group
        self.names = list(names)
        self.layout = layout_digest(self.names, shapes)
        self.members = (
            dist.get_process_group_ranks(group)
            if group is not None
            else list(range(dist.get_world_size()))
        )
        self.me = dist.get_rank(group) if group is not None else dist.get_rank()
        backend = dist.get_backend(group)
        self.device = _collective_device(backend)
        self.slots = slots
        self.reported: set[tuple[int, str]] = set()

    @property
    def size(self) -> int:
        return len(self.members)

    def _gather(self, values: Sequence[int]) -> list[list[int]]:
        import torch

        mine = torch.tensor([to_signed(v) for v in values], dtype=torch.int64, device=self.device)
        out = [torch.empty_like(mine) for _ in range(self.size)]
        self.dist.all_gather(out, mine, group=self.group)
        return torch.stack(out).cpu().tolist()

    def check(self, step: int, digests: Sequence[int] | None) -> list[Finding]:
        """Gather and compare; `digests` None means this rank could not hash this time (it
        still takes part in the gather, flagged invalid, so no peer waits for it)."""
        valid = digests is not None and len(digests) == len(self.names)
        slots = slot_digests(digests, self.slots) if valid and digests else []
        header = [1 if valid else 0, len(self.names), self.layout]
        payload = header + slots + [0] * (self.slots - len(slots))
        rows = self._gather(payload)
        comparable = [r for r in rows if r[0] == 1 and r[1:3] == rows[self.me][1:3]]
        if not valid or len(comparable) != len(rows) or len(rows) < 2:
            return []  # someone could not hash or holds another layout: nothing to arbitrate
        slot_rows = [r[HEADER : HEADER + len(slots)] for r in rows]
        found, split = majority_disagreements(slot_rows)
        bounds = bucket_bounds(len(self.names), self.slots)
        findings: list[Finding] = []
        for gap in found:
            start, end = bounds[gap.slot]
            index = start
            if end - start > 1:
                # every member saw the same rows, so all enter this narrowing gather together
                assert digests is not None
                bucket = self._gather(list(digests[start:end]))
                inner, _ = majority_disagreements(bucket)
                hit = next((d.slot for d in inner if d.member == gap.member), 0)
                index = start + hit
            if gap.member == self.me:
                findings.extend(self._mine(step, self.names[index]))
        if split and self.me == 0:
            findings.append(self._split(step))
        return findings

    def _mine(self, step: int, name: str) -> list[Finding]:
        rank = self.members[self.me]
        key = (rank, name)
        if key in self.reported:
            return []
        self.reported.add(key)
        return [
            Finding(
                "train.sdc.replica_mismatch",
                captures={
                    "rank": str(rank),
                    "step": str(step),
                    "param": name,
                    "replicas": str(self.size),
                },
            )
        ]

    def _split(self, step: int) -> Finding:
        return Finding(
            "train.sdc.replica_split",
            captures={"step": str(step), "ranks": ",".join(map(str, self.members))},
            values={"replicas": self.size},
        )


def _collective_device(backend: str) -> Any:
    import torch

    if "nccl" in str(backend).lower():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
