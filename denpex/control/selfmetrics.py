"""The server's own Prometheus metrics (`/metrics`), on a registry of its own so that two
servers in one process (tests) never share counters.

Names are `denpex_server_*`; it must never put a tenant's data (hosts, jobs) in a label,
only tenant names, routes and outcomes.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "denpex_server_requests", "HTTP requests answered", ["route", "status"], registry=r
        )
        self.latency = Histogram(
            "denpex_server_request_seconds",
            "Time to answer a request",
            ["route"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=r,
        )
        self.ingested = Counter(
            "denpex_server_ingested_records",
            "Records stored, by kind (evidence, metric, report)",
            ["tenant", "kind"],
            registry=r,
        )
        self.duplicates = Counter(
            "denpex_server_duplicate_records",
            "Records received again under a stored id (at-least-once redelivery)",
            ["tenant", "kind"],
            registry=r,
        )
        self.rejected = Counter(
            "denpex_server_rejected_requests",
            "Ingest requests refused whole, by HTTP status",
            ["status"],
            registry=r,
        )
        self.leader = Gauge(
            "denpex_server_leader", "1 while this replica runs the leader loops", registry=r
        )
        self.epoch = Gauge("denpex_server_leader_epoch", "The epoch this replica leads", registry=r)
        self.fenced = Counter(
            "denpex_server_fenced_writes",
            "Leader writes refused because a newer epoch exists",
            registry=r,
        )
        self.incidents = Counter(
            "denpex_server_incidents_written",
            "Incidents opened or grown by the correlation pass",
            registry=r,
        )
        self.loop_errors = Counter(
            "denpex_server_leader_loop_errors", "Leader loop passes that failed", registry=r
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
