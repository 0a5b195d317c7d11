"""Control-plane read latency with 10 M evidence rows stored: the incident list and a host's
history through the API (in-process ASGI: authentication, query, JSON), p50/p99, on SQLite
and on PostgreSQL in the same run (prints JSON; target: p99 <= 50 ms on both).

Rows are generated fast: SQLite executemany with the evidence indexes built afterwards,
PostgreSQL COPY into the daily partitions. Needs PostgreSQL's server binaries (apt-get
install postgresql) and several GB of disk. Never run in the test suite.
Usage: python benchmarks/bench_query.py [--rows N] [--engines sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from denpex.control.db import Database
from denpex.control.retention import ensure_partitions
from denpex.enterprise import mint_token

DAY = 86_400 * 10**9
T0 = 1_796_000_000_000_000_000
HOSTS = 512
INCIDENTS = 20_000
COLUMNS = (
    "tenant, id, ts_ns, received_ns, host, job, rank, pid, source, kind, signature, category, "
    "severity, summary, action, body, attrs"
)


def evidence_rows(n: int, days: int, seed: int):
    rng = random.Random(seed)
    span = days * DAY
    for i in range(n):
        host = f"node{rng.randrange(HOSTS):03d}"
        ts = T0 + rng.randrange(span)
        yield (
            "bench",
            f"agent-{host}:{i}",
            ts,
            ts + 1000,
            host,
            f"job{rng.randrange(5000)}",
            rng.randrange(8),
            1000 + i % 30000,
            "kmsg",
            "line",
            "gpu.xid.xid13",
            "gpu.xid",
            "error",
            "Xid 13",
            "run_diagnostics",
            f"NVRM: Xid (PCI:0000:3b:00): 13, pid={i}",
            '{"attrs":{},"captures":{}}',
        )


def incident_rows(days: int, seed: int):
    rng = random.Random(seed)
    for i in range(1, INCIDENTS + 1):
        ts = T0 + rng.randrange(days * DAY)
        status = rng.choice(("open", "acknowledged", "resolved"))
        yield (
            i,
            "bench",
            f"k{i}",
            "job_root_cause",
            "gpu.xid",
            "job",
            f"job{i}",
            f"job{i}",
            "x",
            0.9,
            status,
            ts,
            ts,
            ts,
            ts,
            1,
        )


def incident_links(seed: int):
    rng = random.Random(seed)
    for i in range(1, INCIDENTS + 1):
        for host in {f"node{rng.randrange(HOSTS):03d}" for _ in range(4)}:
            yield ("bench", i, "host", host)
        yield ("bench", i, "job", f"job{i}")


INCIDENT_SQL = (
    "INSERT INTO incidents (id, tenant, dedupe_key, rule, category, component_kind, "
    "component_id, title, explanation, confidence, status, first_ns, last_ns, opened_ns, "
    "updated_ns, epoch) VALUES ({})"
)


def load_sqlite(url: str, rows: int, days: int) -> None:
    path = url.removeprefix("sqlite:///")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("PRAGMA cache_size=-1000000")
    indexes = conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type='index' AND tbl_name='evidence' "
        "AND sql IS NOT NULL"
    ).fetchall()
    for name, _sql in indexes:
        conn.execute(f"DROP INDEX {name}")
    params = ", ".join("?" * 17)
    conn.execute("BEGIN")
    gen = evidence_rows(rows, days, 1)
    while True:
        chunk = [row for _, row in zip(range(100_000), gen, strict=False)]
        if not chunk:
            break
        conn.executemany(f"INSERT INTO evidence ({COLUMNS}) VALUES ({params})", chunk)
    conn.execute("COMMIT")
    for _name, sql in indexes:
        conn.execute(sql)
    conn.executemany(INCIDENT_SQL.format(", ".join("?" * 16)), incident_rows(days, 2))
    conn.executemany("INSERT INTO incident_links VALUES (?, ?, ?, ?)", incident_links(3))
    hosts = [("bench", f"node{h:03d}", T0, T0 + days * DAY) for h in range(HOSTS)]
    conn.executemany("INSERT INTO hosts VALUES (?, ?, ?, ?)", hosts)
    conn.execute("ANALYZE")
    conn.close()


def load_postgres(cluster, dbname: str, url: str, rows: int, days: int) -> None:
    import psycopg

    ensure_partitions(Database(url), T0, T0 + days * DAY)
    # as the superuser: COPY is refused on tables whose row-level security applies
    with psycopg.connect(
        host="127.0.0.1", port=cluster.port, user="postgres", dbname=dbname, autocommit=True
    ) as conn:
        conn.execute("SET synchronous_commit = off")
        conn.execute("SET maintenance_work_mem = '1GB'")
        # COPY into bare partitions, then build the keys and indexes once (as for SQLite)
        pkey = conn.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = 'evidence'::regclass AND contype = 'p'"
        ).fetchone()
        indexes = conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'evidence' "
            "AND indexname <> %s",
            (pkey[0],),
        ).fetchall()
        for name, _ in indexes:
            conn.execute(f"DROP INDEX {name}")
        conn.execute(f"ALTER TABLE evidence DROP CONSTRAINT {pkey[0]}")
        with conn.cursor() as cur, cur.copy(f"COPY evidence ({COLUMNS}) FROM STDIN") as copy:
            for row in evidence_rows(rows, days, 1):
                copy.write_row(row)
        conn.execute(f"ALTER TABLE evidence ADD CONSTRAINT {pkey[0]} {pkey[1]}")
        for _, definition in indexes:
            # pg_indexes shows a partitioned index as `ON ONLY evidence`: built that way it
            # would cover no partition
            conn.execute(definition.replace(" ON ONLY ", " ON ", 1))
        with conn.cursor() as cur:
            cur.executemany(
                INCIDENT_SQL.format(", ".join(["%s"] * 16)), list(incident_rows(days, 2))
            )
            cur.execute("SELECT setval('incidents_id_seq', %s)", (INCIDENTS,))
            cur.executemany(
                "INSERT INTO incident_links VALUES (%s, %s, %s, %s)", list(incident_links(3))
            )
            cur.executemany(
                "INSERT INTO hosts VALUES (%s, %s, %s, %s)",
                [("bench", f"node{h:03d}", T0, T0 + days * DAY) for h in range(HOSTS)],
            )
        conn.execute("VACUUM ANALYZE")


def measure(url: str, samples: int, tmp: str) -> dict:
    """p50/p99 of each query against a real `denpex server` over loopback HTTP."""
    import http.client
    import socket
    import subprocess

    from denpex.control.store import Store

    db = Database(url)
    minted = mint_token()
    Store(db).add_token(minted.token_id, "bench", "viewer", minted.secret_hash, T0)
    db.dispose()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = open(Path(tmp) / "server.log", "ab")  # noqa: SIM115 (closed below)
    server = subprocess.Popen(
        [sys.executable, "-m", "denpex", "server", "--db", url, "--listen", f"127.0.0.1:{port}"],
        stdout=log,
        stderr=log,
    )
    headers = {"Authorization": f"Bearer {minted.token}"}
    rng = random.Random(4)
    queries = {
        "incident_list": lambda: "/api/v1/incidents",
        "incident_list_open_on_host": lambda: (
            f"/api/v1/incidents?status=open&host=node{rng.randrange(HOSTS):03d}"
        ),
        "host_history": lambda: f"/api/v1/hosts/node{rng.randrange(HOSTS):03d}",
        "host_history_one_day": lambda: (
            f"/api/v1/hosts/node{rng.randrange(HOSTS):03d}?since={T0 + 3 * DAY}"
            f"&until={T0 + 4 * DAY}"
        ),
    }
    out = {}
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                conn.request("GET", "/healthz")
                conn.getresponse().read()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("server did not start") from None
                time.sleep(0.2)
        for name, path_of in queries.items():
            for _ in range(5):  # warm the caches a person's second look would find warm
                conn.request("GET", path_of(), headers=headers)
                conn.getresponse().read()
            times = []
            for _ in range(samples):
                path = path_of()
                start = time.perf_counter()
                conn.request("GET", path, headers=headers)
                reply = conn.getresponse()
                body = reply.read()
                times.append((time.perf_counter() - start) * 1000)
                if reply.status != 200:
                    raise SystemExit(f"{path}: HTTP {reply.status} {body[:200]!r}")
            times.sort()
            data = json.loads(body)
            out[name] = {
                "p50_ms": round(statistics.median(times), 2),
                "p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))], 2),
                "items": len(data.get("items") or data.get("evidence") or []),
            }
        conn.close()
    finally:
        server.terminate()
        server.wait(30)
        log.close()
    return out


def main(rows: int, days: int, samples: int, engines: list[str]) -> dict:
    result: dict = {"rows": rows, "days": days, "hosts": HOSTS, "incidents": INCIDENTS}
    with tempfile.TemporaryDirectory(prefix="denpex-bench-query-") as tmp:
        if "sqlite" in engines:
            url = f"sqlite:///{tmp}/control.db"
            Database(url).migrate()
            start = time.perf_counter()
            load_sqlite(url, rows, days)
            result["sqlite"] = {
                "load_s": round(time.perf_counter() - start, 1),
                **measure(url, samples, tmp),
            }
            Path(url.removeprefix("sqlite:///")).unlink()
        if "postgresql" in engines:
            from tests.control.pg import PgCluster, pg_bindir

            bindir = pg_bindir()
            if bindir is None:
                raise SystemExit("PostgreSQL server binaries not found: apt-get install postgresql")
            cluster = PgCluster(bindir)
            try:
                url = cluster.create_database("bench")
                Database(url).migrate()
                start = time.perf_counter()
                load_postgres(cluster, "bench", url, rows, days)
                result["postgresql"] = {
                    "load_s": round(time.perf_counter() - start, 1),
                    **measure(url, samples, tmp),
                }
            finally:
                cluster.stop()
    result["target_p99_ms"] = 50
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--engines", default="sqlite,postgresql")
    args = parser.parse_args()
    print(json.dumps(main(args.rows, args.days, args.samples, args.engines.split(",")), indent=2))
