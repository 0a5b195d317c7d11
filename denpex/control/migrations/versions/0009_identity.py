"""Enterprise identity: token owners and expiry (SSO sessions, deprovisioning), the SAML
service provider's ledger of request and assertion ids (InResponseTo and replay, shared by
every replica), SCIM users, groups and memberships, TOTP enrolments with hashed recovery
codes, WebAuthn credentials, and per-tenant identity settings (MFA required). The SCIM, MFA and settings tables are tenant
tables: in PostgreSQL row-level security (ENABLE + FORCE) on `denpex.tenant`; the SAML ledger
is a system table.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

TENANT_ROLE = "denpex_tenant"
TENANT_TABLES = ("scim_users", "scim_groups", "scim_members", "mfa_totp", "mfa_recovery",
                 "mfa_webauthn", "tenant_settings")  # fmt: skip


def upgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.add_column(sa.Column("owner", sa.Text))
        batch.add_column(sa.Column("expires_ns", sa.BigInteger))
    op.create_index("tokens_owner", "tokens", ["tenant", "owner"])
    op.create_table(
        "saml_ids",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("kind", sa.Text, nullable=False),  # request | assertion
        sa.Column("expires_ns", sa.BigInteger, nullable=False),
        sa.Column("used_ns", sa.BigInteger),
    )
    op.create_table(
        "scim_users",
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("id", sa.Text, nullable=False),
        sa.Column("user_name", sa.Text, nullable=False),
        sa.Column("external_id", sa.Text),
        sa.Column("active", sa.Boolean, nullable=False),
        sa.Column("role", sa.Text),  # what its groups give it in this tenant (None: nothing)
        sa.Column("resource", sa.Text, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("created_ns", sa.BigInteger, nullable=False),
        sa.Column("updated_ns", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("tenant", "id"),
        sa.UniqueConstraint("tenant", "user_name"),
    )
    op.create_table(
        "scim_groups",
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("id", sa.Text, nullable=False),
        sa.Column("display_name", sa.Text, nullable=False),
        sa.Column("external_id", sa.Text),
        sa.Column("resource", sa.Text, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("created_ns", sa.BigInteger, nullable=False),
        sa.Column("updated_ns", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("tenant", "id"),
    )
    op.create_table(
        "scim_members",
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("group_id", sa.Text, nullable=False),
        sa.Column("user_id", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("tenant", "group_id", "user_id"),
    )
    op.create_table(
        "mfa_totp",
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("subject", sa.Text, nullable=False),
        sa.Column("sealed", sa.Text, nullable=False),  # the TOTP key, envelope-sealed
        sa.Column("created_ns", sa.BigInteger, nullable=False),
        sa.Column("confirmed_ns", sa.BigInteger),
        sa.Column("last_step", sa.BigInteger, nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("tenant", "subject"),
    )
    op.create_table(
        "mfa_recovery",
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("subject", sa.Text, nullable=False),
        sa.Column("code_hash", sa.Text, nullable=False),
        sa.Column("used_ns", sa.BigInteger),
        sa.PrimaryKeyConstraint("tenant", "subject", "code_hash"),
    )
    op.create_table(
        "mfa_webauthn",
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("credential_id", sa.Text, nullable=False),  # base64url
        sa.Column("subject", sa.Text, nullable=False),
        sa.Column("public_key", sa.Text, nullable=False),  # COSE, base64url
        sa.Column("sign_count", sa.BigInteger, nullable=False),
        sa.Column("created_ns", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("tenant", "credential_id"),
    )
    op.create_table(
        "tenant_settings",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("mfa_required", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("updated_ns", sa.BigInteger, nullable=False),
    )
    if op.get_bind().dialect.name == "postgresql":
        for table in TENANT_TABLES:
            op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {TENANT_ROLE}")
            op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
            op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
            op.execute(
                f"CREATE POLICY tenant_isolation ON {table} "
                "USING (tenant = current_setting('denpex.tenant', true)) "
                "WITH CHECK (tenant = current_setting('denpex.tenant', true))"
            )


def downgrade() -> None:
    for table in (*TENANT_TABLES, "saml_ids"):
        op.drop_table(table)
    op.drop_index("tokens_owner", "tokens")
    with op.batch_alter_table("tokens") as batch:
        batch.drop_column("expires_ns")
        batch.drop_column("owner")
