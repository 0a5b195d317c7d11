"""Per-tenant ingest quotas: a token bucket of records per second on each replica.

A request over quota is refused whole with 429 and a Retry-After (the agent's exporter
retries those later, from its spool); it must never admit part of a request.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class QuotaPolicy:
    records_per_s: float = 50_000.0  # sustained, per tenant and replica
    burst: float = 200_000.0  # what a tenant may send at once after being idle
    overrides: tuple[tuple[str, float, float], ...] = ()  # (tenant, records_per_s, burst)


class Quotas:
    def __init__(self, policy: QuotaPolicy, *, clock=time.monotonic) -> None:
        self.policy = policy
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant → (tokens, last time)
        self._limits = {t: (rate, burst) for t, rate, burst in policy.overrides}

    def admit(self, tenant: str, records: int) -> float | None:
        """None when `records` fit now (and takes them), else seconds until they would."""
        rate, burst = self._limits.get(tenant, (self.policy.records_per_s, self.policy.burst))
        if records > burst:
            return None if rate <= 0 else self._wait(tenant, rate, burst, records)
        with self._lock:
            now = self._clock()
            tokens, last = self._buckets.get(tenant, (burst, now))
            tokens = min(burst, tokens + (now - last) * rate)
            if tokens >= records:
                self._buckets[tenant] = (tokens - records, now)
                return None
            self._buckets[tenant] = (tokens, now)
            return (records - tokens) / rate if rate > 0 else 60.0

    def _wait(self, tenant: str, rate: float, burst: float, records: int) -> float | None:
        # A batch larger than the burst can never fit: admit it only into a full bucket.
        with self._lock:
            now = self._clock()
            tokens, last = self._buckets.get(tenant, (burst, now))
            tokens = min(burst, tokens + (now - last) * rate)
            if tokens >= burst:
                self._buckets[tenant] = (0.0, now)
                return None
            self._buckets[tenant] = (tokens, now)
            return (burst - tokens) / rate
