"""The agent's evidence delivery, built from its configuration: the disk spool, its
dead-letter segment, the shipper (to an OTLP/HTTP endpoint or the JetStream stream), and the handoff that acknowledges each collector's
poll once its evidence is in the spool; with their self-metrics and their word in /healthz.

It never hides a failure: a spool that cannot write turns /healthz degraded, and every
failed append, refused export and dropped record is a counter on /metrics.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from denpex.agent.config import AgentConfig
from denpex.agent.dead_letter import dead_letter_dir, requeue_into
from denpex.agent.exposition import SelfMetric
from denpex.agent.handoff import Handoff
from denpex.agent.shipper import Exporter, Shipper
from denpex.agent.spool import Spool

DEAD_LETTER_SHARE = 4  # the dead-letter segment may hold a quarter of the spool's bound


class Delivery:
    """Spool → shipper → OTLP endpoint, and the handoff the pipeline writes through."""

    def __init__(self, spool: Spool, dead_letter: Spool, shipper: Shipper) -> None:
        self.spool = spool
        self.dead_letter = dead_letter
        self.shipper = shipper
        self.handoff = Handoff(shipper.submit_evidence)

    @classmethod
    def from_config(cls, config: AgentConfig, helps: Mapping[str, str]) -> Delivery | None:
        """None without an OTLP endpoint (evidence then stays in the agent's ring)."""
        otlp = config.otlp
        if not otlp.get("endpoint"):
            return None
        from denpex.agent.otlp import OtlpHttpExporter

        settings = config.spool
        directory = config.state_dir / "spool"
        max_bytes = int(settings["max_bytes"])
        spool = Spool(
            directory,
            max_bytes=max_bytes,
            max_age_s=float(settings["max_age_s"]),
            fsync=str(settings["fsync"]),
        )
        dead = Spool(
            dead_letter_dir(directory),
            max_bytes=max(1 << 20, max_bytes // DEAD_LETTER_SHARE),
            max_age_s=float(settings["max_age_s"]),
            fsync=str(settings["fsync"]),
        )
        exporter: Exporter
        if otlp.get("jetstream"):
            from denpex.agent.jetstream import JetStreamExporter

            jetstream = otlp["jetstream"]
            exporter = JetStreamExporter(
                jetstream["servers"],
                jetstream["token"],
                timeout_s=float(otlp["timeout_s"]),
                name=f"denpex-agent {config.host}",
            )
        else:
            exporter = OtlpHttpExporter(
                str(otlp["endpoint"]),
                protocol=str(otlp["protocol"]),
                headers={str(k): str(v) for k, v in (otlp.get("headers") or {}).items()},
                timeout_s=float(otlp["timeout_s"]),
            )
        return cls(spool, dead, Shipper(spool, exporter, helps=helps, dead_letter=dead))

    def start(self) -> None:
        self.shipper.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self.handoff.flush()
        self.shipper.stop(timeout=timeout_s)
        close = getattr(self.shipper.exporter, "close", None)
        if close is not None:  # the JetStream exporter's connection and loop thread
            close()
        self.spool.close()
        self.dead_letter.close()

    def requeue_dead_letter(self) -> int:
        """Move the dead-letter records back into the spool (the endpoint was fixed)."""
        moved = requeue_into(self.spool, self.dead_letter)
        self.shipper.wake()
        return moved

    def health(self) -> dict[str, Any]:
        """`status` ok, or degraded while evidence cannot be written to the spool."""
        handoff = self.handoff.stats()
        spool = self.spool.stats()
        writable = handoff["writable"] and spool["writable"]
        return {
            "status": "ok" if writable else "degraded",
            "writable": writable,
            "error": handoff["last_error"] or spool["last_error"],
            "failing_since_ns": handoff["failing_since_ns"],
            "waiting_records": handoff["waiting_records"],
            "pending_records": spool["records_pending"],
            "dead_letter_records": self.dead_letter.stats()["records_pending"],
            "last_export_error": self.shipper.stats()["last_error"],
        }

    def metrics(self) -> list[SelfMetric]:
        spool, handoff = self.spool.stats(), self.handoff.stats()
        shipper = self.shipper.stats()
        out = [
            SelfMetric(
                "spool_writable", "1 while evidence can be written to the spool", spool_ok(self)
            ),
            SelfMetric(
                "spool_records_pending",
                "Spooled records not yet delivered",
                spool["records_pending"],
            ),
            SelfMetric("spool_bytes", "Bytes in the spool's segments", spool["bytes"]),
            SelfMetric(
                "spool_waiting_records",
                "Evidence held in memory because the spool cannot write (a full disk)",
                handoff["waiting_records"],
            ),
            SelfMetric(
                "spool_appended_total", "Records written to the spool", spool["appended_total"]
            ),
            SelfMetric(
                "spool_dead_letter_records",
                "Records the endpoint refused for good, kept in the dead-letter segment",
                self.dead_letter.stats()["records_pending"],
            ),
        ]
        errors = "Failed spool writes (appends, cursor updates), by operation"
        out += [
            SelfMetric(
                "spool_errors_total", errors, spool["write_errors_total"], {"operation": "append"}
            ),
            SelfMetric(
                "spool_errors_total", errors, spool["cursor_errors_total"], {"operation": "cursor"}
            ),
        ]
        dropped = "Spooled or spool-bound records dropped, by reason"
        for reason, count in sorted(spool["dropped_total"].items()):
            out.append(SelfMetric("spool_dropped_total", dropped, count, {"reason": reason}))
        out.append(
            SelfMetric(
                "spool_dropped_total", dropped, handoff["dropped_total"], {"reason": "unwritable"}
            )
        )
        out += [
            SelfMetric(
                "otlp_sent_total",
                "Records and data points the endpoint accepted",
                shipper["sent_total"],
            ),
            SelfMetric(
                "otlp_backlog_records",
                "Spooled records waiting for the endpoint",
                shipper["backlog"],
            ),
            SelfMetric(
                "otlp_last_success_timestamp_seconds",
                "When the endpoint last accepted an export",
                (shipper["last_success_ns"] or 0) / 1e9,
            ),
            SelfMetric(
                "otlp_split_batches_total",
                "Batches halved after a 413 answer",
                shipper["split_batches_total"],
            ),
        ]
        failed = "Exports that failed, by HTTP status (network: no answer)"
        for status, count in sorted(shipper["failed_by_status"].items()):
            out.append(SelfMetric("otlp_failed_exports_total", failed, count, {"status": status}))
        dead = "Records moved to the dead-letter segment, by the status that refused them"
        for status, count in sorted(shipper["dead_lettered_by_status"].items()):
            out.append(SelfMetric("otlp_dead_lettered_total", dead, count, {"status": status}))
        drop = "Records and data points not delivered, by reason"
        for reason, count in sorted(shipper["dropped_by_reason"].items()):
            out.append(SelfMetric("otlp_dropped_total", drop, count, {"reason": reason}))
        return out


def spool_ok(delivery: Delivery) -> float:
    return 1.0 if delivery.health()["writable"] else 0.0
