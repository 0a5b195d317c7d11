"""Remediation, continued: each tenant's warm-spare pool (the hosts a human added or asked to
remove, what the leader's last preflight of each found) and the notices already handed to a
receiver (Slack, PagerDuty, Jira, webhooks), so that a restarted or failed-over leader never
sends one twice.

System tables like the other remediation tables (0005): written as the store's own role,
every query filtering by its `tenant` column in code.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "remediation_spares",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("host", sa.Text, primary_key=True),
        sa.Column("pool", sa.Text),  # None: a spare for any pool
        # requested | validated | unchecked | failed | taken | removing (denpex.remediation.spares)
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("added_ns", sa.BigInteger, nullable=False),
        sa.Column("added_by", sa.Text, nullable=False),
        sa.Column("validated_ns", sa.BigInteger),  # the last passed preflight
        sa.Column("checked_ns", sa.BigInteger),  # the last preflight, passed or not
        sa.Column("results", sa.Text, nullable=False),  # JSON: the last preflight's checks
        sa.Column("note", sa.Text, nullable=False),
        sa.Column("updated_ns", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "remediation_notices",
        sa.Column("key", sa.Text, primary_key=True),  # the channel's name + the notice's key
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("channel", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("plan_id", sa.BigInteger),
        sa.Column("claimed_ns", sa.BigInteger, nullable=False),  # before the first try
        sa.Column("sent_ns", sa.BigInteger),  # the receiver accepted it (None: not known)
        sa.Column("record", sa.Text, nullable=False),  # JSON: the delivery's record
    )
    op.create_index("remediation_notices_tenant", "remediation_notices", ["tenant", "claimed_ns"])


def downgrade() -> None:
    op.drop_table("remediation_notices")
    op.drop_table("remediation_spares")
