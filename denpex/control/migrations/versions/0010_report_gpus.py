"""Which job reports name a GPU: one row per (GPU serial or UUID, report), so that a
board's job history (`/api/v1/gpus/{gpu}/jobs`) follows it from host to host. In
PostgreSQL a tenant table like the others: row-level security (ENABLE + FORCE) on
`denpex.tenant`.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

TENANT_ROLE = "denpex_tenant"


def upgrade() -> None:
    op.create_table(
        "report_gpus",
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("gpu", sa.Text, nullable=False),
        sa.Column("report_id", sa.Text, nullable=False),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("ended_ns", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("tenant", "gpu", "report_id"),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON report_gpus TO {TENANT_ROLE}")
        op.execute("ALTER TABLE report_gpus ENABLE ROW LEVEL SECURITY")
        op.execute("ALTER TABLE report_gpus FORCE ROW LEVEL SECURITY")
        op.execute(
            "CREATE POLICY tenant_isolation ON report_gpus "
            "USING (tenant = current_setting('denpex.tenant', true)) "
            "WITH CHECK (tenant = current_setting('denpex.tenant', true))"
        )


def downgrade() -> None:
    op.drop_table("report_gpus")
