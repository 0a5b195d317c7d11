"""The dead-letter segment: spooled records the endpoint refused for good (400, 401, 403,
404, 422, a record too large even alone, a record that is not evidence), kept with the
status and the reason instead of dropped, so they can be inspected (`denpex agent spool
show --dead-letter`) and requeued once the configuration is fixed.

Reading here never takes the spool's lock (a running agent owns it) and never changes a
file; requeueing does take both locks, and copies before it acknowledges (a crash in between
duplicates, never loses).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from denpex.agent.spool import HEADER, Spool, scan_records
from denpex.core import jsonio

DEAD_LETTER_DIR = "dead-letter"  # inside the spool's directory


def dead_letter_dir(spool_dir: Path) -> Path:
    return Path(spool_dir) / DEAD_LETTER_DIR


def dead_letter_entry(
    record: dict[str, Any], *, status: int | None, reason: str, endpoint: str = ""
) -> dict[str, Any]:
    """What the dead-letter segment keeps of one refused record."""
    return {
        "record": record,
        "status": status,
        "reason": reason[:500],
        "endpoint": endpoint,
        "at_ns": time.time_ns(),
    }


@dataclass(slots=True)
class SpoolListing:
    directory: Path
    records: list[dict[str, Any]]
    pending: int  # records after the ack cursor (records holds at most `limit` of them)
    segments: int
    bytes: int


def list_pending(directory: Path, limit: int | None = None) -> SpoolListing:
    """The records a spool directory still holds after its ack cursor, read-only and
    without its lock (safe beside a running agent: a record being written is skipped)."""
    directory = Path(directory)
    try:
        cursor_data = jsonio.loads((directory / "cursor.json").read_bytes())
        cursor = (int(cursor_data["segment"]), int(cursor_data["offset"]))
    except (OSError, ValueError, KeyError, TypeError):
        cursor = (0, 0)
    records: list[dict[str, Any]] = []
    pending = segments = size = 0
    paths = sorted(p for p in directory.glob("*.seg") if p.stem.isdigit())
    for path in paths:
        seq = int(path.stem)
        if seq < cursor[0]:
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue  # deleted since the listing (acknowledged meanwhile)
        segments += 1
        size += len(data)
        start = cursor[1] if seq == cursor[0] else 0
        for begin, end, _ts in scan_records(data):
            if begin < start:
                continue
            pending += 1
            if limit is None or len(records) < limit:
                try:
                    records.append(jsonio.loads(data[begin + HEADER.size : end]))
                except ValueError:
                    continue
    return SpoolListing(directory, records, pending, segments, size)


def requeue(spool_dir: Path, *, batch: int = 512) -> int:
    """Move every dead-letter record back into the spool (after fixing the endpoint or its
    credentials); returns how many. Raises SpoolLockedError while an agent runs."""
    with Spool(spool_dir) as spool, Spool(dead_letter_dir(spool_dir)) as dead:
        return requeue_into(spool, dead, batch=batch)


def requeue_into(spool: Spool, dead: Spool, *, batch: int = 512) -> int:
    """The move itself, for a caller that holds both spools (the running agent)."""
    moved = 0
    while True:
        cursor, entries = dead.read(batch)
        if not entries:
            return moved
        records = [e["record"] for e in entries if isinstance(e, dict) and "record" in e]
        spool.append(records)  # copied first: a crash now duplicates, never loses
        dead.ack(cursor)
        moved += len(records)
