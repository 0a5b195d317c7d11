"""The journal collector on real journal files made from the export-format fixtures in
fixtures/journal/ (systemd-journal-remote), followed by a real `journalctl --follow`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import time
from pathlib import Path

import pytest

from denpex.core.collector import CollectContext
from denpex.core.roots import Roots
from denpex.core.wire import Registration
from denpex.host.journal import (
    JournalCollector,
    entry_event,
    journal_message,
    journalctl_command,
    parse_entry,
)

# the matcher, line splitter and ring buffer, compiled and pure Python (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("both_backends")

FIXTURES = Path(__file__).parent / "fixtures" / "journal"
JOURNAL_REMOTE = "/lib/systemd/systemd-journal-remote"
needs_journal_tools = pytest.mark.skipif(
    shutil.which("journalctl") is None or not os.access(JOURNAL_REMOTE, os.X_OK),
    reason="needs journalctl and systemd-journal-remote "
    "(Debian packages systemd and systemd-journal-remote)",
)
JOBS = (Registration(pid=5151, job="llm-7b", rank=3, tenant="team-a"),)


def write_journal(output: Path, export: bytes) -> None:
    """Append export-format entries to a journal file (created when missing)."""
    subprocess.run(
        [JOURNAL_REMOTE, f"--output={output}", "--split-mode=none", "-"],
        input=export,
        check=True,
        capture_output=True,
        timeout=30,
    )


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def ctx() -> CollectContext:
    return CollectContext(roots=Roots(), host="node7", jobs=JOBS)


def poll_until(collector: JournalCollector, count: int, timeout_s: float = 10.0) -> list:
    """Poll like the scheduler does until `count` line events arrived (or time runs out),
    committing each poll's position as the agent does once its evidence is spooled."""
    events: list = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events += [o for o in collector.collect(ctx()) if o.kind in ("line", "state")]
        checkpoint = collector.checkpoint()
        if checkpoint is not None:
            collector.commit(checkpoint)
        if len([e for e in events if e.kind == "line"]) >= count:
            break
        time.sleep(0.05)
    return events


def bodies(events) -> list[str]:
    return [e.body for e in events if e.kind == "line"]


def test_message_as_byte_array_is_decoded():
    assert journal_message([104, 105, 0xE2, 0x9C, 0x93]) == "hi\u2713"
    assert journal_message("text") == "text"
    assert journal_message(None) is None


def test_parse_entry_rejects_non_entries():
    assert parse_entry(b"not json") is None
    assert parse_entry(b'{"no_message": 1}') is None
    assert parse_entry(b"[1, 2]") is None
    assert parse_entry(b'{"MESSAGE": [104, 105]}') == {"MESSAGE": [104, 105]}


def test_entry_event_fields():
    entry = {
        "__CURSOR": "s=1;i=2",
        "__REALTIME_TIMESTAMP": "1796014569123456",
        "_TRANSPORT": "kernel",
        "PRIORITY": "3",
        "MESSAGE": "NVRM: Xid",
        "_HOSTNAME": "node9",
        "SYSLOG_IDENTIFIER": "kernel",
    }
    event = entry_event(entry, "node7")
    assert (event.source, event.kind, event.body) == ("kmsg", "line", "NVRM: Xid")
    assert event.host == "node7"
    assert event.ts_ns == 1796014569123456000
    assert event.attrs["event_id"] == "journal:s=1;i=2" and event.attrs["priority"] == 3
    assert event.attrs["hostname"] == "node9" and event.pid is None


def test_kernel_lines_from_the_journal_name_their_subject_like_kmsg():
    """The OOM victim, not the writer: the same attribution as the /dev/kmsg reader."""
    message = (
        "oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg=/slurm/job_7,task=python,pid=4242,uid=0"
    )
    kernel = entry_event({"_TRANSPORT": "kernel", "MESSAGE": message}, "n")
    assert kernel.pid == 4242 and kernel.attrs["cgroup"] == "/slurm/job_7"
    unit = entry_event({"_TRANSPORT": "stdout", "_PID": "77", "MESSAGE": message}, "n")
    assert unit.pid == 77 and "cgroup" not in unit.attrs  # a unit's line is its writer's


