"""Each tenant's data key for evidence bodies marked sensitive, stored only wrapped by the
KMS (denpex.enterprise.envelope): the bodies are sealed under it in the evidence table; a key
rotation re-wraps this one row per tenant and leaves the bodies as they are. In PostgreSQL a
tenant table like the others: row-level security (ENABLE + FORCE) on `denpex.tenant`.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

TENANT_ROLE = "denpex_tenant"


def upgrade() -> None:
    op.create_table(
        "tenant_keys",
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("purpose", sa.Text, nullable=False),
        sa.Column("wrapped", sa.Text, nullable=False),
        sa.Column("key_ref", sa.Text, nullable=False),
        sa.Column("created_ns", sa.BigInteger, nullable=False),
        sa.Column("rewrapped_ns", sa.BigInteger),
        sa.PrimaryKeyConstraint("tenant", "purpose"),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"GRANT SELECT, INSERT, UPDATE ON tenant_keys TO {TENANT_ROLE}")
        op.execute("ALTER TABLE tenant_keys ENABLE ROW LEVEL SECURITY")
        op.execute("ALTER TABLE tenant_keys FORCE ROW LEVEL SECURITY")
        op.execute(
            "CREATE POLICY tenant_isolation ON tenant_keys "
            "USING (tenant = current_setting('denpex.tenant', true)) "
            "WITH CHECK (tenant = current_setting('denpex.tenant', true))"
        )


def downgrade() -> None:
    op.drop_table("tenant_keys")
