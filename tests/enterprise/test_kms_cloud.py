"""The GCP Cloud KMS and Azure Key Vault backends through their official SDKs, against
recorded REST fixtures (tests/enterprise/cloud_kms_server.py; no emulator of either service
exists, so these are fixtures, not the services). The envelope checks every KMS passes run in
test_kms.py; here: the requests the SDKs build (the context as GCP's additional authenticated
data, Key Vault's bearer challenge, local RSA-OAEP wrap and remote unwrap) and how each
refusal the services give reaches the operator — without a data key, a token or a secret."""

from __future__ import annotations

import base64
import json

import pytest

from denpex.enterprise import envelope, kms_cloud
from denpex.enterprise.kms import KmsError, open_kms
from tests.enterprise.cloud_kms_server import AZURE_TOKEN, GCP_TOKEN, FixtureAzureCredential
from tests.enterprise.test_kms import azure_fixture, azure_kms, gcp_fixture, gcp_kms

__all__ = ["azure_fixture", "gcp_fixture"]  # module fixtures shared with test_kms.py

SECRET = b"xoxb-0000-fixture-secret-value-for-cloud-kms"
RED = {"tenant": "red", "name": "slack-token"}


def clean(message: str, *also: bytes | str) -> None:
    for value in (SECRET.decode(), GCP_TOKEN, AZURE_TOKEN, *also):
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        assert text not in message, message


def test_gcp_sends_the_context_as_additional_data(gcp_fixture):
    fixture, _ = gcp_fixture
    kms = gcp_kms(gcp_fixture)
    sealed = envelope.seal(kms, SECRET, RED)
    method, path, body = fixture.seen[-1]
    assert (method, path) == ("POST", f"{kms.key}:encrypt")
    assert json.loads(base64.b64decode(body["additionalAuthenticatedData"])) == RED
    assert envelope.key_ref(sealed) == f"{kms.key}/cryptoKeyVersions/1"
    # the KMS itself refuses a data key asked for under another context
    wrapped = envelope._parse(sealed)[1]
    with pytest.raises(KmsError, match="INVALID_ARGUMENT") as refused:
        kms.unwrap(wrapped, {**RED, "tenant": "blue"})
    assert "Decryption failed" in str(refused.value)
    clean(str(refused.value))


def test_gcp_refusals_say_what_the_service_said(gcp_fixture, tmp_path, monkeypatch):
    from google.oauth2.credentials import Credentials

    fixture, url = gcp_fixture
    kms = gcp_kms(gcp_fixture)
    sealed = envelope.seal(kms, SECRET, RED)

    with pytest.raises(KmsError, match="NOT_FOUND") as missing:
        gcp_kms(
            gcp_fixture, key="projects/denpex-test/locations/global/keyRings/denpex/cryptoKeys/none"
        )
    assert "cryptoKeys/none not found" in str(missing.value)

    with pytest.raises(KmsError, match="Unauthenticated") as unauthenticated:
        kms_cloud.GcpKms(kms.key, endpoint=url, credentials=Credentials(token="expired-token"))
    clean(str(unauthenticated.value), "expired-token")

    fixture.deny(kms.key, "decrypt")
    with pytest.raises(KmsError, match="PERMISSION_DENIED") as denied:
        envelope.open_sealed(kms, sealed, RED)
    assert "cloudkms.cryptoKeyVersions.useToDecrypt" in str(denied.value)
    clean(str(denied.value))
    fixture.denied.clear()

    # a version disabled after rotation: new secrets seal under the new primary, old ones
    # no longer open until re-enabled (or re-wrapped before the disable)
    old_version = envelope.key_ref(sealed)
    assert kms.rotate().endswith("/cryptoKeyVersions/2")
    fixture.disable(old_version)
    with pytest.raises(KmsError, match="FAILED_PRECONDITION") as disabled:
        envelope.open_sealed(kms, sealed, RED)
    assert "is not enabled, current state is: DISABLED" in str(disabled.value)
    fresh = envelope.seal(kms, SECRET, RED)
    assert envelope.open_sealed(kms, fresh, RED) == SECRET

    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-such-file.json"))
    with pytest.raises(KmsError, match="GOOGLE_APPLICATION_CREDENTIALS"):
        open_kms(f"gcpkms:///{kms.key}?endpoint={url}")


