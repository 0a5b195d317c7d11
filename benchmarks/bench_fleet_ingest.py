"""Fleet ingest through NATS JetStream: a simulated fleet of 10,000 nodes publishing evidence
to a real 3-node JetStream cluster (R3 stream) on loopback, consumed by one and then two
real `denpex server --jetstream` replicas into a real PostgreSQL, all started here.

The fleet: every node sends a few evidence events an hour (default 3), one message per
event as the agent's shipper sends a lone record; the steady hour (30,000 events for 10,000
nodes) is published as fast as the publisher goes, which measures the sustained rate the
replicas store. Then a leaf switch fails: every node behind it (default 512) sends a batch
of events at once (default 8 each: link down, NCCL timeouts, job aborts), and the ingest
lag of that burst is measured (event published → row committed, from the row's
received_ns; and the time until the whole burst is stored).

Baseline, in the same run: a raw `executemany` of the same decoded rows into the same
PostgreSQL database. Ratios only are meant to be compared across machines (the publisher,
the brokers, PostgreSQL and the replicas share this machine's cores). Prints JSON.

Never run in the test suite. Usage: python benchmarks/bench_fleet_ingest.py [--nodes N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from denpex.agent.otlp import encode_logs  # noqa: E402
from denpex.control.db import Database  # noqa: E402
from denpex.control.ingest import decode_logs  # noqa: E402
from denpex.control.store import Store  # noqa: E402
from denpex.core import bus  # noqa: E402
from denpex.core.events import Event, Evidence  # noqa: E402
from denpex.enterprise import mint_token  # noqa: E402
from tests.control.conftest import ServerProcess  # noqa: E402
from tests.control.nats_cluster import NatsCluster  # noqa: E402
from tests.control.pg import PgCluster, pg_bindir  # noqa: E402

POOL = 100  # nodes per agent token (a node pool's credential)
TENANTS = ("research", "prod")


def event(tag: str, node: int, n: int, ts_ns: int, burst: bool) -> Evidence:
    host = f"node{node:05d}"
    if burst:
        body = f"mlx5_core 0000:3b:00.0: Port module event: module 1, Cable unplugged ({n})"
        signature, category = "fabric.link_down", "fabric.link_down"
    else:
        body = f"NVRM: Xid (PCI:0000:3b:00): 13, pid={1000 + n}, Graphics Exception"
        signature, category = "gpu.xid13", "gpu.graphics_exception"
    return Evidence(
        id=f"{tag}-{node:05d}-{n}",
        event=Event(body=body, ts_ns=ts_ns, host=host, source="kmsg", pid=1000 + n),
        signature=signature,
        category=category,
        severity="error",
        summary=category,
        action="none",
    )


class Fleet:
    """The simulated nodes' credentials and their pre-encoded, signed messages."""

    def __init__(self, url: str, nodes: int) -> None:
        self.nodes = nodes
        self.tokens = []
        database = Database(url)
        database.migrate()
        store = Store(database)
        for pool in range((nodes + POOL - 1) // POOL):
            minted = mint_token()
            tenant = TENANTS[pool % len(TENANTS)]
            store.add_token(minted.token_id, tenant, "operator", minted.secret_hash, time.time_ns())
            self.tokens.append((minted.token_id, minted.secret_hash))
        database.dispose()

    def message(self, node: int, items: list[Evidence]) -> tuple[str, bytes, dict[str, str]]:
        token_id, key = self.tokens[node // POOL]
        payload = encode_logs(items).SerializeToString()
        name = bus.subject(token_id, "logs")
        msg_id = bus.message_id("logs", [e.id for e in items], payload)
        return (
            name,
            payload,
            {bus.MSG_ID: msg_id, bus.SIGNATURE: bus.sign(key, name, msg_id, payload)},
        )

    def steady(self, tag: str, per_hour: int) -> list[tuple[str, bytes, dict[str, str]]]:
        now = time.time_ns()
        return [
            self.message(node, [event(tag, node, n, now, False)])
            for n in range(per_hour)
            for node in range(self.nodes)
        ]

    def burst(self, tag: str, nodes: int, events: int) -> list[tuple[str, bytes, dict[str, str]]]:
        """The burst's messages, its events stamped now (the lag is measured from here)."""
        now = time.time_ns()
        return [
            self.message(node, [event(tag, node, n, now, True) for n in range(events)])
            for node in range(nodes)
        ]


async def publish(urls: list[str], messages: list[tuple[str, bytes, dict[str, str]]]) -> float:
    """Publish with the acks pipelined; returns the seconds until every ack came back."""
    import nats

    nc = await nats.connect(servers=urls)
    js = nc.jetstream(publish_async_max_pending=4000)
    start = time.perf_counter()
    futures = [
        await js.publish_async(name, payload, headers=dict(headers), stream=bus.STREAM)
        for name, payload, headers in messages
    ]
    await asyncio.gather(*futures)
    took = time.perf_counter() - start
    await nc.close()
    return took


def count(pg: PgCluster, db: str, tag: str) -> int:
    rows = pg.admin(f"SELECT count(*) FROM evidence WHERE id LIKE '{tag}-%'", db)
    return int(rows[0][0])


def wait_stored(pg: PgCluster, db: str, tag: str, total: int, timeout_s: float = 600) -> float:
    deadline = time.monotonic() + timeout_s
    while count(pg, db, tag) < total:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{tag}: {count(pg, db, tag)} of {total} stored")
        time.sleep(0.05)
    return time.perf_counter()


def lags(pg: PgCluster, db: str, tag: str) -> dict[str, float]:
    rows = pg.admin(
        "SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY received_ns - ts_ns), "
        f"max(received_ns - ts_ns) FROM evidence WHERE id LIKE '{tag}-%'",
        db,
    )
    p50, p99 = rows[0][0]
    return {"p50_s": p50 / 1e9, "p99_s": p99 / 1e9, "max_s": rows[0][1] / 1e9}


def scenario(pg, db, urls, fleet, label, args) -> dict:
    steady = fleet.steady(f"{label}s", args.per_hour)
    total = len(steady)
    start = time.perf_counter()
    published_s = asyncio.run(publish(urls, steady))
    done = wait_stored(pg, db, f"{label}s", total)
    sustained = total / (done - start)
    burst_total = args.burst_nodes * args.burst_events
    burst = fleet.burst(f"{label}b", args.burst_nodes, args.burst_events)
    start = time.perf_counter()
    asyncio.run(publish(urls, burst))
    drained = wait_stored(pg, db, f"{label}b", burst_total) - start
    return {
        "steady_events": total,
        "publish_events_per_s": round(total / published_s),
        "sustained_events_per_s": round(sustained),
        "burst_events": burst_total,
        "burst_drained_s": round(drained, 3),
        "burst_lag": {k: round(v, 3) for k, v in lags(pg, db, f"{label}b").items()},
    }


def raw_baseline(pg: PgCluster, db: str, fleet: Fleet, per_hour: int) -> float:
    """executemany of the same rows (decoded as the server decodes them) in one transaction."""
    import psycopg

    rows = []
    for _name, payload, _headers in fleet.steady("raw", per_hour):
        rows += decode_logs(payload, "protobuf", tenant="research", received_ns=time.time_ns()).rows
    columns = 17
    sql = f"INSERT INTO evidence VALUES ({', '.join(['%s'] * columns)}) ON CONFLICT DO NOTHING"
    with psycopg.connect(host="127.0.0.1", port=pg.port, user="postgres", dbname=db) as conn:
        start = time.perf_counter()
        with conn.cursor() as cur:
            cur.executemany(sql, rows)
        conn.commit()
        return len(rows) / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--per-hour", type=int, default=3, help="events per node per hour")
    parser.add_argument("--burst-nodes", type=int, default=512, help="nodes behind the switch")
    parser.add_argument("--burst-events", type=int, default=8, help="events per node at once")
    args = parser.parse_args()
    bindir = pg_bindir()
    if bindir is None:
        print("bench_fleet_ingest: PostgreSQL binaries not found", file=sys.stderr)
        return 2
    pg = PgCluster(bindir)
    nats_cluster = NatsCluster(3)
    servers: list[ServerProcess] = []
    logs = Path(tempfile.mkdtemp(prefix="denpex-bench-fleet-"))
    try:
        db = "fleet"
        url = pg.create_database(db)
        fleet = Fleet(url, args.nodes)
        extra = ("--jetstream", ",".join(nats_cluster.urls))
        servers.append(ServerProcess(url, logs / "s1.log", *extra).start())
        wait_consumer(nats_cluster.urls)
        one = scenario(pg, db, nats_cluster.urls, fleet, "r1", args)
        servers.append(ServerProcess(url, logs / "s2.log", *extra).start())
        time.sleep(2.0)  # the second replica binds to the durable consumer
        two = scenario(pg, db, nats_cluster.urls, fleet, "r2", args)
        raw = raw_baseline(pg, db, fleet, args.per_hour)
        real_rate = args.nodes * args.per_hour / 3600
        print(
            json.dumps(
                {
                    "nodes": args.nodes,
                    "cpus": os.cpu_count(),
                    "fleet_rate_events_per_s": round(real_rate, 1),
                    "one_replica": one,
                    "two_replicas": two,
                    "raw_executemany_events_per_s": round(raw),
                    "ratios": {
                        "one_replica_vs_raw": round(one["sustained_events_per_s"] / raw, 3),
                        "two_vs_one_sustained": round(
                            two["sustained_events_per_s"] / one["sustained_events_per_s"], 3
                        ),
                        "two_vs_one_burst_drain": round(
                            one["burst_drained_s"] / max(two["burst_drained_s"], 1e-9), 3
                        ),
                        "headroom_one_replica": round(one["sustained_events_per_s"] / real_rate),
                    },
                },
                indent=2,
            )
        )
    finally:
        for server in servers:
            server.stop()
        nats_cluster.stop()
        pg.stop()
    return 0


def wait_consumer(urls: list[str], timeout_s: float = 60) -> None:
    """Until the first replica has created the stream and its durable consumer."""
    import nats

    async def check() -> None:
        nc = await nats.connect(servers=urls)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    await nc.jetstream().consumer_info(bus.STREAM, "denpex-ingest")
                    return
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
        finally:
            await nc.close()

    asyncio.run(check())


if __name__ == "__main__":
    sys.exit(main())
