"""What the fleet simulator (fleet_sim.py) sends, in the real formats: an agent's evidence
as an OTLP/HTTP protobuf log request (denpex.agent.otlp), kernel lines matched by the real
catalog, IB counter findings built like the agent's detector, and a job's report whose
`denpex.diagnosis/v1` the real scanner and engine produce from the job's own log lines.
"""

from __future__ import annotations

from fleet_lines import AGENT_LINES, JOB_LINES
from fleet_records import GPU_BUSES, Job, S

from denpex.agent.otlp import encode_logs, serialise
from denpex.catalog import Catalog
from denpex.core import jsonio
from denpex.core.detectors import detector_evidence
from denpex.core.events import Event, Evidence
from denpex.diagnosis import DiagnosisInput, diagnose
from denpex.lite.scanner import Scanner


def kmsg_evidence(
    catalog: Catalog, host: str, which: str, now_ns: int, gpu: int | None, ident: str
) -> tuple[str, list[Evidence]]:
    """A kernel-log line (AGENT_LINES[which]) and the evidence the catalog matches in it."""
    line = AGENT_LINES[which].format(pci=f"0000:{GPU_BUSES[gpu or 0]}:00")
    event = Event(body=line, ts_ns=now_ns, host=host, source="kmsg", kind="line")
    found = []
    for match in catalog.match_lines([line.encode()]):
        captures = match.signature.captures(line.encode())
        found.append(match.signature.evidence(event, captures, ident))
    return line, found


def ib_warning(host: str, now_ns: int, port: str, ident: str) -> Evidence:
    """The IB collector's finding for a port whose xmit discards rose past its threshold."""
    event = Event(
        body="",
        ts_ns=now_ns,
        host=host,
        source="ib",
        kind="state",
        attrs={"device": port, "port": 1, "link_layer": "InfiniBand"},
    )
    captures = {
        "link_layer": "InfiniBand",
        "key": f"{port}/1",
        "counter": "port_xmit_discards",
        "increase": "412",
        "window_s": "300",
        "threshold": "100",
    }
    evidence = detector_evidence(
        event, "net.ib_error.ib_port_xmit_discards", captures=captures, severity="warning"
    )
    event.body = evidence.summary
    evidence.id = ident
    return evidence


def otlp_logs(found: list[Evidence], now_ns: int) -> bytes:
    return serialise(encode_logs(found, observed_ns=now_ns), "http/protobuf")


def job_report(catalog: Catalog, job: Job, serials: dict[str, list[str]]) -> bytes:
    """The report `denpex run` posts when `job` ends: its placement and its diagnosis."""
    scanner = Scanner(catalog)
    failed_at = job.end_ns
    lines: list[tuple[int, str, str]] = []  # (time, host, line)
    cause = job.cause
    root = job.root_host or job.hosts[0]
    rank = job.hosts.index(root) * 8 + job.root_gpu
    template = None
    if cause[0] == "software":
        template = cause[1]
    elif cause[0] == "fault":
        template = cause[4] if len(cause) > 4 and cause[4] == "xid79" else cause[3]
    exit_code = 0
    if template is not None:
        exit_code = 1
        for n, text in enumerate(JOB_LINES[template]):
            lines.append(
                (failed_at - 5 * S + n, root, text.format(rank=rank, host=root, job=job.ident))
            )
        for other in range(min(3, len(job.hosts) * 8 - 1)):  # the others time out later
            peer = (rank + 1 + other) % (len(job.hosts) * 8)
            lines.append(
                (
                    failed_at + 600 * S,
                    job.hosts[peer // 8],
                    JOB_LINES["watchdog"][0].format(rank=peer),
                )
            )
    for host in job.hosts:
        scanner.stream(host, host=host)
        scanner.stream(f"kmsg:{host}", host=host, source="kmsg")
    for ts, host, line in job.kmsg:
        scanner.feed(f"kmsg:{host}", (line + "\n").encode(), arrival_ns=ts)
    for ts, host, text in sorted(lines):
        scanner.feed(host, (text + "\n").encode(), arrival_ns=ts)
    scanner.close_all()
    scanner.apply_stream_defaults()
    diagnosis = diagnose(
        DiagnosisInput(scanner.evidence, exit_code=exit_code, stats=scanner.stats())
    )
    gpus = [
        {
            "host": h,
            "pci": f"0000:{GPU_BUSES[g]}:00.0",
            "serial": serials[h][g],
            "rank": i * 8 + g,
        }
        for i, h in enumerate(job.hosts)
        for g in range(8)
    ]
    body = {
        "id": f"rep-{job.ident}",
        "job": job.ident,
        "user": job.user,
        "hosts": job.hosts,
        "ranks": list(range(len(job.hosts) * 8)),
        "scheduler": {"slurm_job_id": job.ident},
        "ended_ns": job.end_ns,
        "started_ns": job.start_ns,
        "name": job.name,
        "gpus": gpus,
        "labels": {"driver": job.driver, "image": job.image},
        "diagnosis": diagnosis.to_dict(),
    }
    return jsonio.dumps(body)