def test_command_line_filters_and_start():
    command = journalctl_command(
        "journalctl", file="x.journal", units=("a.service",), identifiers=("kernel", "slurmd")
    )
    assert "--file=x.journal" in command and "--lines=0" in command and "--all" in command
    assert command[-4:] == ["_SYSTEMD_UNIT=a.service", "+", "SYSLOG_IDENTIFIER=kernel",
                            "SYSLOG_IDENTIFIER=slurmd"]  # fmt: skip
    resumed = journalctl_command("journalctl", directory="d", cursor="s=1", start="end")
    assert "--after-cursor=s=1" in resumed and "--lines=0" not in resumed


def test_unavailable_without_a_journal_says_why(tmp_path):
    options = {"system_directories": [str(tmp_path / "var"), str(tmp_path / "run")]}
    ok, reason = JournalCollector(Roots(), options).available()
    if shutil.which("journalctl") is None:
        assert not ok and "journalctl" in reason
        return
    assert not ok and "no journal at" in reason and "no journal file configured" in reason
    (tmp_path / "var").mkdir()  # an empty journal folder, as the systemd package leaves it
    assert not JournalCollector(Roots(), options).available()[0]
    journal_file = tmp_path / "var" / "0123" / "system.journal"
    journal_file.parent.mkdir()
    journal_file.write_bytes(b"")
    assert JournalCollector(Roots(), options).available()[0]
    ok, reason = JournalCollector(Roots(), {"file": str(tmp_path / "none.journal")}).available()
    assert not ok and "does not exist" in reason


def test_default_configuration_on_a_host_without_journald():
    places = (Path("/var/log/journal"), Path("/run/log/journal"))
    if any(next(p.glob("**/*.journal"), None) for p in places if p.is_dir()):
        pytest.skip("this host has a journal: the default configuration is available")
    ok, reason = JournalCollector(Roots()).available()
    assert not ok
    if shutil.which("journalctl") is not None:
        expected = "no journal at /var/log/journal or /run/log/journal and no journal file"
        assert expected in reason


@needs_journal_tools
def test_file_follow_appends_and_restart_from_cursor(tmp_path):
    journal = tmp_path / "node7.journal"
    write_journal(journal, fixture("node7-base.export"))
    options = {"file": str(journal), "start": "beginning", "state_dir": str(tmp_path / "state")}
    collector = JournalCollector(Roots(), options)
    assert collector.available()[0]
    try:
        first = poll_until(collector, 3)
        kernel, slurmd, trainer = [e for e in first if e.kind == "line"]
        assert kernel.source == "kmsg" and kernel.body.startswith("NVRM: Xid (PCI:0000:3b:00): 79")
        assert kernel.attrs["device"] == "+pci:0000:3b:00.0"
        assert kernel.attrs["subsystem"] == "pci" and kernel.attrs["priority"] == 4
        assert slurmd.source == "journal" and slurmd.pid == 4242 and slurmd.job is None
        assert slurmd.attrs["unit"] == "slurmd.service" and slurmd.attrs["identifier"] == "slurmd"
        assert slurmd.ts_ns == 1796014570000000000 and slurmd.host == "node7"
        assert slurmd.attrs["hostname"] == "node7"
        assert trainer.pid is not None and trainer.job is None  # the agent attributes by pid
        assert all(e.attrs["event_id"].startswith("journal:s=") for e in (kernel, slurmd, trainer))

        write_journal(journal, fixture("node7-more.export"))  # journal-remote appends
        later = poll_until(collector, 2)
        assert bodies(later)[0].startswith("Out of memory: Killed process 5151")
        assert len(bodies(later)) == 2
        process = collector.proc
    finally:
        collector.close()
    assert process is not None and process.returncode is not None  # reaped, no zombie
    with pytest.raises(ChildProcessError):
        os.waitpid(process.pid, os.WNOHANG)
    seen = {e.attrs["event_id"] for e in first + later if e.kind == "line"}

    write_journal(journal, b"__REALTIME_TIMESTAMP=1796014590000000\n__MONOTONIC_TIMESTAMP=1\n"
                  b"_BOOT_ID=0123456789abcdef0123456789abcdef\nPRIORITY=6\n"
                  b"MESSAGE=after restart\n\n")  # fmt: skip
    restarted = JournalCollector(Roots(), options)
    try:
        resumed = poll_until(restarted, 1)
        time.sleep(0.3)
        resumed += [o for o in restarted.collect(ctx()) if o.kind == "line"]
    finally:
        restarted.close()
    assert bodies(resumed) == ["after restart"]  # nothing lost, nothing repeated
    assert not seen & {e.attrs["event_id"] for e in resumed}


