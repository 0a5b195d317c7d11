"""A full disk loses nothing: a failed append (a real filesystem that fills up, injected
short writes, ENOSPC and EIO) leaves the segments byte for byte as they were; read() trusts a
record's CRC, not the index; the agent holds evidence while the spool cannot write, says so
on /healthz and /metrics, and delivers everything once space returns."""

from __future__ import annotations

import contextlib
import errno
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import ClassVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from denpex.agent.config import load_config
from denpex.agent.daemon import Agent
from denpex.agent.spool import Spool
from denpex.core import jsonio
from denpex.core.collector import CollectContext, Collector
from denpex.core.events import Event
from tests.agent import small_fs
from tests.agent.otlp_receiver import OtlpReceiver


def rec(i: int, pad: int = 40) -> dict:
    return {"id": f"r{i}", "body": "x" * pad}


def segments(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*.seg"))}


def read_all(spool: Spool) -> list[dict]:
    return spool.read(10**9)[1]


# --- a real filesystem that fills up -----------------------------------------------------


@pytest.mark.parametrize("kind", small_fs.KINDS)
def test_a_full_filesystem_changes_no_byte_and_what_comes_after_is_intact(kind) -> None:
    why_not = small_fs.unavailable_reason(kind)
    if why_not:
        pytest.skip(why_not)
    with small_fs.small_filesystem(kind) as mount:
        directory = mount / "spool"
        spool = Spool(directory, fsync="always")
        try:
            before = [rec(i) for i in range(20)]
            spool.append(before)
            filler = small_fs.fill(mount)
            failures = 0
            for i in range(20):  # written while full: refused with nothing kept, or whole
                on_disk = segments(directory)
                record = rec(100 + i, pad=700 + i * 37)
                try:
                    spool.append([record])
                except OSError as refused:  # SpoolWriteError
                    failures += 1
                    assert refused.errno == errno.ENOSPC
                    assert segments(directory) == on_disk  # not one byte changed
                    assert spool.stats()["writable"] is False
                else:  # the segment's last page still had room for it
                    before.append(record)
            assert failures >= 15, "the filesystem was not full"
            assert spool.stats()["write_errors_total"] == failures
            assert read_all(spool) == before

            filler.unlink()  # space returns
            after = [rec(200 + i, pad=i * 11) for i in range(20)]
            for record in after:
                spool.append([record])
            assert spool.stats()["writable"] is True
            assert read_all(spool) == before + after
        finally:
            spool.close()
        with Spool(directory) as reopened:  # and from disk, without the index
            assert read_all(reopened) == before + after
            assert reopened.stats()["corrupt_total"] == 0


# --- injected failures ---------------------------------------------------------------------


@contextlib.contextmanager
def failing_writes(fd: int, *, short: int, then: int | None):
    """os.write on `fd` writes only `short` bytes once, then raises `then` (None: succeeds);
    every other descriptor is untouched."""
    real_write = os.write
    calls = {"n": 0}

    def write(target: int, data) -> int:
        if target != fd:
            return real_write(target, data)
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(target, bytes(data)[:short])
        if then is not None:
            raise OSError(then, os.strerror(then))
        return real_write(target, data)

    os.write = write  # type: ignore[assignment]
    try:
        yield calls
    finally:
        os.write = real_write


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EIO])
@pytest.mark.parametrize("short", [0, 1, 19, 20, 57])
def test_a_short_write_then_an_error_is_cut_back(tmp_path, error, short) -> None:
    with Spool(tmp_path, fsync="never") as spool:
        spool.append([rec(i) for i in range(5)])
        on_disk = segments(tmp_path)
        with failing_writes(spool._write_fd, short=short, then=error), pytest.raises(OSError):
            spool.append([rec(10), rec(11), rec(12)])
        assert segments(tmp_path) == on_disk
        spool.append([rec(20), rec(21)])
        assert read_all(spool) == [*(rec(i) for i in range(5)), rec(20), rec(21)]
        assert spool.stats()["appended_total"] == 7
    with Spool(tmp_path) as reopened:
        assert len(read_all(reopened)) == 7 and reopened.stats()["corrupt_total"] == 0


def test_a_short_write_that_then_completes_is_a_normal_append(tmp_path) -> None:
    with Spool(tmp_path, fsync="never") as spool:
        spool.append([rec(0)])
        with failing_writes(spool._write_fd, short=7, then=None) as calls:
            spool.append([rec(1), rec(2)])
        assert calls["n"] == 2
        assert read_all(spool) == [rec(0), rec(1), rec(2)]


