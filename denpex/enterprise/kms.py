"""Key management for envelope encryption: a KMS wraps and unwraps data keys under a key it
keeps (the KEK), rotates that key (new version; old versions still unwrap) and re-wraps a
data key under the newest version. Backends: a local key file (the default, embedded),
OpenBao / Vault transit (hvac), AWS KMS (boto3), a PKCS#11 HSM (kms_pkcs11.py), Google Cloud
KMS and Azure Key Vault (kms_cloud.py). `open_kms(url)` picks one from a URL.

It must never return, log or put into an error message a data key or a KEK, and never write
the local key file readable by anyone but its owner.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import threading
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from denpex.enterprise.credentials import (
    AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY,
    BAO_TOKEN,
    CredentialSource,
)
from denpex.enterprise.kms_types import Kms, KmsError, WrappedKey
from denpex.enterprise.kms_types import aad as _aad


class LocalKeyFile:
    """KEK versions in one JSON file (mode 0600): {"current": N, "keys": {"N": base64}}.
    Created with a first key when missing."""

    name = "local"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        if not self.path.exists():
            self._save({"current": 1, "keys": {"1": _b64(AESGCM.generate_key(256))}})
        mode = self.path.stat().st_mode & 0o077
        if mode:
            raise KmsError(f"{self.path}: the key file is readable by others (chmod 600 it)")

    def _load(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.path.read_text()))
        except (OSError, ValueError) as exc:
            raise KmsError(
                f"{self.path}: cannot read the key file ({type(exc).__name__})"
            ) from None

    def _save(self, data: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, json.dumps(data).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)

    def wrap(self, data_key: bytes, context: dict[str, str]) -> WrappedKey:
        data = self._load()
        version = str(data["current"])
        kek = base64.b64decode(data["keys"][version])
        nonce = secrets.token_bytes(12)
        blob = nonce + AESGCM(kek).encrypt(nonce, data_key, _aad(context))
        return WrappedKey(self.name, f"v{version}", blob)

    def unwrap(self, wrapped: WrappedKey, context: dict[str, str]) -> bytes:
        keys = self._load()["keys"]
        kek = keys.get(wrapped.key_ref.removeprefix("v"))
        if kek is None:
            raise KmsError(f"local KMS: no key {wrapped.key_ref}")
        try:
            return AESGCM(base64.b64decode(kek)).decrypt(
                wrapped.blob[:12], wrapped.blob[12:], _aad(context)
            )
        except InvalidTag:
            raise KmsError(
                "local KMS: the data key does not unwrap (wrong key or context)"
            ) from None

    def rotate(self) -> str:
        with self._lock:
            data = self._load()
            version = max(int(v) for v in data["keys"]) + 1
            data["keys"][str(version)] = _b64(AESGCM.generate_key(256))
            data["current"] = version
            self._save(data)
        return f"v{version}"

    def rewrap(self, wrapped: WrappedKey, context: dict[str, str]) -> WrappedKey:
        return self.wrap(self.unwrap(wrapped, context), context)


class OpenBaoTransit:
    """OpenBao's (or Vault's) transit engine: the KEK never leaves the server; the data key
    is sent to it to wrap and unwrap; rotation and rewrap are the engine's own."""

    name = "openbao"

    def __init__(self, url: str, token: str, key: str, mount: str = "transit") -> None:
        import hvac

        self.client = hvac.Client(url=url, token=token)
        self.key = key
        self.mount = mount
        try:
            self.client.secrets.transit.read_key(name=key, mount_point=mount)
        except hvac.exceptions.InvalidPath:
            self.client.secrets.transit.create_key(name=key, mount_point=mount)
        except hvac.exceptions.VaultError as exc:
            raise KmsError(f"OpenBao transit at {url}: {type(exc).__name__}") from None

    def _call(self, what: str, fn: Any, **kwargs: Any) -> dict[str, Any]:
        import hvac

        try:
            return dict(fn(name=self.key, mount_point=self.mount, **kwargs)["data"])
        except (hvac.exceptions.VaultError, OSError) as exc:
            raise KmsError(
                f"OpenBao transit {what} with key {self.key!r}: {type(exc).__name__}"
            ) from None

    def wrap(self, data_key: bytes, context: dict[str, str]) -> WrappedKey:
        # the context binds the data at the envelope (AES-GCM AAD); transit wraps the key alone
        out = self._call(
            "encrypt", self.client.secrets.transit.encrypt_data, plaintext=_b64(data_key)
        )
        text = str(out["ciphertext"])
        return WrappedKey(self.name, text.rsplit(":", 1)[0], text.encode())

    def unwrap(self, wrapped: WrappedKey, context: dict[str, str]) -> bytes:
        out = self._call(
            "decrypt", self.client.secrets.transit.decrypt_data, ciphertext=wrapped.blob.decode()
        )
        return base64.b64decode(out["plaintext"])

    def rotate(self) -> str:
        import hvac

        try:
            self.client.secrets.transit.rotate_key(name=self.key, mount_point=self.mount)
            info = self.client.secrets.transit.read_key(name=self.key, mount_point=self.mount)
        except hvac.exceptions.VaultError as exc:
            raise KmsError(f"OpenBao transit rotate {self.key!r}: {type(exc).__name__}") from None
        return f"vault:v{info['data']['latest_version']}"

    def rewrap(self, wrapped: WrappedKey, context: dict[str, str]) -> WrappedKey:
        out = self._call(
            "rewrap", self.client.secrets.transit.rewrap_data, ciphertext=wrapped.blob.decode()
        )
        text = str(out["ciphertext"])
        return WrappedKey(self.name, text.rsplit(":", 1)[0], text.encode())


