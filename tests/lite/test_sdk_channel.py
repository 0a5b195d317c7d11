"""The wrapper's end of the SDK wire: a private socket any descendant can reach, decoded into
the session's evidence; and `denpex-sdk:` lines in a log taken as evidence by the scanner."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys

from denpex.catalog import load_catalog
from denpex.core.events import Event, Evidence
from denpex.core.sdk_wire import SOCKET_ENV, encode_message, stderr_line
from denpex.lite.scanner import Scanner
from denpex.lite.sdk_channel import SdkListener
from denpex.lite.session import LiteSession, ReportOptions


def sdc(rank: int = 2, ident: str = "sdk-1") -> Evidence:
    return Evidence(
        id=ident,
        event=Event(
            body="silent data corruption detected: replica mismatch",
            source="sdk",
            kind="state",
            rank=rank,
        ),
        signature="train.sdc.replica_mismatch",
        category="train.sdc",
        severity="error",
        summary=f"rank {rank} disagrees with the other replicas",
    )


def test_listener_is_private_and_removed_at_close() -> None:
    listener = SdkListener.open()
    directory = listener.directory
    assert listener.environ() == {SOCKET_ENV: listener.path}
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_ISSOCK(os.stat(listener.path).st_mode)
    assert not os.get_inheritable(listener.fileno())
    listener.close()
    assert not os.path.exists(directory)


def test_reads_lines_from_several_processes_and_counts_garbage() -> None:
    listener = SdkListener.open()
    try:
        script = (
            "import os, socket, sys\n"
            "s = socket.socket(socket.AF_UNIX); s.connect(os.environ['DENPEX_SDK_SOCKET'])\n"
            "s.sendall(sys.stdin.buffer.read())\n"
        )
        env = {**os.environ, **listener.environ()}
        payloads = [
            encode_message(sdc(ident="a")) + b"not json\n" + b"x" * 100_000 + b"\n",
            encode_message(sdc(ident="b"))[:30],  # cut short, then the peer goes away
            encode_message(sdc(ident="c")),
        ]
        for payload in payloads:
            subprocess.run([sys.executable, "-c", script], input=payload, env=env, check=True)
        got = listener.drain(5.0)
        assert sorted(item.id for item in got) == ["a", "c"]
        assert listener.connections == 3
        assert listener.stats.garbage_lines == 2 and listener.stats.oversized_lines == 1
    finally:
        listener.close()


def test_a_silent_peer_does_not_hold_up_poll() -> None:
    listener = SdkListener.open()
    peer = socket.socket(socket.AF_UNIX)
    try:
        peer.connect(listener.path)
        assert listener.poll(0.0) == []
        peer.sendall(encode_message(sdc()))
        got = []
        for _ in range(50):
            got += listener.poll(0.02)
            if got:
                break
        assert [item.id for item in got] == ["sdk-1"]
    finally:
        peer.close()
        listener.close()


def test_scanner_takes_sdk_lines_as_evidence_behind_a_rank_prefix() -> None:
    scanner = Scanner(load_catalog())
    log = (
        b"step 10 loss 2.1\n"
        + b"[rank3]:"
        + stderr_line(sdc(rank=None, ident="x"))  # type: ignore[arg-type]
        + b"[rank3]:"
        + stderr_line(sdc(rank=None, ident="x"))  # type: ignore[arg-type]
        + b"denpex-sdk: {broken\n"
    )
    scanner.feed("log", log)
    scanner.close_all()
    (found,) = scanner.evidence  # repeated id: once; the JSON matched no signature besides
    assert found.signature == "train.sdc.replica_mismatch" and found.event.rank == 3
    assert found.event.attrs["sdk_id"] == "x" and found.id == "e1"
    assert scanner.stats()["sdk_messages"] == 2 and scanner.stats()["sdk_bad_lines"] == 1


def test_session_feeds_socket_evidence_into_the_diagnosis() -> None:
    listener = SdkListener.open()
    session = LiteSession(load_catalog(), ReportOptions(text=False), host="node7", sdk=listener)
    peer = socket.socket(socket.AF_UNIX)
    peer.connect(listener.path)
    peer.sendall(encode_message(sdc()))
    peer.close()
    session.feed(
        2,
        b"[rank0]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5,"
        b" OpType=ALLREDUCE) ran for 600014 milliseconds before timing out.\n",
        False,
    )

    class Result:
        exit_code, exit_signal, bytes_dropped, bytes_total = 1, None, 0, 100

    session.finish(Result())
    assert session.diagnosis is not None
    root = session.diagnosis.to_dict()["root_cause"]
    assert root["category"] == "train.sdc" and root["rank"] == 2 and root["host"] == "node7"
    assert not os.path.exists(listener.directory)
