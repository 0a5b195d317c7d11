"""The store's tables as SQLAlchemy Core objects, the one place queries take names from.

The DDL that creates them lives in migrations/versions (Alembic): change both together, in a
new migration, never by editing an applied one. Every table with a `tenant` column is
tenant data: queried only through denpex.control.store.TenantStore, which filters by it (and,
in PostgreSQL, row-level security filters a second time).
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite: INTEGER PRIMARY KEY

tenants = sa.Table(
    "tenants",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("created_ns", sa.BigInteger, nullable=False),
)

tokens = sa.Table(
    "tokens",
    metadata,
    sa.Column("token_id", sa.Text, primary_key=True),
    sa.Column("tenant", sa.Text, nullable=False),
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("secret_hash", sa.Text, nullable=False),
    sa.Column("created_ns", sa.BigInteger, nullable=False),
    sa.Column("revoked_ns", sa.BigInteger),
    sa.Column("note", sa.Text, nullable=False, server_default=""),
    sa.Column("owner", sa.Text),  # the person it stands for (saml:<name id>, scim:<id>): 0009
    sa.Column("expires_ns", sa.BigInteger),  # None: until revoked (an SSO session's: its end)
)

evidence = sa.Table(
    "evidence",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("ts_ns", sa.BigInteger, nullable=False),  # 0: the source gave no time
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
    sa.Column("attrs", sa.Text, nullable=False),  # JSON: {"attrs": {...}, "captures": {...}}
)

hosts = sa.Table(
    "hosts",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("first_ns", sa.BigInteger, nullable=False),
    sa.Column("last_ns", sa.BigInteger, nullable=False),
)

host_metrics = sa.Table(  # the latest value of each series a host's agent sent
    "host_metrics",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("host", sa.Text, primary_key=True),
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("labels", sa.Text, primary_key=True),  # canonical JSON of the point's labels
    sa.Column("ts_ns", sa.BigInteger, nullable=False),
    sa.Column("value", sa.Float, nullable=False),
)

reports = sa.Table(
    "reports",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("job", sa.Text),
    sa.Column("user_name", sa.Text),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("category", sa.Text, nullable=False),
    sa.Column("signature", sa.Text),
    sa.Column("confidence", sa.Float, nullable=False),
    sa.Column("root_host", sa.Text),
    sa.Column("root_rank", sa.Integer),
    sa.Column("hosts", sa.Text, nullable=False),  # JSON list
    sa.Column("ranks", sa.Text, nullable=False),  # JSON list
    sa.Column("scheduler", sa.Text, nullable=False),  # JSON object of scheduler ids
    sa.Column("ended_ns", sa.BigInteger, nullable=False),
    sa.Column("received_ns", sa.BigInteger, nullable=False),
    sa.Column("correlated", sa.Integer, nullable=False, server_default="0"),
    sa.Column("diagnosis", sa.Text, nullable=False),  # the denpex.diagnosis/v1 JSON
    # 0003: the job's placement beyond its hosts, for the fleet rules
    sa.Column("started_ns", sa.BigInteger),
    sa.Column("workload", sa.Text),  # the workload's name: reruns of one workload share it
    sa.Column("gpus", sa.Text, nullable=False, server_default="[]"),  # JSON [{host, pci, …}]
    sa.Column("labels", sa.Text, nullable=False, server_default="{}"),  # JSON {driver, …}
)

report_hosts = sa.Table(
    "report_hosts",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("host", sa.Text, primary_key=True),
    sa.Column("report_id", sa.Text, primary_key=True),
    sa.Column("ended_ns", sa.BigInteger, nullable=False),
)

report_gpus = sa.Table(  # 0009: which reports name a GPU (by serial or UUID: both follow the board)
    "report_gpus",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("gpu", sa.Text, primary_key=True),
    sa.Column("report_id", sa.Text, primary_key=True),
    sa.Column("host", sa.Text, nullable=False),
    sa.Column("ended_ns", sa.BigInteger, nullable=False),
)

incidents = sa.Table(
    "incidents",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("tenant", sa.Text, nullable=False),
    sa.Column("dedupe_key", sa.Text, nullable=False),
    sa.Column("rule", sa.Text, nullable=False),
    sa.Column("category", sa.Text, nullable=False),
    sa.Column("component_kind", sa.Text, nullable=False),
    sa.Column("component_id", sa.Text, nullable=False),
    sa.Column("title", sa.Text, nullable=False),
    sa.Column("explanation", sa.Text, nullable=False),
    sa.Column("confidence", sa.Float, nullable=False),
    sa.Column("status", sa.Text, nullable=False),  # open | acknowledged | resolved
    sa.Column("first_ns", sa.BigInteger, nullable=False),
    sa.Column("last_ns", sa.BigInteger, nullable=False),
    sa.Column("opened_ns", sa.BigInteger, nullable=False),
    sa.Column("updated_ns", sa.BigInteger, nullable=False),
    sa.Column("acknowledged_by", sa.Text),
    sa.Column("acknowledged_ns", sa.BigInteger),
    sa.Column("resolved_by", sa.Text),
    sa.Column("resolved_ns", sa.BigInteger),
    sa.Column("epoch", sa.BigInteger, nullable=False),  # the leader epoch that wrote it
    sa.Column("resolution", sa.Text),  # what the resolver said was done (migration 0002)
    # 0003: the fleet rules' incidents
    sa.Column("rules", sa.Text, nullable=False, server_default="[]"),  # JSON: every rule fired
    sa.Column("action", sa.Text, nullable=False, server_default="none"),  # §7 action proposed
    sa.Column("score", sa.Float, nullable=False, server_default="0"),  # what confidence calibrates
    sa.Column("region", sa.Text, nullable=False, server_default=""),  # 0008: who wrote it
)

incident_vectors = sa.Table(  # one embedding per incident and model, for retrieval
    "incident_vectors",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("incident_id", sa.BigInteger, primary_key=True),
    sa.Column("model", sa.Text, primary_key=True),
    sa.Column("text_key", sa.Text, nullable=False),
    sa.Column("vector", sa.LargeBinary, nullable=False),
)

incident_links = sa.Table(
    "incident_links",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("incident_id", sa.BigInteger, primary_key=True),
    sa.Column("kind", sa.Text, primary_key=True),  # evidence | job | host | report
    sa.Column("ref", sa.Text, primary_key=True),
)

denials = sa.Table(
    "denials",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("tenant", sa.Text, nullable=False),
    sa.Column("ts_ns", sa.BigInteger, nullable=False),
    sa.Column("principal", sa.Text, nullable=False),  # token:<id>, never a secret
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("action", sa.Text, nullable=False),
    sa.Column("resource", sa.Text, nullable=False),
    sa.Column("attrs", sa.Text, nullable=False),  # JSON: the resource's attributes
    sa.Column("policies", sa.Text, nullable=False),  # JSON list: the deciding policy ids
    sa.Column("policy_version", sa.Text, nullable=False),
    sa.Column("message", sa.Text, nullable=False),
)

secrets = sa.Table(
    "secrets",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("sealed", sa.Text, nullable=False),  # denpex.sealed/v1 JSON, never plaintext
    sa.Column("key_ref", sa.Text, nullable=False),  # the KEK (version) its data key is under
    sa.Column("updated_ns", sa.BigInteger, nullable=False),
)

tenant_keys = sa.Table(  # migration 0013: a tenant's data keys, only ever wrapped by the KMS
    "tenant_keys",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("purpose", sa.Text, primary_key=True),  # "evidence": sensitive evidence bodies
    sa.Column("wrapped", sa.Text, nullable=False),  # envelope.wrapped_text
    sa.Column("key_ref", sa.Text, nullable=False),  # the KEK (version) it is wrapped under
    sa.Column("created_ns", sa.BigInteger, nullable=False),
    sa.Column("rewrapped_ns", sa.BigInteger),
)

server_secrets = sa.Table(  # shared by every replica; never tenant data, never in a page
    "server_secrets",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
    sa.Column("created_ns", sa.BigInteger, nullable=False),
)

leader = sa.Table(
    "leader",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Column("holder", sa.Text, nullable=False),
    sa.Column("renewed_ns", sa.BigInteger, nullable=False),
)

TENANT_TABLES = (
    "evidence",
    "hosts",
    "host_metrics",
    "reports",
    "report_hosts",
    "report_gpus",
    "incidents",
    "incident_links",
    "incident_vectors",
    "denials",
    "secrets",
    "scim_users",
    "scim_groups",
    "scim_members",
    "mfa_totp",
    "mfa_recovery",
    "mfa_webauthn",
    "tenant_settings",
    "tenant_keys",
)

# --- remediation and the audit log (migration 0005): system tables, filtered by
# their tenant column in code (denpex.control.remediation_store) ------------------------------

audit = sa.Table(
    "audit",
    metadata,
    sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("ts_ns", sa.BigInteger, nullable=False),
    sa.Column("tenant", sa.Text),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("hash", sa.Text, nullable=False),
    sa.Column("line", sa.Text, nullable=False),
    sa.Column("region", sa.Text, nullable=False, server_default=""),  # 0008: who wrote it
)

remediation_plans = sa.Table(
    "remediation_plans",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("tenant", sa.Text, nullable=False),
    sa.Column("incident_id", sa.BigInteger, nullable=False),
    sa.Column("host", sa.Text, nullable=False),
    sa.Column("pool", sa.Text),
    sa.Column("plan", sa.Text, nullable=False),
    sa.Column("tier", sa.Text, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("waiting_for", sa.Text),
    sa.Column("approved_step", sa.Text),
    sa.Column("decided_by", sa.Text),
    sa.Column("note", sa.Text, nullable=False, server_default=""),
    sa.Column("created_ns", sa.BigInteger, nullable=False),
    sa.Column("updated_ns", sa.BigInteger, nullable=False),
    sa.Column("epoch", sa.BigInteger, nullable=False),
)

remediation_steps = sa.Table(
    "remediation_steps",
    metadata,
    sa.Column("tenant", sa.Text, nullable=False),
    sa.Column("plan_id", sa.BigInteger, primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("phase", sa.Text, nullable=False),
    sa.Column("event", sa.Text),
    sa.Column("result", sa.Text, nullable=False),
    sa.Column("ts_ns", sa.BigInteger, nullable=False),
    sa.Column("epoch", sa.BigInteger, nullable=False),
)

remediation_policies = sa.Table(
    "remediation_policies",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("policy", sa.Text, nullable=False),
    sa.Column("updated_ns", sa.BigInteger, nullable=False),
    sa.Column("updated_by", sa.Text, nullable=False),
)

remediation_guards = sa.Table(
    "remediation_guards",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("pool", sa.Text, primary_key=True),
    sa.Column("tripped_ns", sa.BigInteger, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
)

remediation_spares = sa.Table(  # migration 0012: each tenant's warm-spare pool
    "remediation_spares",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("host", sa.Text, primary_key=True),
    sa.Column("pool", sa.Text),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("added_ns", sa.BigInteger, nullable=False),
    sa.Column("added_by", sa.Text, nullable=False),
    sa.Column("validated_ns", sa.BigInteger),
    sa.Column("checked_ns", sa.BigInteger),
    sa.Column("results", sa.Text, nullable=False),
    sa.Column("note", sa.Text, nullable=False),
    sa.Column("updated_ns", sa.BigInteger, nullable=False),
)

remediation_notices = sa.Table(  # migration 0012: notices handed to a receiver, once each
    "remediation_notices",
    metadata,
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("tenant", sa.Text, nullable=False),
    sa.Column("channel", sa.Text, nullable=False),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("plan_id", sa.BigInteger),
    sa.Column("claimed_ns", sa.BigInteger, nullable=False),
    sa.Column("sent_ns", sa.BigInteger),
    sa.Column("record", sa.Text, nullable=False),
)


# --- enterprise identity (migration 0009): the SAML ledger is a system table; SCIM, MFA and
# the tenant's identity settings are tenant tables (row-level security in PostgreSQL) ----------

saml_ids = sa.Table(  # AuthnRequest ids (InResponseTo) and assertion ids seen (replay)
    "saml_ids",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("expires_ns", sa.BigInteger, nullable=False),
    sa.Column("used_ns", sa.BigInteger),
)

scim_users = sa.Table(
    "scim_users",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("user_name", sa.Text, nullable=False),
    sa.Column("external_id", sa.Text),
    sa.Column("active", sa.Boolean, nullable=False),
    sa.Column("role", sa.Text),
    sa.Column("resource", sa.Text, nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("created_ns", sa.BigInteger, nullable=False),
    sa.Column("updated_ns", sa.BigInteger, nullable=False),
)

scim_groups = sa.Table(
    "scim_groups",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("display_name", sa.Text, nullable=False),
    sa.Column("external_id", sa.Text),
    sa.Column("resource", sa.Text, nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("created_ns", sa.BigInteger, nullable=False),
    sa.Column("updated_ns", sa.BigInteger, nullable=False),
)

scim_members = sa.Table(
    "scim_members",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("group_id", sa.Text, primary_key=True),
    sa.Column("user_id", sa.Text, primary_key=True),
)

mfa_totp = sa.Table(
    "mfa_totp",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("subject", sa.Text, primary_key=True),
    sa.Column("sealed", sa.Text, nullable=False),
    sa.Column("created_ns", sa.BigInteger, nullable=False),
    sa.Column("confirmed_ns", sa.BigInteger),
    sa.Column("last_step", sa.BigInteger, nullable=False, server_default="0"),
)

mfa_recovery = sa.Table(
    "mfa_recovery",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("subject", sa.Text, primary_key=True),
    sa.Column("code_hash", sa.Text, primary_key=True),
    sa.Column("used_ns", sa.BigInteger),
)

mfa_webauthn = sa.Table(
    "mfa_webauthn",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("credential_id", sa.Text, primary_key=True),
    sa.Column("subject", sa.Text, nullable=False),
    sa.Column("public_key", sa.Text, nullable=False),
    sa.Column("sign_count", sa.BigInteger, nullable=False),
    sa.Column("created_ns", sa.BigInteger, nullable=False),
)

tenant_settings = sa.Table(
    "tenant_settings",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("mfa_required", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("updated_ns", sa.BigInteger, nullable=False),
)
