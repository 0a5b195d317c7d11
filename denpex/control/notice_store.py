"""The notifier's memory in the store (notify.SentMemory): which notice was handed to which
receiver, claimed before the first try and marked when the receiver accepted it, so that a
restarted or failed-over leader never sends a Slack, PagerDuty, Jira or webhook notice twice.

The claim is one insert on the notice's key (the table's primary key): of two leaders, or a
dead one and its successor, only one ever holds it. It must never release a claim whose
notice was accepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from denpex.control import schema as s
from denpex.control.db import Database
from denpex.core import jsonio
from denpex.remediation.notify import Notice

N = s.remediation_notices


class NoticeLedger:
    def __init__(self, db: Database) -> None:
        self.db = db

    def claim(self, key: str, channel: str, notice: Notice, now_ns: int) -> bool:
        try:
            with self.db.system_tx(write=True) as conn:
                conn.execute(
                    N.insert().values(
                        key=key,
                        tenant=notice.tenant,
                        channel=channel,
                        kind=notice.kind,
                        plan_id=notice.plan_id,
                        claimed_ns=now_ns,
                        sent_ns=None,
                        record="{}",
                    )
                )
        except sa.exc.IntegrityError:
            return False
        return True

    def sent(self, key: str, record: Mapping[str, Any], now_ns: int) -> None:
        with self.db.system_tx(write=True) as conn:
            conn.execute(
                N.update()
                .where(N.c.key == key)
                .values(sent_ns=now_ns, record=jsonio.dumps(dict(record)).decode())
            )

    def release(self, key: str) -> None:
        with self.db.system_tx(write=True) as conn:
            conn.execute(N.delete().where(N.c.key == key, N.c.sent_ns.is_(None)))

    def notices(self, tenant: str, limit: int = 100) -> list[dict[str, Any]]:
        """The tenant's notices, newest first (sent_ns None: claimed, acceptance not known)."""
        with self.db.system_tx() as conn:
            rows = conn.execute(
                sa.select(N)
                .where(N.c.tenant == tenant)
                .order_by(N.c.claimed_ns.desc())
                .limit(limit)
            ).all()
        return [
            {
                "key": r.key,
                "channel": r.channel,
                "kind": r.kind,
                "plan": r.plan_id,
                "claimed_ns": r.claimed_ns,
                "sent_ns": r.sent_ns,
                "record": jsonio.loads(r.record),
            }
            for r in rows
        ]
