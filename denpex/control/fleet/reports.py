"""A job report (`POST /api/v1/reports`: the job's placement plus its `denpex.diagnosis/v1`)
as the JobOutcome the fleet rules read.

Report fields: id, job, user, hosts, ranks, scheduler, ended_ns, diagnosis, and optionally
started_ns, name (the workload), gpus ([{host, pci, serial, uuid, vbios, rank}]) and labels ({driver,
image, …}). Timeline evidence ids become `<report id>/<timeline id>` (a timeline id is
unique only within its report). A job whose ranks each ran under their own wrapper sends
one report per rank; `job_outcomes` joins them into one JobOutcome, so that the job is
diagnosed across all its ranks (the rank the others waited for is in nobody's own report).
Pure: never reads the store or the clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from denpex.control.fleet.model import EvidenceRecord, GpuRef, JobOutcome


def parse_ts(text: str | None) -> int | None:
    """Nanoseconds for the diagnosis JSON's times ('2026-11-30T04:56:09.123Z')."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    seconds = int(moment.timestamp())
    return seconds * 1_000_000_000 + moment.microsecond * 1000


def evidence_id(report_id: str, item_id: str) -> str:
    return f"{report_id}/{item_id}"


def _gpus(items: Any) -> tuple[GpuRef, ...]:
    out = []
    for item in items or ():
        if isinstance(item, Mapping) and isinstance(item.get("host"), str):
            rank = item.get("rank")
            out.append(
                GpuRef(
                    host=item["host"],
                    pci=item.get("pci") or None,
                    serial=item.get("serial") or None,
                    rank=rank if isinstance(rank, int) else None,
                )
            )
    return tuple(out)


def _timeline(report_id: str, entries: Any, tenant: str, job: str) -> tuple[EvidenceRecord, ...]:
    out = []
    for entry in entries or ():
        if not isinstance(entry, Mapping) or not isinstance(entry.get("id"), str):
            continue
        out.append(
            EvidenceRecord(
                id=evidence_id(report_id, entry["id"]),
                ts_ns=parse_ts(entry.get("ts")),
                host=entry.get("host"),
                category=str(entry.get("category") or "unknown"),
                severity=str(entry.get("severity") or "error"),
                source=str(entry.get("source") or "log"),
                signature=str(entry.get("signature") or ""),
                rank=entry.get("rank"),
                job=job,
                tenant=tenant,
                body=str(entry.get("line") or ""),
            )
        )
    return tuple(out)


def outcome_from_report(report: Mapping[str, Any], *, tenant: str) -> JobOutcome:
    """The JobOutcome of one report; the root cause GPU is the GPU of the blamed rank."""
    report_id = str(report["id"])
    job = str(report.get("job") or report_id)
    diagnosis = report["diagnosis"]
    root = diagnosis.get("root_cause") or {}
    exit_ = diagnosis.get("exit") or {}
    gpus = _gpus(report.get("gpus"))
    rank = root.get("rank")
    host = root.get("host")
    root_gpu = next(
        (g for g in gpus if rank is not None and g.rank == rank and (host in (None, g.host))),
        None,
    )
    timeline = _timeline(report_id, diagnosis.get("timeline"), tenant, job)
    hosts = list(report.get("hosts") or [])
    ranks = {g.rank: g.host for g in gpus if g.rank is not None}
    if len(hosts) == 1:  # a report from one host: the ranks it ran are on that host
        for reported in report.get("ranks") or ():
            if isinstance(reported, int):
                ranks.setdefault(reported, hosts[0])
    for record in timeline:
        if record.host and record.host not in hosts:
            hosts.append(record.host)
    labels = report.get("labels") or {}
    return JobOutcome(
        tenant=tenant,
        job=job,
        hosts=tuple(hosts),
        ended_ns=int(report["ended_ns"]),
        status=str(diagnosis.get("status") or "ok"),
        category=str(root.get("category") or "unknown"),
        root_host=host or (root_gpu.host if root_gpu else None),
        root_rank=rank,
        root_gpu=root_gpu,
        confidence=float(root.get("confidence") or 0.0),
        rule=str(root.get("rule") or ""),
        evidence=tuple(evidence_id(report_id, i) for i in root.get("evidence") or ()),
        started_ns=report.get("started_ns"),
        ranks=ranks,
        gpus=gpus,
        exit_code=exit_.get("code"),
        exit_signal=exit_.get("signal"),
        timeline=timeline,
        user=report.get("user"),
        name=report.get("name"),
        labels={str(k): str(v) for k, v in labels.items()},
    )


def job_outcomes(outcomes: Iterable[JobOutcome]) -> list[JobOutcome]:
    """One JobOutcome per (tenant, job): the reports of one job's ranks and hosts joined
    (hosts, ranks, GPUs and timelines together; failed when any failed; the root cause of
    its most confident failed report until re-diagnosis names the job's own), in the order
    of the first report of each job."""
    groups: dict[tuple[str, str], list[JobOutcome]] = {}
    for outcome in outcomes:
        groups.setdefault((outcome.tenant, outcome.job), []).append(outcome)
    return [parts[0] if len(parts) == 1 else _joined(parts) for parts in groups.values()]


def _joined(parts: list[JobOutcome]) -> JobOutcome:
    failed = [p for p in parts if p.failed] or parts
    lead = max(failed, key=lambda p: (p.confidence, -p.ended_ns))
    starts = [p.started_ns for p in parts if p.started_ns is not None]
    ranks: dict[int, str] = {}
    for part in parts:
        ranks.update(part.ranks)
    exits = [p for p in failed if p.exit_code not in (None, 0) or p.exit_signal]
    return replace(
        lead,
        hosts=tuple(dict.fromkeys(h for p in parts for h in p.hosts)),
        ended_ns=max(p.ended_ns for p in parts),
        status="failed" if any(p.failed for p in parts) else lead.status,
        started_ns=min(starts) if starts else None,
        ranks=ranks,
        gpus=tuple(dict.fromkeys(g for p in parts for g in p.gpus)),
        exit_code=exits[0].exit_code if exits else lead.exit_code,
        exit_signal=next((p.exit_signal for p in exits if p.exit_signal), None),
        timeline=tuple(r for p in parts for r in p.timeline),
        reports=len(parts),
    )
