"""Retrieval beside the incidents: how an incident was resolved (a note), and one embedding
per incident and model, so similar past incidents are found without embedding them again.

In PostgreSQL the new table gets the same row-level security as every tenant table.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TENANT_ROLE = "denpex_tenant"


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    op.add_column("incidents", sa.Column("resolution", sa.Text))
    op.create_table(
        "incident_vectors",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("incident_id", sa.BigInteger, primary_key=True),
        sa.Column("model", sa.Text, primary_key=True),
        sa.Column("text_key", sa.Text, nullable=False),  # the text the vector was made from
        sa.Column("vector", sa.LargeBinary, nullable=False),  # float32, little-endian
    )
    if postgres:
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON incident_vectors TO {TENANT_ROLE}")
        op.execute("ALTER TABLE incident_vectors ENABLE ROW LEVEL SECURITY")
        op.execute("ALTER TABLE incident_vectors FORCE ROW LEVEL SECURITY")
        op.execute(
            "CREATE POLICY tenant_isolation ON incident_vectors "
            "USING (tenant = current_setting('denpex.tenant', true)) "
            "WITH CHECK (tenant = current_setting('denpex.tenant', true))"
        )


def downgrade() -> None:
    op.drop_table("incident_vectors")
    op.drop_column("incidents", "resolution")
