"""The SDK transport: the wrapper's Unix socket when DENPEX_SDK_SOCKET is set, stderr lines
otherwise; a bounded queue whose drops are counted and reported; one connection per process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from denpex.core.events import Event, Evidence
from denpex.core.sdk_wire import SOCKET_ENV, decode_message, stderr_payload
from denpex.lite.sdk_channel import SdkListener
from denpex.sdk.transport import DROPPED_METRIC, Transport

CHILD = Path(__file__).parent / "children" / "transport_emit.py"


def evidence(index: int) -> Evidence:
    return Evidence(
        id=f"t-{index}",
        event=Event(body=f"message {index}", source="sdk", kind="state"),
        signature="train.sdc.replica_mismatch",
        category="train.sdc",
        severity="error",
    )


def run_child(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != SOCKET_ENV}
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, str(CHILD), *args], env=environ, capture_output=True, timeout=60
    )


def collect(listener: SdkListener, want: int, timeout: float = 10.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got += listener.poll(0.05)
    return got


def test_without_a_wrapper_each_message_is_one_stderr_line() -> None:
    result = run_child("5")
    assert result.returncode == 0, result.stderr
    assert b"mode=stderr" in result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 5
    ids = [decode_message(stderr_payload(line) or b"").id for line in lines]  # type: ignore[union-attr]
    assert ids == [f"sdk-{ids[0].split('-')[1]}-{i}" for i in range(5)]


def test_stderr_lines_of_a_forked_child_are_its_own(tmp_path: Path) -> None:
    result = run_child("3", "--fork")
    assert result.returncode == 0, result.stderr
    items = [decode_message(stderr_payload(line) or b"") for line in result.stderr.splitlines()]
    assert len(items) == 6  # parent 3 (one before the fork) + child 3
    assert len({item.event.pid for item in items}) == 2


def test_socket_path_from_the_environment_one_connection_per_process() -> None:
    listener = SdkListener.open()
    try:
        result = run_child("4", "--fork", env=listener.environ())
        assert result.returncode == 0, result.stderr
        assert b"mode=socket" in result.stdout
        assert result.stderr == b""  # nothing fell back to stderr
        got = collect(listener, 8)
        got += listener.drain()
        assert sorted(item.captures["index"] for item in got) == sorted(["0", "1", "2", "3"] * 2)
        assert len({item.event.pid for item in got}) == 2
        assert listener.connections == 2
        assert all(item.event.rank == 2 and item.event.host for item in got)
    finally:
        listener.close()


def test_a_forked_child_that_exits_hard_still_delivers_after_close() -> None:
    listener = SdkListener.open()
    try:
        result = run_child("3", "--fork", "--exit-hard", env=listener.environ())
        assert result.returncode == 0, result.stderr
        got = collect(listener, 6) + listener.drain()
        assert len(got) == 6
    finally:
        listener.close()


def test_full_queue_drops_are_counted_and_reported_once_the_link_recovers(tmp_path: Path) -> None:
    path = str(tmp_path / "later.sock")
    transport = Transport(path, capacity=10)
    started = time.perf_counter()
    for index in range(25):
        transport.emit(evidence(index))  # no socket yet: must neither block nor raise
    assert time.perf_counter() - started < 0.5
    assert transport.dropped == 15
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    listener = SdkListener(str(tmp_path), server)
    try:
        got = collect(listener, 11, timeout=15.0)
        bodies = [item.body if not isinstance(item, Evidence) else item.id for item in got]
        assert bodies[:10] == [f"t-{i}" for i in range(10)]
        drops = [item for item in got if not isinstance(item, Evidence)]
        assert len(drops) == 1 and drops[0].body == DROPPED_METRIC
        assert drops[0].attrs["value"] == 15.0
        transport.close(1.0)
        assert collect(listener, 1, timeout=0.3) == []  # reported once, not again at close
    finally:
        transport.close(0.1)
        listener.close()


def test_reconnects_when_the_listener_comes_back(tmp_path: Path) -> None:
    first = SdkListener.open(str(tmp_path))
    transport = Transport(first.path)
    try:
        transport.emit(evidence(1))
        assert [item.id for item in collect(first, 1)] == ["t-1"]
        path = first.path
        first.close()  # the wrapper's socket goes away ...
        for index in range(2, 5):
            transport.emit(evidence(index))
        time.sleep(0.2)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)  # ... and comes back at the same address
        server.listen(4)
        second = SdkListener(os.path.dirname(path), server)
        try:
            got = collect(second, 3, timeout=15.0)
            ids = [item.id for item in got if isinstance(item, Evidence)]
            # a message written into the dying connection may be lost; none is duplicated
            assert ids and ids == sorted(set(ids)) and set(ids) <= {"t-2", "t-3", "t-4"}
            assert "t-4" in ids
        finally:
            second.close()
    finally:
        transport.close(0.2)


def test_emit_never_raises_into_the_caller() -> None:
    read_fd, write_fd = os.pipe()
    transport = Transport(None, stderr_fd=write_fd)
    try:
        bad = evidence(1)
        bad.event.attrs["tensor"] = object()  # not JSON-able: counted, not raised
        transport.emit(bad)
        transport.emit("not evidence")  # type: ignore[arg-type]
        assert transport.encode_errors == 2
        transport.emit(evidence(2))
        assert transport.flush(2.0)
        assert decode_message(stderr_payload(os.read(read_fd, 65536)) or b"").id == "t-2"  # type: ignore[union-attr]
        os.close(read_fd)
        read_fd = -1
        transport.emit(evidence(3))  # broken pipe: dropped and counted
        transport.flush(2.0)
        assert transport.dropped == 1
    finally:
        transport.close(0.2)
        os.close(write_fd)
        if read_fd >= 0:
            os.close(read_fd)


@pytest.mark.parametrize("count", [2000])
def test_emit_cost_stays_small(count: int, tmp_path: Path) -> None:
    listener = SdkListener.open(str(tmp_path))
    transport = Transport(listener.path)
    try:
        started = time.perf_counter()
        for index in range(count):
            transport.emit(evidence(index))
        per_emit_us = (time.perf_counter() - started) / count * 1e6
        print(f"emit: {per_emit_us:.1f} us per message")
        got = collect(listener, count, timeout=20.0)
        assert len(got) == count
        assert per_emit_us < 500  # generous: 2 shared cores; measured ≈ 10-30 us
    finally:
        transport.close(0.5)
        listener.close()


def test_on_stderr_metrics_are_not_written_and_findings_are(tmp_path: Path) -> None:
    from denpex.core.events import metric

    read_end, write_end = os.pipe()
    transport = Transport(None, stderr_fd=write_end)
    for step in range(50):
        transport.emit(metric("sdk_loss", 2.0 - step / 100, source="sdk"))
    transport.emit(evidence(1))
    transport.close()
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        lines = pipe.read().splitlines()
    assert len(lines) == 1 and decode_message(stderr_payload(lines[0]) or b"").id == "t-1"
    assert transport.suppressed == 50 and transport.dropped == 0


def test_metrics_queued_for_a_socket_that_never_answers_stay_out_of_the_log(tmp_path: Path) -> None:
    from denpex.core.events import metric

    read_end, write_end = os.pipe()
    transport = Transport(str(tmp_path / "gone.sock"), stderr_fd=write_end)
    transport.emit(metric("sdk_loss", 1.0, source="sdk"))
    transport.emit(evidence(2))
    transport.close(timeout=0.2)  # unreachable: the log is the last place for the finding
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        lines = pipe.read().splitlines()
    assert [decode_message(stderr_payload(line) or b"").id for line in lines] == ["t-2"]
    assert transport.suppressed == 1
