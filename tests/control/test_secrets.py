"""Stored secrets on a real `denpex server`: sealed under the KMS (a local key file here; the
other KMS backends are tested in tests/enterprise/test_kms.py), listed by name only, rotated
and re-wrapped by `denpex server rotate-key` while the server serves, and never seen again:
every output of the run (responses and their headers, /metrics, errors, the denial log, the
server's log, the CLI's output) and the store's own bytes are searched for the seeded values.
The same search covers the server's own credentials (a Kubernetes secret volume it is given
with --credentials), an evidence body marked sensitive, and the bad tokens of a sign-in flood
that gets throttled."""

from __future__ import annotations

import random
import secrets as random_secrets
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import httpx

from tests.control.conftest import ServerProcess, mint
from tests.control.helpers import evidence, logs_body
from tests.enterprise.kube_volume import SecretVolume


def test_secrets_never_leave_the_server(tmp_path: Path, server_processes):
    db_file = tmp_path / "control.db"
    url = f"sqlite:///{db_file}"
    kms = f"file://{tmp_path / 'kek.json'}"
    own = {
        key: f"{key}-{random_secrets.token_urlsafe(18)}"
        for key in ("db-password", "oidc-client-secret", "bao-token")
    }
    volume = SecretVolume(tmp_path / "credentials")
    volume.write(own)
    server = ServerProcess(
        url, tmp_path / "server.log", "--kms", kms, "--credentials", f"k8s-volume://{volume.path}"
    ).start()
    server_processes.append(server)
    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    seeded = [f"tok-{random_secrets.token_urlsafe(24)}" for _ in range(3)]
    admin = {"Authorization": f"Bearer {mint(url, 'acme', 'admin')}"}
    viewer = {"Authorization": f"Bearer {mint(url, 'acme', 'viewer')}"}
    auditor = {"Authorization": f"Bearer {mint(url, 'acme', 'auditor')}"}
    outputs: list[str] = []

    def record(reply: httpx.Response) -> httpx.Response:
        outputs.append(f"{reply.status_code} {dict(reply.headers)} {reply.text}")
        return reply

    with httpx.Client(base_url=server.base, timeout=30) as client:
        for i, value in enumerate(seeded):
            body = {"value": f"https://hooks.test/services/{value}"}
            reply = record(client.put(f"/api/v1/secrets/hook-{i}", json=body, headers=admin))
            assert reply.status_code == 200, reply.text
            assert reply.json()["key_ref"] == "v1"
        secret = seeded[0]
        # refusals that carry a secret in the request
        assert (
            record(
                client.put("/api/v1/secrets/Bad Name!", json={"value": secret}, headers=admin)
            ).status_code
            == 400
        )
        assert (
            record(
                client.put("/api/v1/secrets/long", json={"value": secret * 400}, headers=admin)
            ).status_code
            == 400
        )
        broken = '{"value": "' + secret
        assert (
            record(
                client.put(
                    "/api/v1/secrets/x",
                    content=broken,
                    headers={**admin, "Content-Type": "application/json"},
                )
            ).status_code
            == 400
        )
        assert (
            record(
                client.put("/api/v1/secrets/x", json={"value": secret}, headers=viewer)
            ).status_code
            == 403
        )
        assert (
            record(
                client.put(f"/api/v1/secrets/{secret}", json={"value": "v"}, headers=viewer)
            ).status_code
            == 403
        )
        # an evidence body marked sensitive: sealed at rest, withheld from a viewer
        sensitive = f"sens-{random_secrets.token_urlsafe(18)}"
        item = evidence(1, prefix="sensitive")[0]
        event = replace(item.event, body=f"password={sensitive}", attrs={"denpex.sensitive": True})
        operator = {"Authorization": f"Bearer {mint(url, 'acme', 'operator')}"}
        ingest = {**operator, "Content-Type": "application/x-protobuf"}
        body = logs_body([replace(item, event=event)])
        assert record(client.post("/v1/logs", content=body, headers=ingest)).status_code == 200
        path = f"/api/v1/evidence/{item.id}"
        assert record(client.get(path, headers=viewer)).json().get("sensitive") is True
        assert record(client.get(f"{path}?reveal=true", headers=viewer)).status_code == 403
        seeded.append(sensitive)
        # a flood of bad tokens from another address: refused, then throttled (the packaged
        # limit, 20 a minute); none of them is ever repeated
        flood = [
            f"dpx_{random_secrets.token_hex(8)}_{random_secrets.token_urlsafe(24)}"
            for _ in range(25)
        ]
        elsewhere = httpx.HTTPTransport(local_address="127.0.0.2")
        with httpx.Client(base_url=server.base, timeout=30, transport=elsewhere) as attacker:
            statuses = [
                record(
                    attacker.get("/api/v1/incidents", headers={"Authorization": f"Bearer {bad}"})
                ).status_code
                for bad in flood
            ]
        assert statuses[:20] == [401] * 20 and set(statuses[20:]) == {429}
        seeded += [bad.split("_", 2)[2] for bad in flood]  # the secret part (may hold "_")
        listed = record(client.get("/api/v1/secrets", headers=admin)).json()["items"]
        assert [s["name"] for s in listed] == ["hook-0", "hook-1", "hook-2"]
        for path in ("/metrics", "/healthz", "/openapi.json"):
            record(client.get(path))
        assert len(record(client.get("/api/v1/denials", headers=auditor)).json()["items"]) == 3
        rotated = subprocess.run(
            [sys.executable, "-m", "denpex", "server", "rotate-key", "--db", url, "--kms", kms],
            capture_output=True,
            text=True,
        )
        outputs.append(rotated.stdout + rotated.stderr)
        assert (
            rotated.returncode == 0
            and "3 secrets and 1 tenant evidence key(s) re-wrapped" in rotated.stderr
        )
        after = record(client.get("/api/v1/secrets", headers=admin)).json()["items"]
        assert {s["key_ref"] for s in after} == {"v2"}
        # the running server keeps sealing (under the new key) without a restart
        fresh = record(
            client.put("/api/v1/secrets/hook-3", json={"value": "x" + secret[::-1]}, headers=admin)
        )
        assert fresh.json()["key_ref"] == "v2"
        record(client.delete("/api/v1/secrets/hook-3", headers=admin))
        record(client.get("/metrics"))
    # the values are really stored (sealed) and open to the server's own code
    from denpex.control.db import Database
    from denpex.control.secrets import SecretStore
    from denpex.enterprise import open_kms

    db = Database(url)
    try:
        store = SecretStore(db, lambda: open_kms(kms))
        assert [store.reveal("acme", f"hook-{i}") for i in range(3)] == [
            f"https://hooks.test/services/{v}" for v in seeded[:3]
        ]
        assert store.reveal("globex", "hook-0") is None
    finally:
        db.dispose()
    server.stop()
    outputs.append(server.log.read_text())
    assert "keys: bao-token, db-password, oidc-client-secret" in outputs[-1]  # names only
    audit_lines = subprocess.run(
        [sys.executable, "-m", "denpex", "audit", "export", "--db", url],
        capture_output=True,
        text=True,
    )
    outputs.append(audit_lines.stdout + audit_lines.stderr)
    assert "login.throttled" in audit_lines.stdout, audit_lines.stderr[-500:]
    seeded += list(own.values())
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("control.db*"))
    everything = "\n".join(outputs)
    for value in seeded:
        assert value not in everything
        assert value.encode() not in stored
        assert value[::-1] not in everything
    assert "hook-0" in everything  # the search looked at real output
