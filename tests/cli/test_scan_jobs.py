"""`denpex scan --jobs N`: many files scanned across processes give the diagnosis of one
process, byte for byte, and what one file states about the job reaches the others' evidence."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from denpex.catalog import load_catalog
from denpex.core.events import Event, Evidence
from denpex.core.sdk_wire import stderr_line
from denpex.lite.file_scan import FileInput, UnreadableFile, scan_files
from denpex.lite.scanner import LINE_CAP, MAX_EVIDENCE
from denpex.lite.session import LiteSession, ReportOptions

pytestmark = pytest.mark.usefixtures("both_backends")
CORPUS = Path(__file__).resolve().parents[1] / "corpus"

# rank 3's host is stated only by another file's srun summary; rank 3's own log names none
SRUN = "srun: error: node9: task 3: Killed\n"
RANK3 = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a "
    "total capacity of 79.15 GiB of which 1.02 GiB is free.\n"
)


def _sdk_line(ident: str) -> bytes:
    item = Evidence(
        id=ident,
        event=Event(body="replica mismatch", source="sdk", kind="state", rank=1),
        signature="train.sdc.replica_mismatch",
        category="train.sdc",
        severity="error",
        summary="rank 1 disagrees with the other replicas",
    )
    return stderr_line(item)


@pytest.fixture
def many_logs(tmp_path: Path) -> list[str]:
    """The labelled corpus, plus files whose facts cross: a host stated elsewhere, one SDK
    message in two files, a line longer than the scanner's cap, an empty file."""
    for log in sorted(CORPUS.glob("*.log")):
        shutil.copy(log, tmp_path / log.name)
    (tmp_path / "zz_srun.log").write_text(SRUN)
    (tmp_path / "zz_rank3.log").write_text(RANK3)
    sdk = b"step 10 loss 2.1\n" + _sdk_line("sdk-7")
    (tmp_path / "zz_sdk_a.log").write_bytes(sdk)
    (tmp_path / "zz_sdk_b.log").write_bytes(sdk)
    (tmp_path / "zz_long.log").write_bytes(b"x" * 200_000 + b" " + RANK3.encode())
    (tmp_path / "zz_empty.log").write_bytes(b"")
    return sorted(str(p) for p in tmp_path.glob("*.log"))


def _scan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "denpex", "scan", *args],
        capture_output=True,
        timeout=600,
        check=False,
    )


def test_every_number_of_jobs_gives_the_same_diagnosis_byte_for_byte(many_logs, tmp_path):
    outputs = {}
    for jobs in (1, 3):
        report = tmp_path / f"report{jobs}.json"
        result = _scan("--json", "--no-color", "--report", str(report), "-j", str(jobs), *many_logs)
        assert result.returncode == 1, result.stderr.decode()[-2000:]
        outputs[jobs] = (result.stdout, report.read_bytes(), result.stderr)
    assert outputs[1][0] == outputs[3][0]  # the JSON on stdout
    assert outputs[1][1] == outputs[3][1]  # the report file
    assert outputs[1][2] == outputs[3][2]  # the text report
    data = json.loads(outputs[3][0])
    stats = data["stats"]
    # every byte of every file, and the last 64 KiB of the long line scanned once more
    assert stats["bytes"] == sum(Path(p).stat().st_size for p in many_logs) + LINE_CAP + 1
    assert stats["sdk_messages"] == 2 and stats["long_lines"] == 1 and stats["empty_inputs"] == 1
    ids = [e["id"] for e in data["timeline"]]
    assert len(set(ids)) == len(ids) and data["root_cause"]["category"]


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_fact_one_file_states_reaches_another_files_evidence(tmp_path, jobs):
    (tmp_path / "a.log").write_text(SRUN)
    (tmp_path / "b.log").write_text(RANK3 + "[rank3]: " + RANK3)
    session = LiteSession(load_catalog(), ReportOptions(text=False))
    scan_files(session, [FileInput(str(tmp_path / n)) for n in ("a.log", "b.log")], jobs)
    session.conclude(None, None)
    evidence = session.scanner.evidence
    oom = [e.event for e in evidence if e.category == "cuda.oom"]
    assert len(oom) == 2 and (oom[1].rank, oom[1].host) == (3, "node9")
    assert [e.id for e in evidence] == [f"e{n}" for n in range(1, len(evidence) + 1)]
    seqs = [e.event.seq for e in evidence]
    assert seqs == sorted(seqs) and seqs[-1] == 3  # b.log's lines come after a.log's one


def test_the_evidence_cap_is_shared_by_every_file(tmp_path, monkeypatch):
    monkeypatch.setattr("denpex.lite.scanner.MAX_EVIDENCE", 3)
    paths = []
    for name in ("a", "b"):
        paths.append(tmp_path / f"{name}.log")
        paths[-1].write_text(RANK3 * 2)
    one_scanner = LiteSession(load_catalog(), ReportOptions(text=False))
    for path in paths:  # both files fed to one scanner: what the parts must add up to
        one_scanner.scan_file(str(path))
    session = LiteSession(load_catalog(), ReportOptions(text=False))
    scan_files(session, [FileInput(str(path)) for path in paths], 2)
    expected, got = one_scanner.scanner, session.scanner
    assert len(got.evidence) == 3 and got.evidence_dropped == expected.evidence_dropped > 0
    assert [(e.id, e.event.seq) for e in got.evidence] == [
        (e.id, e.event.seq) for e in expected.evidence
    ]
    assert MAX_EVIDENCE > 3


def test_an_unreadable_file_is_named(tmp_path):
    (tmp_path / "a.log").write_text(RANK3)
    session = LiteSession(load_catalog(), ReportOptions(text=False))
    missing = FileInput(str(tmp_path / "gone.log"))
    with pytest.raises(UnreadableFile, match=r"gone\.log"):
        scan_files(session, [FileInput(str(tmp_path / "a.log")), missing], 2)


def test_jobs_must_be_at_least_one(tmp_path):
    (tmp_path / "a.log").write_text(RANK3)
    result = _scan("--jobs", "0", str(tmp_path / "a.log"))
    assert result.returncode == 2 and b"--jobs" in result.stderr
