"""The first schema: tenants, tokens, evidence, reports, incidents and the leader fence.

In PostgreSQL, evidence is partitioned by time range (ts_ns) with the tenant in every key, and
each tenant table has row-level security (ENABLE + FORCE) keyed on the setting
`denpex.tenant`; requests run as the role `denpex_tenant`, which owns nothing.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TENANT_ROLE = "denpex_tenant"
TENANT_TABLES = (
    "evidence",
    "hosts",
    "host_metrics",
    "reports",
    "report_hosts",
    "incidents",
    "incident_links",
)


def _evidence_columns() -> list[sa.Column]:
    return [
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("id", sa.Text, nullable=False),
        sa.Column("ts_ns", sa.BigInteger, nullable=False),
        sa.Column("received_ns", sa.BigInteger, nullable=False),
        sa.Column("host", sa.Text),
        sa.Column("job", sa.Text),
        sa.Column("rank", sa.Integer),
        sa.Column("pid", sa.Integer),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("signature", sa.Text, nullable=False),
        sa.Column("category", sa.Text, nullable=False),
        sa.Column("severity", sa.Text, nullable=False),
        sa.Column("summary", sa.Text, nullable=False),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("attrs", sa.Text, nullable=False),
    ]


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    op.create_table(
        "tenants",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("created_ns", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "tokens",
        sa.Column("token_id", sa.Text, primary_key=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("secret_hash", sa.Text, nullable=False),
        sa.Column("created_ns", sa.BigInteger, nullable=False),
        sa.Column("revoked_ns", sa.BigInteger),
        sa.Column("note", sa.Text, nullable=False, server_default=""),
    )
    if postgres:
        # The partition key must be in every unique key: (tenant, id, ts_ns).
        op.create_table(
            "evidence",
            *_evidence_columns(),
            sa.PrimaryKeyConstraint("tenant", "id", "ts_ns"),
            postgresql_partition_by="RANGE (ts_ns)",
        )
        op.execute("CREATE TABLE evidence_default PARTITION OF evidence DEFAULT")
    else:
        # A rowid table: rows append at its end, and the unique index on the event id is
        # small; a WITHOUT ROWID table keyed on the id moves whole rows around (measured:
        # ~30 % slower ingest).
        op.create_table("evidence", *_evidence_columns())
        op.create_index("evidence_id", "evidence", ["tenant", "id"], unique=True)
    # id last: keyset pagination (ts_ns DESC, id DESC) reads the index in order, no sort
    op.create_index("evidence_host_ts", "evidence", ["tenant", "host", "ts_ns", "id"])
    op.create_index("evidence_ts", "evidence", ["tenant", "ts_ns", "id"])
    op.create_table(
        "hosts",
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("first_ns", sa.BigInteger, nullable=False),
        sa.Column("last_ns", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("tenant", "name"),
    )
    op.create_table(
        "host_metrics",
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("labels", sa.Text, nullable=False),
        sa.Column("ts_ns", sa.BigInteger, nullable=False),
        sa.Column("value", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("tenant", "host", "name", "labels"),
    )
    op.create_table(
        "reports",
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("id", sa.Text, nullable=False),
        sa.Column("job", sa.Text),
        sa.Column("user_name", sa.Text),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("category", sa.Text, nullable=False),
        sa.Column("signature", sa.Text),
        sa.Column("confidence", sa.Float, nullable=False),
        sa.Column("root_host", sa.Text),
        sa.Column("root_rank", sa.Integer),
        sa.Column("hosts", sa.Text, nullable=False),
        sa.Column("ranks", sa.Text, nullable=False),
        sa.Column("scheduler", sa.Text, nullable=False),
        sa.Column("ended_ns", sa.BigInteger, nullable=False),
        sa.Column("received_ns", sa.BigInteger, nullable=False),
        sa.Column("correlated", sa.Integer, nullable=False, server_default="0"),
        sa.Column("diagnosis", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("tenant", "id"),
    )
    op.create_index("reports_job", "reports", ["tenant", "job"])
    op.create_index("reports_ended", "reports", ["tenant", "ended_ns"])
    op.create_index("reports_pending", "reports", ["tenant", "correlated"])
    op.create_table(
        "report_hosts",
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("report_id", sa.Text, nullable=False),
        sa.Column("ended_ns", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("tenant", "host", "report_id"),
    )
    op.create_table(
        "incidents",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("dedupe_key", sa.Text, nullable=False),
        sa.Column("rule", sa.Text, nullable=False),
        sa.Column("category", sa.Text, nullable=False),
        sa.Column("component_kind", sa.Text, nullable=False),
        sa.Column("component_id", sa.Text, nullable=False),
        sa.Column("title", sa.Text, nullable=False),
        sa.Column("explanation", sa.Text, nullable=False),
        sa.Column("confidence", sa.Float, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("first_ns", sa.BigInteger, nullable=False),
        sa.Column("last_ns", sa.BigInteger, nullable=False),
        sa.Column("opened_ns", sa.BigInteger, nullable=False),
        sa.Column("updated_ns", sa.BigInteger, nullable=False),
        sa.Column("acknowledged_by", sa.Text),
        sa.Column("acknowledged_ns", sa.BigInteger),
        sa.Column("resolved_by", sa.Text),
        sa.Column("resolved_ns", sa.BigInteger),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.UniqueConstraint("tenant", "dedupe_key", name="incidents_dedupe"),
    )
    op.create_index("incidents_list", "incidents", ["tenant", "status", "last_ns"])
    op.create_index("incidents_recent", "incidents", ["tenant", "last_ns"])
    op.create_table(
        "incident_links",
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("incident_id", sa.BigInteger, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("ref", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("tenant", "incident_id", "kind", "ref"),
    )
    op.create_index("incident_links_ref", "incident_links", ["tenant", "kind", "ref"])
    op.create_table(
        "leader",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("holder", sa.Text, nullable=False),
        sa.Column("renewed_ns", sa.BigInteger, nullable=False),
    )
    if postgres:
        _row_level_security()


def _row_level_security() -> None:
    op.execute(
        f"""DO $$ BEGIN
            IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{TENANT_ROLE}') THEN
                CREATE ROLE {TENANT_ROLE} NOLOGIN NOSUPERUSER NOBYPASSRLS;
            END IF;
        END $$"""
    )
    # The server switches to the tenant role (SET ROLE) in every transaction. Since
    # PostgreSQL 16 the creator of a role holds only ADMIN on it (createrole_self_grant is
    # empty by default): a member that may not SET ROLE, so the check there is 'SET'.
    op.execute(
        f"""DO $$ BEGIN
            IF current_setting('server_version_num')::int >= 160000 THEN
                IF NOT pg_has_role(current_user, '{TENANT_ROLE}', 'SET') THEN
                    EXECUTE format('GRANT {TENANT_ROLE} TO %I', current_user);
                END IF;
            ELSIF NOT pg_has_role(current_user, '{TENANT_ROLE}', 'MEMBER') THEN
                EXECUTE format('GRANT {TENANT_ROLE} TO %I', current_user);
            END IF;
        END $$"""
    )
    op.execute(f"GRANT USAGE ON SCHEMA public TO {TENANT_ROLE}")
    op.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {TENANT_ROLE}")
    for table in TENANT_TABLES:
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {TENANT_ROLE}")
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
        op.execute(
            f"CREATE POLICY tenant_isolation ON {table} "
            "USING (tenant = current_setting('denpex.tenant', true)) "
            "WITH CHECK (tenant = current_setting('denpex.tenant', true))"
        )
