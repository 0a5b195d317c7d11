"""The cloud KMS backends reached through their vendors' official SDKs: Google Cloud KMS
(google-cloud-kms, REST transport) and Azure Key Vault keys (azure-keyvault-keys with
azure-identity). Both keep the key-encryption key inside the service; denpex sends the data
key to be wrapped and unwrapped, like the OpenBao and AWS backends.

- GCP: a symmetric CryptoKey; Encrypt with the envelope's context as additional
  authenticated data (so a data key unwraps only for its row), Decrypt on the key (the
  ciphertext names its version); rotation adds a CryptoKeyVersion and makes it primary.
- Azure: an RSA key; the data key is wrapped with RSA-OAEP-256 (the SDK does this with the
  public key it fetched) and unwrapped by the vault; rotation is the vault's Rotate. RSA-OAEP
  takes no associated data: the context binds at the envelope (AES-GCM), as with transit.

It must never put a data key, an access token or a credential into an error or a log; the
errors name the service's status and message, which carry resource names only.
"""

from __future__ import annotations

import threading
from typing import Any

from denpex.enterprise.kms_types import KmsError, WrappedKey, aad

INSTALL_HINT = (
    "pip install google-cloud-kms azure-keyvault-keys azure-identity (the kms-cloud extra)"
)


class GcpKms:
    """Google Cloud KMS: `key` is projects/P/locations/L/keyRings/R/cryptoKeys/K."""

    name = "gcp"

    def __init__(
        self, key: str, *, endpoint: str | None = None, credentials: Any | None = None
    ) -> None:
        try:
            from google.api_core.client_options import ClientOptions
            from google.cloud import kms
        except ImportError:
            raise KmsError(f"the GCP KMS needs its SDK: {INSTALL_HINT}") from None
        if credentials is None:
            credentials = _google_default_credentials()
        self.key = key.strip("/")
        self._types = kms
        self.client = kms.KeyManagementServiceClient(
            transport="rest",
            credentials=credentials,
            client_options=ClientOptions(api_endpoint=endpoint) if endpoint else None,
        )
        found = self._call("set-up", self.client.get_crypto_key, name=self.key)
        if found.purpose != kms.CryptoKey.CryptoKeyPurpose.ENCRYPT_DECRYPT:
            raise KmsError(f"GCP KMS key {self.key}: not a symmetric ENCRYPT_DECRYPT key")

    def _call(self, what: str, fn: Any, **kwargs: Any) -> Any:
        from google.api_core import exceptions
        from google.auth import exceptions as auth_exceptions

        try:
            return fn(**kwargs)
        except auth_exceptions.GoogleAuthError as exc:
            # the service answered 401 and the credentials could not get a fresh token
            raise KmsError(
                f"GCP KMS {what} with {self.key}: Unauthenticated, and the credentials could "
                f"not be refreshed ({type(exc).__name__}); check the service account"
            ) from None
        except exceptions.GoogleAPICallError as exc:
            status, message = _google_status(exc)
            raise KmsError(f"GCP KMS {what} with {self.key}: {status} ({message})") from None
        except (exceptions.RetryError, OSError) as exc:
            raise KmsError(
                f"GCP KMS {what} with {self.key}: cannot reach the service ({type(exc).__name__})"
            ) from None

    def wrap(self, data_key: bytes, context: dict[str, str]) -> WrappedKey:
        out = self._call(
            "encrypt",
            self.client.encrypt,
            request={
                "name": self.key,
                "plaintext": data_key,
                "additional_authenticated_data": aad(context),
            },
        )
        return WrappedKey(self.name, str(out.name), bytes(out.ciphertext))

    def unwrap(self, wrapped: WrappedKey, context: dict[str, str]) -> bytes:
        out = self._call(
            "decrypt",
            self.client.decrypt,
            request={
                "name": self.key,
                "ciphertext": wrapped.blob,
                "additional_authenticated_data": aad(context),
            },
        )
        return bytes(out.plaintext)

    def rotate(self) -> str:
        made = self._call(
            "rotate",
            self.client.create_crypto_key_version,
            request={"parent": self.key, "crypto_key_version": {}},
        )
        version_id = str(made.name).rsplit("/", 1)[-1]
        self._call(
            "rotate",
            self.client.update_crypto_key_primary_version,
            request={"name": self.key, "crypto_key_version_id": version_id},
        )
        return str(made.name)

    def rewrap(self, wrapped: WrappedKey, context: dict[str, str]) -> WrappedKey:
        # Cloud KMS has no re-encrypt: decrypt and encrypt again under the primary version
        return self.wrap(self.unwrap(wrapped, context), context)


