"""Similar-incident search inside PostgreSQL when the server has pgvector: a `vector(384)`
column beside each stored embedding (incident_vectors.embedding), so the nearest incidents
are found by `<=>` in the database instead of reading every vector out for numpy.

Only where the extension is available and may be created (pg_available_extensions; a
savepoint keeps a refusal from aborting the migration); SQLite and a PostgreSQL without
pgvector (Debian 12 ships none) are left as they are and keep the numpy search. Existing
rows get their column filled by the server (denpex.control.incident_index) on start.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

DIM = 384  # all-MiniLM-L6-v2, denpex.retrieval.embedding.DIM


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    available = bind.exec_driver_sql(
        "SELECT 1 FROM pg_available_extensions WHERE name = 'vector'"
    ).scalar()
    if not available:
        return
    try:
        with bind.begin_nested():
            bind.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS vector")
    except sa.exc.DBAPIError:
        return  # no right to create it here: the numpy search it is
    op.execute(f"ALTER TABLE incident_vectors ADD COLUMN embedding vector({DIM})")


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    op.execute("ALTER TABLE incident_vectors DROP COLUMN IF EXISTS embedding")
