"""Stored secrets (webhook URLs, IdP client secrets): per tenant and name, only in sealed
form (denpex.enterprise.envelope: AES-GCM under a data key the KMS wraps). In PostgreSQL a
tenant table like the others: row-level security (ENABLE + FORCE) on `denpex.tenant`.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

TENANT_ROLE = "denpex_tenant"


def upgrade() -> None:
    op.create_table(
        "secrets",
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("sealed", sa.Text, nullable=False),
        sa.Column("key_ref", sa.Text, nullable=False),
        sa.Column("updated_ns", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("tenant", "name"),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON secrets TO {TENANT_ROLE}")
        op.execute("ALTER TABLE secrets ENABLE ROW LEVEL SECURITY")
        op.execute("ALTER TABLE secrets FORCE ROW LEVEL SECURITY")
        op.execute(
            "CREATE POLICY tenant_isolation ON secrets "
            "USING (tenant = current_setting('denpex.tenant', true)) "
            "WITH CHECK (tenant = current_setting('denpex.tenant', true))"
        )


def downgrade() -> None:
    op.drop_table("secrets")