class AwsKms:
    """AWS KMS: the data key is encrypted under the key an alias names, with the context as
    the EncryptionContext; rotation points the alias at a new key (old ciphertexts name
    their key and still decrypt); rewrap is ReEncrypt to the alias."""

    name = "aws"

    def __init__(
        self,
        alias: str,
        *,
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
    ) -> None:
        import boto3

        self.alias = alias if alias.startswith("alias/") else f"alias/{alias}"
        self.client = boto3.client(
            "kms",
            endpoint_url=endpoint_url,
            region_name=region,
            aws_access_key_id=aws_access_key_id,
            aws_secret_access_key=aws_secret_access_key,
        )
        try:
            try:
                self.client.describe_key(KeyId=self.alias)
            except self.client.exceptions.NotFoundException:
                made = self.client.create_key(Description="denpex envelope KEK")
                self.client.create_alias(
                    AliasName=self.alias, TargetKeyId=made["KeyMetadata"]["KeyId"]
                )
        except Exception as exc:  # botocore's ClientError and connection errors
            raise self._error("set-up", exc) from None

    def _error(self, what: str, exc: Exception) -> KmsError:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)
        return KmsError(f"AWS KMS {what} with {self.alias}: {code}")

    def wrap(self, data_key: bytes, context: dict[str, str]) -> WrappedKey:
        try:
            out = self.client.encrypt(
                KeyId=self.alias, Plaintext=data_key, EncryptionContext=context
            )
        except Exception as exc:  # botocore's ClientError and connection errors
            raise self._error("encrypt", exc) from None
        return WrappedKey(self.name, str(out["KeyId"]), bytes(out["CiphertextBlob"]))

    def unwrap(self, wrapped: WrappedKey, context: dict[str, str]) -> bytes:
        try:
            out = self.client.decrypt(CiphertextBlob=wrapped.blob, EncryptionContext=context)
        except Exception as exc:
            raise self._error("decrypt", exc) from None
        return bytes(out["Plaintext"])

    def rotate(self) -> str:
        try:
            key = self.client.create_key(Description="denpex envelope KEK")["KeyMetadata"]["KeyId"]
            self.client.update_alias(AliasName=self.alias, TargetKeyId=key)
        except Exception as exc:
            raise self._error("rotate", exc) from None
        return str(key)

    def rewrap(self, wrapped: WrappedKey, context: dict[str, str]) -> WrappedKey:
        try:
            out = self.client.re_encrypt(
                CiphertextBlob=wrapped.blob,
                SourceEncryptionContext=context,
                DestinationKeyId=self.alias,
                DestinationEncryptionContext=context,
            )
        except Exception as exc:
            raise self._error("re-encrypt", exc) from None
        return WrappedKey(self.name, str(out["KeyId"]), bytes(out["CiphertextBlob"]))


def open_kms(url: str, credentials: CredentialSource | None = None) -> Kms:
    """A KMS from a URL: file:///PATH (local key file), openbao+http://HOST:PORT/KEY (token in
    BAO_TOKEN or VAULT_TOKEN), aws:///ALIAS[?endpoint=URL&region=R], pkcs11:token=T;object=K?
    module-path=LIB&pin-source=FILE (an HSM, RFC 7512), gcpkms:///projects/P/locations/L/
    keyRings/R/cryptoKeys/K[?endpoint=URL] (Application Default Credentials),
    azurekv://VAULT.vault.azure.net/KEY (DefaultAzureCredential). `credentials` (the server's
    Kubernetes secret) gives the OpenBao token and the AWS keys when the environment does not."""
    parts = urlsplit(url)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    if parts.scheme == "file":
        return LocalKeyFile(parts.path)
    if parts.scheme in ("openbao+http", "openbao+https", "vault+http", "vault+https"):
        token = os.environ.get("BAO_TOKEN") or os.environ.get("VAULT_TOKEN")
        if not token and credentials is not None:
            token = credentials.get(BAO_TOKEN)
        if not token:
            raise KmsError(
                "the OpenBao KMS needs a token in BAO_TOKEN (or VAULT_TOKEN), or the key "
                f"{BAO_TOKEN!r} in the server's credentials secret"
            )
        base = f"{parts.scheme.split('+')[1]}://{parts.netloc}"
        return OpenBaoTransit(base, token, parts.path.strip("/"), query.get("mount", "transit"))
    if parts.scheme == "aws":
        keys: dict[str, str] = {}
        if credentials is not None and not os.environ.get("AWS_ACCESS_KEY_ID"):
            key_id, secret = (
                credentials.get(AWS_ACCESS_KEY_ID),
                credentials.get(AWS_SECRET_ACCESS_KEY),
            )
            if key_id and secret:
                keys = {"aws_access_key_id": key_id, "aws_secret_access_key": secret}
        return AwsKms(
            parts.path.strip("/"),
            endpoint_url=query.get("endpoint"),
            region=query.get("region", "us-east-1"),
            **keys,
        )
    if parts.scheme == "pkcs11":
        from denpex.enterprise.kms_pkcs11 import Pkcs11Kms

        return Pkcs11Kms(url)
    if parts.scheme == "gcpkms":
        from denpex.enterprise.kms_cloud import GcpKms

        return GcpKms((parts.netloc + parts.path).strip("/"), endpoint=query.get("endpoint"))
    if parts.scheme == "azurekv":
        from denpex.enterprise.kms_cloud import AzureKeyVaultKms

        return AzureKeyVaultKms(f"https://{parts.netloc}", parts.path.strip("/"))
    raise KmsError(
        f"KMS URL {url!r}: expected file://, openbao+http(s)://, aws://, pkcs11:, gcpkms:// "
        "or azurekv://"
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
