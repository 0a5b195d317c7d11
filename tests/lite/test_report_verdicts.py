"""Whole verdicts from log text: scanner → diagnosis → the text report, for the cases where a
verdict used to say something confident and wrong (host context taken for the job's own
failure, a cause printed after its symptoms, a hang blamed on the ranks that waited)."""

from __future__ import annotations

import re

import pytest

from denpex.catalog import load_catalog
from denpex.core.events import Evidence
from denpex.diagnosis import DiagnosisInput, diagnose
from denpex.lite.report_text import render_text
from denpex.lite.scanner import Scanner

# the matcher, line splitter and ring buffer, compiled and pure Python (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("both_backends")

ENOSPC = b"[rank0]:OSError: [Errno 28] No space left on device: '/ckpt/step_1200/model.pt'\n"
OTHER_CGROUP_OOM = (
    b"Mar  1 03:12:05 node1 kernel: [5123.1] Out of memory: Killed process 9911 (stress)"
    b" total-vm:8123456kB, anon-rss:8000000kB, file-rss:0kB, shmem-rss:0kB\n"
)
XID79 = b"[ 5124.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus.\n"


def scanned(*chunks: bytes, name: str = "job.log") -> Scanner:
    scanner = Scanner(load_catalog())
    for chunk in chunks:
        scanner.feed(name, chunk)
    scanner.close_all()
    scanner.apply_stream_defaults()
    return scanner


def verdict(evidence: list[Evidence], exit_code: int | None = 1) -> tuple[dict, str]:
    data = diagnose(DiagnosisInput(evidence, exit_code=exit_code)).to_dict()
    return data, re.sub(r"\s+", " ", render_text(data, color=False, width=200))


def mark_host_context(scanner: Scanner, reason: str) -> None:
    """What the wrapper does to kernel records it cannot tie to the job."""
    for item in scanner.evidence:
        if item.event.source == "kmsg":
            item.event.attrs["attribution"] = "host"
            item.event.attrs["attribution_reason"] = reason


def test_a_neighbours_oom_kill_is_context_and_the_verdict_says_so():
    scanner = scanned(OTHER_CGROUP_OOM, ENOSPC)
    mark_host_context(scanner, "another memory cgroup")
    data, text = verdict(scanner.evidence, exit_code=1)
    assert data["root_cause"]["category"] == "host.disk_full"
    assert "at 03:12:05 UTC (another memory cgroup) — not this job" in data["summary"]
    assert "not this job" in text
    roles = {c["category"]: c["role"] for c in data["contributing"]}
    assert roles["host.oom_killed"] == "context"


def test_an_unrelated_xid_during_a_disk_full_failure_stays_context():
    scanner = scanned(XID79, ENOSPC)
    mark_host_context(scanner, "a GPU the job does not use")
    data, _ = verdict(scanner.evidence)
    assert data["root_cause"]["category"] == "host.disk_full"
    assert data["findings"] == []


def test_an_independent_failure_is_a_second_finding_in_one_line():
    scanner = scanned(ENOSPC, XID79)  # the Xid is the job's (no attribution): still independent
    data, _ = verdict(scanner.evidence)
    assert data["root_cause"]["category"] == "host.disk_full"
    assert [f["category"] for f in data["findings"]] == ["gpu.fallen_off_bus"]
    also = [line for line in render_text(data, color=False).splitlines() if "also:" in line]
    assert len(also) == 1 and "gpu.fallen_off_bus" in also[0]


def test_later_lines_are_counted_after_the_cause_and_without_it():
    log = (
        b"2026-03-01T12:21:00Z [rank1]:[E301 12:21:00.1 ProcessGroupNCCL.cpp:1826] [PG ID 0 PG"
        b" GUID 0(default_pg) Rank 1] Process group watchdog thread terminated with exception:"
        b" NCCL error: remote process exited or there was a network error\n"
        b"2026-03-01T12:21:08Z [rank0]:"
        + ENOSPC[len(b"[rank0]:") :]
        + b"2026-03-01T12:21:09Z [rank0]:RuntimeError: PytorchStreamWriter failed writing file"
        b" data/7: file write failed\n"
    )
    data, _ = verdict(scanned(log).evidence)
    assert data["root_cause"]["category"] == "host.disk_full"
    assert "1 later error line(s)" in data["summary"], data["summary"]
    rows = [(t["id"], t["lineno"]) for t in data["timeline"]]
    assert len({n for _, n in rows}) == len(rows)  # one line, one row


def test_the_text_report_names_the_line_and_the_innermost_frame():
    log = b"".join(
        b"[rank4]:" + line + b"\n"
        for line in (
            b"Traceback (most recent call last):",
            b'  File "/srv/train.py", line 210, in <module>',
            b"    loss = step(batch)",
            b'  File "/srv/data.py", line 17, in collate',
            b"    return {k: [s[k] for s in samples] for k in keys}",
            b"KeyError: 'pixel_values'",
        )
    )
    data, text = verdict(scanned(log, name="logs/train.log").evidence)
    assert data["root_cause"]["frame"] == "data.py:17 in collate"
    assert "at logs/train.log:" in text and "in data.py:17 in collate" in text


def test_a_collective_timeout_names_the_rank_that_did_not_arrive():
    def timeout(rank: int) -> bytes:
        return (
            b"[rank%d]:[E301 12:31:00.1 ProcessGroupNCCL.cpp:1316] [PG ID 0 PG GUID 0(default_pg)"
            b" Rank %d] Timeout at NCCL work: 5, last enqueued NCCL work: 5, last completed NCCL"
            b" work: 4.\n" % (rank, rank)
        )

    dump = (
        b"[rank1]:[E301 12:31:01.1 ProcessGroupNCCL.cpp:1987] [PG ID 0 PG GUID 0(default_pg) Rank"
        b" 1] Received a dump signal due to a collective timeout from  rank 0 and we will try our"
        b" best to dump the debug info. Last enqueued NCCL work: 4, last completed NCCL work: 4.\n"
    )
    data, text = verdict(scanned(timeout(0), timeout(2), timeout(3), dump).evidence)
    assert (data["root_cause"]["category"], data["root_cause"]["rank"]) == ("train.hang", 1)
    assert data["root_cause"]["rule"] == "absent_from_collective"
    assert "rank 1" in text


def test_silent_data_corruption_on_exit_0_is_not_ok():
    log = b"[rank2]:ERROR integrity: suspected silent data corruption on rank 2 at step 400\n"
    data, text = verdict(scanned(log).evidence, exit_code=0)
    assert data["status"] == "failed" and data["exit"]["code"] == 0
    assert data["root_cause"]["category"] == "train.sdc"
    assert "FAILED" in text and "OK" not in text.split("—")[0]


def test_a_check_that_stopped_running_never_reads_as_a_plain_ok():
    from denpex.core.events import Event

    scanner = scanned(b"step 100 loss 2.1\n")
    lost = Event(
        body="sdk_coverage_lost",
        kind="state",
        source="sdk",
        rank=0,
        attrs={"check": "checksums", "since_step": 5, "reason": "Numpy is not available"},
    )
    scanner.add_sdk(lost)
    scanner.add_sdk(lost)  # said twice, noted once
    data = diagnose(
        DiagnosisInput(scanner.evidence, exit_code=0, coverage_lost=scanner.coverage_lost)
    ).to_dict()
    assert data["status"] == "ok" and len(data["coverage_lost"]) == 1
    text = render_text(data, color=False, width=200)
    assert "OK" not in text
    assert "checksums off since step 5 on rank 0: Numpy is not available" in text
    assert "checksums off since step 5" in data["summary"]
