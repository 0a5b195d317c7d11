"""Evidence bodies marked sensitive (`denpex.sensitive: true`) are sealed at rest under the
tenant's own data key, on SQLite and on PostgreSQL (row-level security on the key table
too): the raw database holds no plaintext of them — read back byte by byte — pages show the
body withheld, a viewer's `?reveal=true` is a recorded denial, an operator's opens it (and the
audit says who); another tenant cannot open it; a KMS key rotation re-wraps the tenant keys
and every body still opens."""

from __future__ import annotations

import dataclasses
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from denpex.control import audit_log
from denpex.control.sensitive import WITHHELD
from denpex.core import audit
from tests.control.conftest import Api
from tests.control.helpers import evidence, logs_body
from tests.control.pg import OWNER

PROTOBUF = {"Content-Type": "application/x-protobuf"}


@pytest.fixture
def api(db_url: str, tmp_path: Path):
    made = Api(db_url, kms_url=f"file://{tmp_path / 'kek.json'}")
    yield made
    made.close()


def sensitive_items(seeded: str, n: int = 3, prefix: str = "sens"):
    items = evidence(n, prefix=prefix)
    out = []
    for i, item in enumerate(items):
        event = dataclasses.replace(
            item.event,
            body=f"auth failure for user alice token={seeded}-{i}",
            attrs={**item.event.attrs, "denpex.sensitive": True},
        )
        out.append(dataclasses.replace(item, event=event))
    return out


def superuser(api: Api) -> sa.Engine:
    """The store as its superuser sees it: past row-level security (FORCE binds the owner)."""
    db = api.runtime.db
    return sa.create_engine(db.url.replace(f"{OWNER}@", "postgres@")) if db.postgres else db.engine


def raw_dump(api: Api) -> bytes:
    """Every value of every table, as the database holds them."""
    db = api.runtime.db
    out = []
    engine = superuser(api)
    with engine.connect() as conn:
        for table in sa.inspect(conn).get_table_names():
            rows = conn.exec_driver_sql(f'SELECT * FROM "{table}"').all()
            out.extend(repr(tuple(r)) for r in rows)
    if engine is not db.engine:
        engine.dispose()
    if not db.postgres:  # and the files themselves (WAL included)
        path = Path(db.url.removeprefix("sqlite:///"))
        for file in path.parent.glob(path.name + "*"):
            out.append(file.read_bytes().decode("latin-1"))
    return "\n".join(out).encode("latin-1", "replace")


def test_sensitive_bodies_are_sealed_at_rest_and_opened_only_when_allowed(api: Api) -> None:
    seeded = f"tok-{secrets.token_urlsafe(18)}"
    plain = evidence(2, prefix="plain")
    items = sensitive_items(seeded)
    reply = api.post("/v1/logs", content=logs_body(items + plain), headers=PROTOBUF)
    assert reply.status_code == 200, reply.text
    assert seeded.encode() not in raw_dump(api)
    assert b"GPU has fallen off the bus" in raw_dump(api)  # an unmarked body stays as it is

    page = api.get("/api/v1/evidence", params={"limit": 100}).json()["items"]
    by_id = {item["id"]: item for item in page}
    assert by_id[items[0].id]["body"] == WITHHELD and by_id[items[0].id]["sensitive"] is True
    assert "sensitive" not in by_id[plain[0].id]
    assert seeded not in str(page)

    path = f"/api/v1/evidence/{items[1].id}"
    assert api.get(path, role="viewer").json()["body"] == WITHHELD
    refused = api.get(path, params={"reveal": "true"}, role="viewer")
    assert refused.status_code == 403 and seeded not in refused.text
    denials = api.get("/api/v1/denials", role="admin").json()["items"]
    assert any(d["action"] == "evidence:read_sensitive" for d in denials)

    opened = api.get(path, params={"reveal": "true"}, role="operator").json()
    assert opened["body"] == f"auth failure for user alice token={seeded}-1"
    assert opened["revealed"] is True
    lines = audit_log.export_lines(api.runtime.db)
    [revealed] = [r for r in map(audit.loads_record, lines) if r["kind"] == "evidence.revealed"]
    assert revealed["subject"] == items[1].id and revealed["tenant"] == "acme"
    assert seeded not in str(lines)

    # another tenant: no such evidence for it, let alone its body
    other = api.get(path, params={"reveal": "true"}, tenant="globex", role="operator")
    assert other.status_code == 404


def test_each_tenant_has_its_own_key_and_rotation_rewraps_it(api: Api, tmp_path: Path) -> None:
    seeded = f"tok-{secrets.token_urlsafe(18)}"
    for tenant in ("acme", "globex"):
        body = logs_body(sensitive_items(seeded, prefix=f"{tenant}-s"))
        headers = {**api.headers(tenant, "operator"), **PROTOBUF}
        assert api.client.post("/v1/logs", content=body, headers=headers).status_code == 200
    sealer = api.runtime.sensitive
    t = sa.table("tenant_keys", sa.column("tenant"), sa.column("wrapped"), sa.column("key_ref"))
    engine = superuser(api)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(t.c.tenant, t.c.wrapped, t.c.key_ref)).all()
    if engine is not api.runtime.db.engine:
        engine.dispose()
    assert sorted(r.tenant for r in rows) == ["acme", "globex"]
    assert rows[0].wrapped != rows[1].wrapped and {r.key_ref for r in rows} == {"v1"}

    # rotate-key as an operator runs it, on the live store
    out = subprocess.run(
        [sys.executable, "-m", "denpex", "server", "rotate-key", "--db", api.url,
         "--kms", f"file://{tmp_path / 'kek.json'}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "2 tenant evidence key(s) re-wrapped" in out.stderr
    assert {sealer.key_ref("acme"), sealer.key_ref("globex")} == {"v2"}
    sealer._keys.clear()  # forget the unwrapped keys: they come from the new wrap now
    for tenant in ("acme", "globex"):
        path = f"/api/v1/evidence/{tenant}-s-node1-2"
        opened = api.get(path, params={"reveal": "true"}, tenant=tenant, role="operator").json()
        assert opened["body"] == f"auth failure for user alice token={seeded}-2"
    assert seeded.encode() not in raw_dump(api)
