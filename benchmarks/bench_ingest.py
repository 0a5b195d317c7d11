"""Control-plane ingest, embedded SQLite, one core: evidence events/s end to end over HTTP
(OTLP protobuf batches, as the agent's shipper sends them) into `denpex server` pinned to one
CPU, against a raw `executemany` of the same rows into the same SQLite file on that CPU, in
the same run (prints JSON; targets: >= 20,000 events/s and >= 0.5x the raw insert).

Never run in the test suite. Usage: python benchmarks/bench_ingest.py [--events N]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from denpex.agent.otlp import encode_logs, serialise
from denpex.control.db import Database
from denpex.control.ingest import decode_logs
from denpex.control.store import Store
from denpex.core.events import Event, Evidence
from denpex.enterprise import mint_token

T0 = 1_796_000_000_000_000_000
HOSTS = 64


def evidence(start: int, n: int, tag: str) -> list[Evidence]:
    out = []
    for i in range(start, start + n):
        host = f"node{i % HOSTS:03d}"
        event = Event(
            body=f"NVRM: Xid (PCI:0000:3b:00): 79, pid={i}, GPU has fallen off the bus.",
            ts_ns=T0 + i * 1000,
            host=host,
            source="kmsg",
            rank=i % 8,
            pid=10_000 + i % 5000,
            attrs={"attribution": "host", "pci": "0000:3b:00"},
        )
        out.append(
            Evidence(
                id=f"{tag}-{i:09d}",
                event=event,
                signature="gpu.fallen_off_bus.xid79",
                category="gpu.fallen_off_bus",
                severity="critical",
                captures={"pci": "0000:3b:00"},
                summary="GPU fell off the bus",
                action="drain_node",
            )
        )
    return out


def bodies(n: int, batch: int, tag: str) -> list[bytes]:
    return [
        serialise(encode_logs(evidence(i, min(batch, n - i), tag), observed_ns=T0), "http/protobuf")
        for i in range(0, n, batch)
    ]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def raw_executemany(path: Path, batches: list[list[tuple]], cpu: int) -> float:
    """The baseline: the same rows, one transaction per batch, straight into sqlite3."""
    os.sched_setaffinity(0, {cpu})
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA cache_size=-131072")  # what the server sets (denpex.control.db)
    sql = f"INSERT OR IGNORE INTO evidence VALUES ({', '.join('?' * len(batches[0][0]))})"
    start = time.perf_counter()
    for rows in batches:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(sql, rows)
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.execute("DELETE FROM evidence")
    conn.execute("VACUUM")
    conn.close()
    return elapsed


def over_http(port: int, token: str, payloads: list[bytes], connections: int) -> float:
    headers = {"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {token}"}
    shares = [payloads[i::connections] for i in range(connections)]
    errors: list[str] = []

    def send(share: list[bytes]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for body in share:
            conn.request("POST", "/v1/logs", body, headers)
            reply = conn.getresponse()
            reply.read()
            if reply.status != 200:
                errors.append(f"HTTP {reply.status}")
        conn.close()

    threads = [threading.Thread(target=send, args=(s,)) for s in shares]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise SystemExit(f"ingest failed: {errors[:3]}")
    return elapsed


def main(events: int, batch: int, connections: int) -> dict:
    cpus = sorted(os.sched_getaffinity(0))
    server_cpu, client_cpus = cpus[0], set(cpus[1:] or cpus)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "control.db"
        url = f"sqlite:///{path}"
        db = Database(url)
        db.migrate()
        minted = mint_token()
        Store(db).add_token(minted.token_id, "bench", "operator", minted.secret_hash, T0)
        db.dispose()
        http_payloads = bodies(events, batch, "http")
        raw_rows = [
            decode_logs(b, "protobuf", tenant="bench", received_ns=T0).rows
            for b in bodies(events, batch, "raw")
        ]
        raw_s = raw_executemany(path, raw_rows, server_cpu)
        os.sched_setaffinity(0, client_cpus)

        port = free_port()
        log = open(Path(tmp) / "server.log", "wb")  # noqa: SIM115 (closed in finally)
        server = subprocess.Popen(
            [
                *("taskset", "-c", str(server_cpu), sys.executable, "-m", "denpex", "server"),
                *("--db", url, "--listen", f"127.0.0.1:{port}", "--quota", "1e9"),
            ],
            stdout=log,
            stderr=log,
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).read()
                    break
                except OSError:
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise SystemExit("server did not start") from None
                    time.sleep(0.2)
            over_http(port, minted.token, bodies(min(events, 20 * batch), batch, "warm"), 1)
            http_s = over_http(port, minted.token, http_payloads, connections)
        finally:
            server.terminate()
            server.wait(30)
            log.close()
        check = sqlite3.connect(path)
        stored = check.execute("SELECT count(*) FROM evidence WHERE id LIKE 'http-%'").fetchone()[0]
        check.close()
    if stored != events:
        raise SystemExit(f"stored {stored} of {events} events")
    http_rate, raw_rate = events / http_s, events / raw_s
    return {
        "events": events,
        "batch": batch,
        "connections": connections,
        "server_cpu": server_cpu,
        "http_events_per_s": round(http_rate),
        "raw_executemany_events_per_s": round(raw_rate),
        "ratio_http_to_raw": round(http_rate / raw_rate, 3),
        "targets": {"http_events_per_s": 20_000, "ratio_http_to_raw": 0.5},
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=512, help="records per OTLP request")
    parser.add_argument("--connections", type=int, default=2)
    args = parser.parse_args()
    print(json.dumps(main(args.events, args.batch, args.connections), indent=2))