def test_azure_answers_the_challenge_and_wraps_locally(azure_fixture):
    fixture, url, _ = azure_fixture
    credential = FixtureAzureCredential()
    kms = azure_kms(azure_fixture, credential=credential)
    fixture.seen.clear()
    sealed = envelope.seal(kms, SECRET, RED)
    assert envelope.open_sealed(kms, sealed, RED) == SECRET
    # the token was asked for the vault's scope, as the challenge named it
    assert ("https://vault.azure.net/.default",) in credential.scopes
    operations = [path.rsplit("/", 1)[-1] for _, path in fixture.seen]
    assert "wrapkey" not in operations  # RSA-OAEP-256 with the public key, in the SDK
    assert "unwrapkey" in operations  # the private key stays in the vault
    assert envelope.key_ref(sealed).startswith(f"{url}/keys/{kms.key_name}/")


def test_azure_refusals_say_what_the_vault_said(azure_fixture):
    fixture, url, _ = azure_fixture
    kms = azure_kms(azure_fixture)
    sealed = envelope.seal(kms, SECRET, RED)

    with pytest.raises(KmsError, match="404 KeyNotFound") as missing:
        azure_kms(azure_fixture, key="no-such-key")
    assert "no-such-key was not found" in str(missing.value)

    with pytest.raises(KmsError, match="401") as unauthenticated:
        azure_kms(azure_fixture, credential=FixtureAzureCredential("stolen-or-stale"))
    clean(str(unauthenticated.value), "stolen-or-stale")

    fixture.deny(kms.key_name, "unwrapkey")
    with pytest.raises(KmsError, match="403 Forbidden") as denied:
        envelope.open_sealed(kms, sealed, RED)
    # the first line of the vault's message, not the caller's object ids that follow it
    assert str(denied.value).endswith("(Caller is not authorized to perform action on resource.)")
    clean(str(denied.value))
    fixture.denied.clear()

    old_kid = envelope.key_ref(sealed)
    new_kid = kms.rotate()
    assert new_kid != old_kid and new_kid.startswith(f"{url}/keys/{kms.key_name}/")
    moved = envelope.rewrap(kms, sealed, RED)
    fixture.disable(old_kid)
    with pytest.raises(KmsError, match="403 Forbidden") as disabled:
        envelope.open_sealed(kms, sealed, RED)
    assert "not allowed on a disabled key" in str(disabled.value)
    assert envelope.open_sealed(kms, moved, RED) == SECRET  # the re-wrapped one still opens

    # a data key wrapped by another vault or key is refused before any request
    other = envelope._parse(sealed)[1]
    with pytest.raises(KmsError, match="another key or vault"):
        kms.unwrap(
            type(other)("azure", "https://elsewhere.vault.azure.net/keys/k/1", other.blob), RED
        )


def test_cloud_kms_urls(monkeypatch):
    made: list[tuple[tuple, dict]] = []

    def record(*args, **kwargs):
        made.append((args, kwargs))
        return "made"

    monkeypatch.setattr(kms_cloud, "GcpKms", record)
    monkeypatch.setattr(kms_cloud, "AzureKeyVaultKms", record)
    key = "projects/p/locations/global/keyRings/r/cryptoKeys/k"
    assert open_kms(f"gcpkms:///{key}") == "made"
    assert open_kms(f"gcpkms://{key}?endpoint=http://127.0.0.1:9") == "made"
    assert open_kms("azurekv://denpex-kv.vault.azure.net/envelope-kek") == "made"
    assert made == [
        ((key,), {"endpoint": None}),
        ((key,), {"endpoint": "http://127.0.0.1:9"}),
        (("https://denpex-kv.vault.azure.net", "envelope-kek"), {}),
    ]
