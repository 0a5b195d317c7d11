"""What the fleet rules' incidents and the reports they read need.

incidents: `rules` (JSON list of every rule that fired for the cause, `rule` being the
first), `action` (the §7 action proposed for its component), `score` (the rule score its
confidence calibrates); a rule that resolves one says why in `resolution` (0002).
reports: the job's placement beyond its hosts — `started_ns`, `workload` (the workload's
name: reruns share it), `gpus` (JSON [{host, pci, serial, rank}]) and `labels` (JSON
{driver, image, …}). Existing rows get the empty values.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("incidents", sa.Column("rules", sa.Text, nullable=False, server_default="[]"))
    op.add_column("incidents", sa.Column("action", sa.Text, nullable=False, server_default="none"))
    op.add_column("incidents", sa.Column("score", sa.Float, nullable=False, server_default="0"))
    op.create_index(
        "incidents_component", "incidents", ["tenant", "component_kind", "component_id"]
    )
    op.add_column("reports", sa.Column("started_ns", sa.BigInteger))
    op.add_column("reports", sa.Column("workload", sa.Text))
    op.add_column("reports", sa.Column("gpus", sa.Text, nullable=False, server_default="[]"))
    op.add_column("reports", sa.Column("labels", sa.Text, nullable=False, server_default="{}"))
