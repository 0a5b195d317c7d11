"""Server-wide secrets shared by every replica (the web UI's session key): not tenant data,
so no row-level security; read and written only through Store.server_secret().

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "server_secrets",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
        sa.Column("created_ns", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("server_secrets")
