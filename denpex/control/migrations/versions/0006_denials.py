"""The denial log: every request the policy set refused, per tenant (who, what, which policy,
the policy set's version). In PostgreSQL it is a tenant table like the others: row-level
security (ENABLE + FORCE) on `denpex.tenant`, written and read as `denpex_tenant`.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TENANT_ROLE = "denpex_tenant"


def upgrade() -> None:
    op.create_table(
        "denials",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("ts_ns", sa.BigInteger, nullable=False),
        sa.Column("principal", sa.Text, nullable=False),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("resource", sa.Text, nullable=False),
        sa.Column("attrs", sa.Text, nullable=False),
        sa.Column("policies", sa.Text, nullable=False),
        sa.Column("policy_version", sa.Text, nullable=False),
        sa.Column("message", sa.Text, nullable=False),
    )
    op.create_index("denials_recent", "denials", ["tenant", "id"])
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"GRANT SELECT, INSERT ON denials TO {TENANT_ROLE}")
        op.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {TENANT_ROLE}")
        op.execute("ALTER TABLE denials ENABLE ROW LEVEL SECURITY")
        op.execute("ALTER TABLE denials FORCE ROW LEVEL SECURITY")
        op.execute(
            "CREATE POLICY tenant_isolation ON denials "
            "USING (tenant = current_setting('denpex.tenant', true)) "
            "WITH CHECK (tenant = current_setting('denpex.tenant', true))"
        )


def downgrade() -> None:
    op.drop_table("denials")
