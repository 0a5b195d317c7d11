"""The server's own credentials from a Kubernetes secret: mounted as a volume in the kubelet's
layout (tests/enterprise/kube_volume.py does the `..data` swap as the kubelet does) and read
again after each rotation, readers never failing while it swaps; or read through the API with
the official client against kmock's API server (tests/remediation/kube_server.py), again
after its ttl. Neither shows a value in a repr or an error. And a rotated PostgreSQL password
reaches the store's next connection without a restart (a real PostgreSQL that checks
passwords)."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from denpex.enterprise.credentials import (
    CredentialError,
    KubeSecret,
    MountedSecret,
    open_source,
)
from tests.enterprise.kube_volume import SecretVolume

SEEDED = "s3cr3t-db-password-7f1c"


def test_a_mounted_secret_is_read_again_after_the_kubelet_swaps_it(tmp_path: Path) -> None:
    volume = SecretVolume(tmp_path / "secrets")
    volume.write({"db-password": SEEDED + "\n", "bao-token": "hvs.first"})
    source = open_source(f"k8s-volume://{volume.path}")
    assert isinstance(source, MountedSecret)
    assert source.get("db-password") == SEEDED  # one trailing newline is not the value
    assert source.get("bao-token") == "hvs.first"
    assert source.get("missing") is None
    first = source.version()
    volume.write({"db-password": "rotated-password", "oidc-client-secret": "web"})
    assert source.version() != first
    assert source.get("db-password") == "rotated-password"
    assert source.get("bao-token") is None  # the key left the secret
    assert source.get("oidc-client-secret") == "web"
    assert SEEDED not in repr(source)
    with pytest.raises(CredentialError, match="not a Kubernetes secret key"):
        source.get("../../etc/passwd")
    with pytest.raises(CredentialError, match="not mounted"):
        MountedSecret(tmp_path / "nowhere")


def test_readers_never_fail_while_the_secret_rotates(tmp_path: Path) -> None:
    volume = SecretVolume(tmp_path / "secrets")
    volume.write({"db-password": "v0"})
    source = MountedSecret(volume.path)
    written = {"v0"}
    seen: set[str | None] = set()
    errors: list[Exception] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                seen.add(source.get("db-password"))
            except Exception as exc:  # anything at all is a failure here
                errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        for n in range(1, 300):
            written.add(f"v{n}")
            volume.write({"db-password": f"v{n}"})
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert not errors, errors[:3]
    assert seen <= written and len(seen) > 1
    assert source.get("db-password") == "v299"


@pytest.fixture(scope="module")
def kube() -> Iterator[str]:
    from tests.remediation.kube_server import KubeServer

    server = KubeServer().start()
    try:
        yield server.url
    finally:
        server.stop()


def core_api(url: str):
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = url
    return client.CoreV1Api(client.ApiClient(cfg))


def test_a_secret_through_the_api_is_read_again_after_its_ttl(kube: str) -> None:
    from kubernetes import client

    api = core_api(kube)
    encoded = {"db-password": base64.b64encode(SEEDED.encode()).decode()}
    api.create_namespaced_secret(
        "denpex",
        client.V1Secret(metadata=client.V1ObjectMeta(name="server-credentials"), data=encoded),
    )
    now = [0.0]
    source = KubeSecret("denpex", "server-credentials", host=kube, ttl_s=30, clock=lambda: now[0])
    assert source.get("db-password") == SEEDED
    api.patch_namespaced_secret(
        "server-credentials",
        "denpex",
        {"data": {"db-password": base64.b64encode(b"rotated").decode()}},
    )
    assert source.get("db-password") == SEEDED  # within the ttl: the cached copy
    now[0] += 31
    assert source.get("db-password") == "rotated"
    assert SEEDED not in repr(source) and "rotated" not in repr(source)
    missing = open_source(f"k8s-secret://denpex/no-such-secret?host={kube}")
    with pytest.raises(CredentialError, match="404") as refused:
        missing.get("db-password")
    assert "denpex/no-such-secret" in str(refused.value)
    with pytest.raises(CredentialError, match="expected"):
        open_source("k8s-secret://only-a-namespace")


def test_a_rotated_database_password_reaches_the_next_connection(tmp_path: Path) -> None:
    import sqlalchemy as sa

    from denpex.control.db import Database
    from tests.control.pg import PgCluster, pg_bindir

    bindir = pg_bindir()
    if bindir is None:
        pytest.fail("PostgreSQL server binaries not found: apt-get install postgresql")
    cluster = PgCluster(bindir)
    try:
        # this cluster checks passwords for the role below (the shared test cluster trusts all)
        hba = cluster.data / "pg_hba.conf"
        rule = "host all denpex_rotated 127.0.0.1/32 scram-sha-256\n"
        text = hba.read_text()
        hba.write_text(rule + text)
        cluster.admin("SELECT pg_reload_conf()")
        cluster.admin("CREATE ROLE denpex_rotated LOGIN PASSWORD 'first-password'")
        volume = SecretVolume(tmp_path / "secrets")
        volume.write({"db-password": "first-password"})
        source = MountedSecret(volume.path)
        url = cluster.url("postgres", user="denpex_rotated")
        db = Database(url, password=lambda: source.get("db-password"))
        fixed = Database(url.replace("denpex_rotated@", "denpex_rotated:first-password@"))
        try:
            with db.engine.connect() as conn:
                assert conn.execute(sa.text("SELECT current_user")).scalar() == "denpex_rotated"
            cluster.admin("ALTER ROLE denpex_rotated PASSWORD 'second-password'")
            volume.write({"db-password": "second-password"})
            db.engine.dispose()  # the pool's next connection is a new one
            fixed.engine.dispose()
            with db.engine.connect() as conn:
                assert conn.execute(sa.text("SELECT 1")).scalar() == 1
            refused = pytest.raises(sa.exc.OperationalError, match="password authentication failed")
            with refused, fixed.engine.connect():
                pass
        finally:
            db.engine.dispose()
            fixed.engine.dispose()
    finally:
        cluster.stop()
