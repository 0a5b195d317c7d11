"""Remediation (Layer 5): plans, their step records, policies, tripped guards, and the
hash-chained audit log.

These are written in one transaction with the audit record that describes them, and the audit
chain spans every tenant; so they are system tables (written as the store's own role, like
tokens) whose every query filters by its `tenant` column in code. The audit table is
append-only by convention and tamper-evident by construction (denpex.core.audit).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "audit",
        sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("ts_ns", sa.BigInteger, nullable=False),
        sa.Column("tenant", sa.Text),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("hash", sa.Text, nullable=False),
        sa.Column("line", sa.Text, nullable=False),  # the record's canonical JSON
    )
    op.create_table(
        "remediation_plans",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("incident_id", sa.BigInteger, nullable=False),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("pool", sa.Text),
        sa.Column("plan", sa.Text, nullable=False),  # JSON: Plan.to_dict()
        sa.Column("tier", sa.Text, nullable=False),
        sa.Column("state", sa.Text, nullable=False),  # machine.State
        sa.Column("status", sa.Text, nullable=False),  # plan_status in remediation.policy
        sa.Column("waiting_for", sa.Text),  # the step a human must approve, if any
        sa.Column("approved_step", sa.Text),  # the step a human approved last
        sa.Column("decided_by", sa.Text),
        sa.Column("note", sa.Text, nullable=False, server_default=""),
        sa.Column("created_ns", sa.BigInteger, nullable=False),
        sa.Column("updated_ns", sa.BigInteger, nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.UniqueConstraint("tenant", "incident_id", "host", name="one_plan_per_target"),
    )
    op.create_index("remediation_plans_status", "remediation_plans", ["tenant", "status"])
    op.create_table(
        "remediation_steps",
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("plan_id", sa.BigInteger, primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("phase", sa.Text, nullable=False),  # started | finished
        sa.Column("event", sa.Text),  # the machine event a finished step produced
        sa.Column("result", sa.Text, nullable=False),  # JSON: StepResult.to_dict() or {}
        sa.Column("ts_ns", sa.BigInteger, nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "remediation_policies",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("policy", sa.Text, nullable=False),  # JSON, as policy.yaml's tenant entry
        sa.Column("updated_ns", sa.BigInteger, nullable=False),
        sa.Column("updated_by", sa.Text, nullable=False),
    )
    op.create_table(
        "remediation_guards",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("pool", sa.Text, primary_key=True),
        sa.Column("tripped_ns", sa.BigInteger, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
    )


def downgrade() -> None:
    for table in (
        "remediation_guards",
        "remediation_policies",
        "remediation_steps",
        "remediation_plans",
        "audit",
    ):
        op.drop_table(table)