def _google_status(exc: Any) -> tuple[str, str]:
    """The google.rpc status name and message of a refused call (the REST body says both;
    the exception's own text starts with the request's URL)."""
    try:
        error = exc.response.json()["error"]
        return str(error["status"]), str(error["message"])
    except (AttributeError, ValueError, KeyError, TypeError):
        return type(exc).__name__, str(exc.message).rsplit(": ", 1)[-1]


def _google_default_credentials() -> Any:
    import google.auth
    from google.auth import exceptions

    try:
        credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloudkms"])
    except exceptions.DefaultCredentialsError:
        raise KmsError(
            "the GCP KMS found no Google credentials: set GOOGLE_APPLICATION_CREDENTIALS to a "
            "service-account file or run on a workload with an attached service account"
        ) from None
    return credentials


class AzureKeyVaultKms:
    """Azure Key Vault: an RSA key `key_name` in the vault at `vault_url`. `client_options`
    go to the SDK clients (e.g. connection_verify for a private CA)."""

    name = "azure"

    def __init__(
        self,
        vault_url: str,
        key_name: str,
        *,
        credential: Any | None = None,
        **client_options: Any,
    ) -> None:
        try:
            from azure.keyvault.keys import KeyClient
        except ImportError:
            raise KmsError(f"the Azure Key Vault KMS needs its SDK: {INSTALL_HINT}") from None
        if credential is None:
            from azure.identity import DefaultAzureCredential

            credential = DefaultAzureCredential()
        self.vault_url = vault_url.rstrip("/")
        self.key_name = key_name
        self._credential = credential
        self._options = client_options
        self._lock = threading.Lock()
        self._crypto: dict[str, Any] = {}  # key id -> CryptographyClient
        self.keys = KeyClient(self.vault_url, credential, **client_options)
        self._current = self._call("set-up", self.keys.get_key, key_name)
        from azure.keyvault.keys import KeyType

        if self._current.key_type not in (KeyType.rsa, KeyType.rsa_hsm):
            raise KmsError(
                f"Azure Key Vault key {key_name}: not an RSA key (it wraps RSA-OAEP-256)"
            )

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from azure.core import exceptions

        try:
            return fn(*args, **kwargs)
        except exceptions.HttpResponseError as exc:
            code = exc.error.code if exc.error is not None else exc.reason
            message = exc.error.message if exc.error is not None else ""
            first = (message or "").splitlines()[0] if message else ""
            raise KmsError(
                f"Azure Key Vault {what} with {self.key_name}: {exc.status_code} {code} ({first})"
            ) from None
        except (exceptions.AzureError, OSError) as exc:
            raise KmsError(
                f"Azure Key Vault {what} with {self.key_name}: "
                f"cannot reach {self.vault_url} ({type(exc).__name__})"
            ) from None

    def _crypto_client(self, key: Any) -> Any:
        from azure.keyvault.keys.crypto import CryptographyClient

        key_id = key if isinstance(key, str) else str(key.id)
        with self._lock:
            client = self._crypto.get(key_id)
            if client is None:
                client = CryptographyClient(key, self._credential, **self._options)
                self._crypto[key_id] = client
            return client

    def wrap(self, data_key: bytes, context: dict[str, str]) -> WrappedKey:
        from azure.keyvault.keys.crypto import KeyWrapAlgorithm

        with self._lock:
            current = self._current
        client = self._crypto_client(current)
        out = self._call("wrapKey", client.wrap_key, KeyWrapAlgorithm.rsa_oaep_256, data_key)
        return WrappedKey(self.name, str(out.key_id), bytes(out.encrypted_key))

    def unwrap(self, wrapped: WrappedKey, context: dict[str, str]) -> bytes:
        from azure.keyvault.keys.crypto import KeyWrapAlgorithm

        if not wrapped.key_ref.startswith(f"{self.vault_url}/keys/{self.key_name}/"):
            raise KmsError("Azure Key Vault: the data key was wrapped by another key or vault")
        client = self._crypto_client(wrapped.key_ref)
        out = self._call(
            "unwrapKey", client.unwrap_key, KeyWrapAlgorithm.rsa_oaep_256, wrapped.blob
        )
        return bytes(out.key)

    def rotate(self) -> str:
        fresh = self._call("rotate", self.keys.rotate_key, self.key_name)
        with self._lock:
            self._current = fresh
        return str(fresh.id)

    def rewrap(self, wrapped: WrappedKey, context: dict[str, str]) -> WrappedKey:
        return self.wrap(self.unwrap(wrapped, context), context)
