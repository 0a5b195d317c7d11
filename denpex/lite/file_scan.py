"""`denpex scan` of many log files across processes: each file is read to its end by its own
session in a worker process, and the parts are absorbed into the one session that concludes,
in the order the files were named, so the diagnosis is the same whatever the number of
workers (one included). What one file states about the job (a rank's host, a GPU's rank)
still reaches the evidence of the others: attribution happens when the session concludes.

Workers are forked after the catalog is loaded, so each shares it instead of loading it
again (a spawned worker would pay the catalog's start-up once more). Never reports: the
session that absorbs the parts does.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from denpex.catalog import Catalog
from denpex.lite.session import LiteSession, ReportOptions, SessionPart

_WORKER_CATALOG: list[Catalog] = []  # set before the workers fork: theirs by inheritance


@dataclass(frozen=True, slots=True)
class FileInput:
    """One file to scan and what its name or the command line says of it."""

    path: str
    host: str | None = None
    rank: int | None = None


@dataclass(slots=True)
class FileResult:
    """One file's part, or why it could not be read (an OSError's text)."""

    path: str
    part: SessionPart | None
    error: str | None = None


class UnreadableFile(Exception):
    """A named file could not be read (`path`, `reason`: the system's words)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"cannot read {path}: {reason}")
        self.path, self.reason = path, reason


def available_cores() -> int:
    """The cores this process may run on (its affinity, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def scan_one(catalog: Catalog, item: FileInput, default_host: str | None) -> FileResult:
    """Read one file to its end in a session of its own."""
    session = LiteSession(catalog, ReportOptions(text=False), host=default_host)
    try:
        session.scan_file(item.path, host=item.host, rank=item.rank)
    except OSError as exc:
        return FileResult(item.path, None, exc.strerror or str(exc))
    return FileResult(item.path, session.part())


def _scan_in_worker(item: FileInput, default_host: str | None) -> FileResult:
    return scan_one(_WORKER_CATALOG[0], item, default_host)


def scan_files(session: LiteSession, files: Sequence[FileInput], jobs: int) -> None:
    """Scan `files` with up to `jobs` processes into `session`, in their order; raises
    UnreadableFile for the first that could not be read."""
    jobs = max(1, min(jobs, len(files)))
    default_host = session.scanner.default_host
    if jobs == 1:
        for item in files:
            _absorb(session, scan_one(session.catalog, item, default_host))
        return
    _WORKER_CATALOG[:] = [session.catalog]
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            hosts = [default_host] * len(files)
            try:
                for result in pool.map(_scan_in_worker, files, hosts):
                    _absorb(session, result)
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)  # the files not yet begun
                raise
    finally:
        _WORKER_CATALOG.clear()


def _absorb(session: LiteSession, result: FileResult) -> None:
    if result.part is None:
        raise UnreadableFile(result.path, result.error or "unreadable")
    session.absorb(result.part)
