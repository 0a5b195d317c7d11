"""Regions: the region that wrote each incident and audit record (`denpex server --region`
sets the column's default at start), so that the global read view, which gathers every
region's rows by PostgreSQL logical replication, keys them by (region, id) and
(region, seq). Empty for a server that names no region.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("incidents", "audit"):
        op.add_column(table, sa.Column("region", sa.Text, nullable=False, server_default=""))


def downgrade() -> None:
    for table in ("incidents", "audit"):
        op.drop_column(table, "region")