def test_a_failure_across_a_segment_roll_removes_the_new_segment(tmp_path) -> None:
    with Spool(tmp_path, segment_bytes=300, fsync="never") as spool:
        spool.append([rec(0)])
        on_disk = segments(tmp_path)
        real_open = os.open
        opened: list[int] = []

        def tracking_open(path, flags, *args):
            fd = real_open(path, flags, *args)
            if str(path).endswith(".seg"):
                opened.append(fd)
            return fd

        os.open = tracking_open  # type: ignore[assignment]
        real_write = os.write

        def write(fd: int, data) -> int:
            if fd in opened:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_write(fd, data)

        os.write = write  # type: ignore[assignment]
        try:
            with pytest.raises(OSError):
                spool.append([rec(i, pad=90) for i in range(1, 8)])  # fills one, rolls, fails
        finally:
            os.open, os.write = real_open, real_write
        assert segments(tmp_path) == on_disk
        spool.append([rec(50)])
        assert read_all(spool) == [rec(0), rec(50)]


def test_read_checks_the_crc_instead_of_trusting_the_index(tmp_path) -> None:
    with Spool(tmp_path) as spool:
        spool.append([rec(i, pad=30) for i in range(6)])
        (segment,) = tmp_path.glob("*.seg")
        data = bytearray(segment.read_bytes())
        where = data.index(b'"r3"')
        data[where + 20] ^= ord("x") ^ ord("y")  # inside the body: still valid JSON
        segment.write_bytes(bytes(data))
        got = read_all(spool)  # the index was built before the byte changed
        assert [r["id"] for r in got] == ["r0", "r1", "r2", "r4", "r5"]
        assert all(r["body"] == "x" * 30 for r in got)
        read_all(spool)  # read again before the ack: counted once
        assert spool.stats()["dropped_total"]["corrupt"] == 1


# --- the agent on a full disk ------------------------------------------------------------


class Lines(Collector):
    """Produces one Xid line per poll, each with its own event id."""

    name = "lines"
    default_interval_s = 0.05
    default_budget_s = 1.0
    produced: ClassVar[list[str]] = []

    def available(self):
        return True, "always"

    def collect(self, ctx: CollectContext):
        n = len(Lines.produced)
        Lines.produced.append(f"line:{n}")
        body = f"NVRM: Xid (PCI:0000:3b:00): 79, pid={n + 1000}, GPU has fallen off the bus."
        return [Event(body=body, source="kmsg", attrs={"event_id": f"line:{n}"})]


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_for(predicate, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def sample(url: str, name: str, **labels: str) -> float | None:
    text = get(url + "/metrics")[1].decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def test_the_agent_keeps_evidence_while_the_disk_is_full_and_says_so() -> None:
    why_not = small_fs.unavailable_reason("tmpfs")
    if why_not:
        pytest.skip(why_not)
    receiver = OtlpReceiver().start()
    Lines.produced.clear()
    with small_fs.small_filesystem("tmpfs", size_kib=2048) as mount:
        config = load_config(
            overrides={
                "listen": "127.0.0.1:0",
                "state_dir": str(mount / "state"),
                "otlp.endpoint": receiver.url,
                "otlp.metrics_interval_s": 0.2,
                "spool.fsync": "always",
            }
        )
        agent = Agent(config, collector_classes=(Lines,))
        agent.start()
        try:
            url = agent.api.url
            assert wait_for(lambda: len(receiver.ids()) >= 5)
            filler = small_fs.fill(mount)
            full_from = len(Lines.produced)
            assert wait_for(lambda: get(url + "/healthz")[0] == 503)
            report = jsonio.loads(get(url + "/healthz")[1])
            assert report["status"] == "degraded" and report["spool"]["writable"] is False
            assert "No space left" in report["spool"]["error"]
            assert wait_for(lambda: len(Lines.produced) >= full_from + 20)
            errors = sample(url, "denpex_spool_errors_total", operation="append") or 0
            assert errors >= 1
            waiting = sample(url, "denpex_spool_waiting_records") or 0
            assert waiting >= 10
            full_until = len(Lines.produced)

            filler.unlink()
            assert wait_for(lambda: get(url + "/healthz")[0] == 200)
            wanted = {f"line:{n}" for n in range(len(Lines.produced))}
            assert wait_for(lambda: wanted <= receiver.ids(), timeout=30)
            lost = {f"line:{n}" for n in range(full_from, full_until)} - receiver.ids()
            assert not lost  # written while the disk was full: held, then delivered
            assert sample(url, "denpex_spool_dropped_total", reason="unwritable") == 0
        finally:
            agent.stop()
            receiver.stop()