@needs_journal_tools
def test_directory_mode_with_unit_and_identifier_filters(tmp_path):
    folder = tmp_path / "journal"
    folder.mkdir()
    write_journal(folder / "a.journal", fixture("node7-base.export"))
    write_journal(folder / "b.journal", fixture("node7-more.export"))
    options = {
        "directory": str(folder),
        "start": "beginning",
        "units": ["slurmd.service"],
        "identifiers": "kernel",
    }
    collector = JournalCollector(Roots(), options)
    try:
        events = poll_until(collector, 3)
        time.sleep(0.3)
        events += collector.collect(ctx())
    finally:
        collector.close()
    got = bodies(events)
    assert len(got) == 3
    assert got[0].startswith("NVRM: Xid") and got[1].startswith("error: Node configuration")
    assert got[2].startswith("Out of memory")


@needs_journal_tools
def test_binary_message_and_per_poll_cap(tmp_path):
    journal = tmp_path / "x.journal"
    data = b"bad utf-8 \xff\xfe and a bell \x07"
    binary = (
        b"__REALTIME_TIMESTAMP=1796014569000000\n__MONOTONIC_TIMESTAMP=1\n"
        b"_BOOT_ID=0123456789abcdef0123456789abcdef\nPRIORITY=5\n"
        b"MESSAGE\n" + struct.pack("<Q", len(data)) + data + b"\n\n"
    )
    write_journal(journal, binary + fixture("node7-base.export"))
    options = {"file": str(journal), "start": "beginning", "max_entries_per_poll": 1}
    collector = JournalCollector(Roots(), options)
    try:
        deadline = time.monotonic() + 10
        per_poll: list[int] = []
        got: list[str] = []
        while len(got) < 4 and time.monotonic() < deadline:
            polled = bodies(collector.collect(ctx()))
            per_poll.append(len(polled))
            got += polled
            time.sleep(0.05)
    finally:
        collector.close()
    assert max(per_poll) == 1 and len(got) == 4
    assert got[0] == data.decode("utf-8", "replace")


@needs_journal_tools
def test_journalctl_that_dies_is_restarted_from_the_cursor(tmp_path):
    journal = tmp_path / "x.journal"
    write_journal(journal, fixture("node7-base.export"))
    options = {"file": str(journal), "start": "beginning", "restart_backoff_s": 0}
    collector = JournalCollector(Roots(), options)
    try:
        first = poll_until(collector, 3)
        assert collector.proc is not None
        collector.proc.send_signal(signal.SIGKILL)
        write_journal(journal, fixture("node7-more.export"))
        after = poll_until(collector, 2)
    finally:
        collector.close()
    states = [e for e in after if e.kind == "state"]
    assert states and "journalctl exited" in states[0].body
    assert len(bodies(first)) == 3 and len(bodies(after)) == 2  # no repeat after the restart


@needs_journal_tools
def test_a_cursor_journalctl_cannot_seek_is_dropped(tmp_path):
    journal = tmp_path / "x.journal"
    write_journal(journal, fixture("node7-base.export"))
    state = tmp_path / "state"
    state.mkdir()
    (state / "journal.json").write_text(
        json.dumps({"source": f"file:{journal}", "cursor": "s=bogus;i=9"})
    )
    options = {
        "file": str(journal),
        "start": "beginning",
        "state_dir": str(state),
        "restart_backoff_s": 0,
    }
    collector = JournalCollector(Roots(), options)
    try:
        events = poll_until(collector, 3)
    finally:
        collector.close()
    states = [e for e in events if e.kind == "state"]
    assert states and "cursor" in states[0].body
    assert len(bodies(events)) == 3


@needs_journal_tools
def test_start_at_end_skips_what_was_there(tmp_path):
    journal = tmp_path / "x.journal"
    write_journal(journal, fixture("node7-base.export"))
    collector = JournalCollector(Roots(), {"file": str(journal), "start": "end"})
    try:
        assert poll_until(collector, 1, timeout_s=0.5) == []
        write_journal(journal, fixture("node7-more.export"))
        later = poll_until(collector, 2)
    finally:
        collector.close()
    assert len(bodies(later)) == 2 and bodies(later)[0].startswith("Out of memory")
