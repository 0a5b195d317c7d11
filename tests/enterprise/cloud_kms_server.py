"""Local HTTP servers speaking Google Cloud KMS REST v1 and Azure Key Vault keys REST in the
shapes recorded in tests/enterprise/cloud_kms/{gcp,azure}.json, so the vendors' own SDKs build
the requests and map the errors. These are fixtures, not the services: no emulator of either
exists. They hold real keys (AES-256-GCM per GCP key version, RSA-2048 per Key Vault key
version) so a wrap really has to be unwrapped by the same key, and they say no the way the
services do: a missing or wrong bearer token, a permission taken away (IAM / RBAC), a key
that does not exist, a disabled key version, a field the API does not know, a ciphertext
that does not decrypt (wrong additional data included).

The Key Vault fixture serves TLS (the SDK sends a bearer token over https only) with a
certificate the test makes for 127.0.0.1.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import re
import secrets
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from cryptography import x509
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.x509.oid import NameOID

HERE = Path(__file__).parent / "cloud_kms"
GCP_TOKEN = "fixture-gcp-access-token"
AZURE_TOKEN = "fixture-azure-access-token"


def _fill(template: Any, values: dict[str, Any]) -> Any:
    """The recorded template with {placeholders} replaced; a placeholder that is a whole
    string takes the value's own JSON type."""
    if isinstance(template, dict):
        return {k: _fill(v, values) for k, v in template.items()}
    if isinstance(template, list):
        return [_fill(v, values) for v in template]
    if isinstance(template, str):
        whole = re.fullmatch(r"\{(\w+)\}", template)
        if whole and whole.group(1) in values:
            return values[whole.group(1)]
        return re.sub(r"\{(\w+)\}", lambda m: str(values.get(m.group(1), m.group(0))), template)
    return template


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class _Reply(Exception):
    def __init__(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self.status, self.body, self.headers = status, body, headers or {}


class _Handler(BaseHTTPRequestHandler):
    fixture: Any = None  # set per server class

    def log_message(self, format: str, *args: Any) -> None:  # quiet: pytest shows failures
        pass

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            status, body, headers = 200, self.fixture.answer(self, raw), {}
        except _Reply as reply:
            status, body, headers = reply.status, reply.body, reply.headers
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PATCH = _serve


@dataclass
class _GcpVersion:
    key: bytes
    state: str = "ENABLED"


@dataclass
class GcpFixture:
    """Cloud KMS REST v1 for the keys `add_key` made; `deny(key, permission)` takes an IAM
    permission away; `disable(version)` disables a key version."""

    shapes: dict[str, Any] = field(
        default_factory=lambda: json.loads((HERE / "gcp.json").read_text())
    )
    keys: dict[str, dict[str, Any]] = field(default_factory=dict)
    denied: set[tuple[str, str]] = field(default_factory=set)
    seen: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_key(self, name: str) -> str:
        with self.lock:
            self.keys[name] = {"versions": {1: _GcpVersion(AESGCM.generate_key(256))}, "primary": 1}
        return name

    def deny(self, key: str, operation: str) -> None:
        self.denied.add((key, self.shapes["permissions"][operation]))

    def disable(self, version_name: str) -> None:
        key, _, number = version_name.rpartition("/cryptoKeyVersions/")
        self.keys[key]["versions"][int(number)].state = "DISABLED"

    def _error(self, kind: str, **values: Any) -> _Reply:
        shape = self.shapes["errors"][kind]
        return _Reply(shape["status"], _fill(shape["body"], values), shape.get("headers"))

    def _version(self, key: str, number: int) -> dict[str, Any]:
        return _fill(
            self.shapes["responses"]["cryptoKeyVersion"],
            {
                "version": f"{key}/cryptoKeyVersions/{number}",
                "state": self.keys[key]["versions"][number].state,
            },
        )

    def _body(self, operation: str, raw: bytes) -> dict[str, Any]:
        body = json.loads(raw or b"{}")
        rules = self.shapes["requests"].get(operation)
        if rules:
            for name in body:
                if name not in rules["allowed"]:
                    raise self._error("unknown_field", field=name)
            for name in rules["required"]:
                if not body.get(name):
                    raise self._error("missing_field", field=name)
        return body

    def answer(self, request: BaseHTTPRequestHandler, raw: bytes) -> Any:
        if request.headers.get("Authorization") != f"Bearer {GCP_TOKEN}":
            raise self._error("unauthenticated")
        path = urlsplit(request.path).path.removeprefix("/v1/")
        name, _, verb = path.partition(":")
        operation = verb or ("create" if name.endswith("/cryptoKeyVersions") else "get")
        key = name.removesuffix("/cryptoKeyVersions")
        body = self._body(operation, raw)
        with self.lock:
            self.seen.append((request.command, path, body))
            if (key, self.shapes["permissions"].get(operation, "")) in self.denied:
                raise self._error(
                    "permission_denied", key=key, permission=self.shapes["permissions"][operation]
                )
            if key not in self.keys:
                raise self._error("not_found", key=key)
            state = self.keys[key]
            if operation == "get":
                return _fill(
                    self.shapes["responses"]["cryptoKey"],
                    {"key": key, "primary": self._version(key, state["primary"])},
                )
            if operation == "encrypt":
                number = state["primary"]
                version = state["versions"][number]
                if version.state != "ENABLED":
                    raise self._error(
                        "version_disabled", version=f"{key}/cryptoKeyVersions/{number}"
                    )
                nonce = secrets.token_bytes(12)
                sealed = AESGCM(version.key).encrypt(
                    nonce,
                    base64.b64decode(body["plaintext"]),
                    base64.b64decode(body.get("additionalAuthenticatedData", "")),
                )
                ciphertext = number.to_bytes(4, "big") + nonce + sealed
                return _fill(
                    self.shapes["responses"]["encrypt"],
                    {
                        "version": f"{key}/cryptoKeyVersions/{number}",
                        "ciphertext": base64.b64encode(ciphertext).decode(),
                        "ciphertextCrc32c": "0",
                    },
                )
            if operation == "decrypt":
                blob = base64.b64decode(body["ciphertext"])
                number = int.from_bytes(blob[:4], "big")
                version = state["versions"].get(number)
                if version is None:
                    raise self._error("decryption_failed")
                if version.state != "ENABLED":
                    raise self._error(
                        "version_disabled", version=f"{key}/cryptoKeyVersions/{number}"
                    )
                try:
                    plaintext = AESGCM(version.key).decrypt(
                        blob[4:16],
                        blob[16:],
                        base64.b64decode(body.get("additionalAuthenticatedData", "")),
                    )
                except InvalidTag:
                    raise self._error("decryption_failed") from None
                return _fill(
                    self.shapes["responses"]["decrypt"],
                    {
                        "plaintext": base64.b64encode(plaintext).decode(),
                        "plaintextCrc32c": "0",
                        "usedPrimary": number == state["primary"],
                    },
                )
            if operation == "create":
                number = max(state["versions"]) + 1
                state["versions"][number] = _GcpVersion(AESGCM.generate_key(256))
                return self._version(key, number)
            if operation == "updatePrimaryVersion":
                number = int(body["cryptoKeyVersionId"])
                if number not in state["versions"]:
                    raise self._error("not_found", key=f"{key}/cryptoKeyVersions/{number}")
                state["primary"] = number
                return _fill(
                    self.shapes["responses"]["cryptoKey"],
                    {"key": key, "primary": self._version(key, number)},
                )
        raise self._error("not_found", key=path)


@dataclass
class _AzureVersion:
    version: str
    private: rsa.RSAPrivateKey
    enabled: bool = True


@dataclass
class AzureFixture:
    """Key Vault keys REST for the RSA keys `add_key` made; `deny(name, operation)` takes an
    RBAC action away; `disable(kid)` disables a key version."""

    base: str = ""
    shapes: dict[str, Any] = field(
        default_factory=lambda: json.loads((HERE / "azure.json").read_text())
    )
    keys: dict[str, list[_AzureVersion]] = field(default_factory=dict)
    denied: set[tuple[str, str]] = field(default_factory=set)
    seen: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_key(self, name: str) -> str:
        with self.lock:
            self.keys[name] = [self._new_version()]
        return name

    @staticmethod
    def _new_version() -> _AzureVersion:
        return _AzureVersion(secrets.token_hex(16), rsa.generate_private_key(65537, 2048))

    def deny(self, name: str, operation: str) -> None:
        self.denied.add((name, self.shapes["actions"][operation]))

    def disable(self, kid: str) -> None:
        name, version = kid.rstrip("/").split("/keys/", 1)[1].split("/")
        next(v for v in self.keys[name] if v.version == version).enabled = False

    def _error(self, kind: str, **values: Any) -> _Reply:
        shape = self.shapes["errors"][kind]
        return _Reply(shape["status"], _fill(shape["body"], values), shape.get("headers"))

    def _bundle(self, name: str, version: _AzureVersion) -> dict[str, Any]:
        public = version.private.public_key().public_numbers()
        return _fill(
            self.shapes["responses"]["keyBundle"],
            {
                "kid": f"{self.base}/keys/{name}/{version.version}",
                "n": _b64url(public.n.to_bytes((public.n.bit_length() + 7) // 8, "big")),
                "e": _b64url(public.e.to_bytes(3, "big")),
                "enabled": version.enabled,
            },
        )

    def answer(self, request: BaseHTTPRequestHandler, raw: bytes) -> Any:
        parts = urlsplit(request.path)
        api_version = parse_qs(parts.query).get("api-version", [""])[0]
        if api_version not in self.shapes["api_versions"]:
            raise self._error("bad_api_version", version=api_version)
        if request.headers.get("Authorization") is None:
            raise self._error("unauthorized")
        if request.headers.get("Authorization") != f"Bearer {AZURE_TOKEN}":
            raise self._error("bad_token")
        segments = [s for s in parts.path.split("/") if s]
        if len(segments) < 2 or segments[0] != "keys":
            raise self._error("bad_parameter", message=f"Unknown path {parts.path}")
        name = segments[1]
        rest = segments[2:]
        operation = "get"
        if rest and rest[-1] in ("wrapkey", "unwrapkey", "rotate"):
            operation = rest.pop()
        with self.lock:
            self.seen.append((request.command, parts.path))
            if (name, self.shapes["actions"][operation]) in self.denied:
                raise self._error(
                    "forbidden_by_rbac", action=self.shapes["actions"][operation], name=name
                )
            versions = self.keys.get(name)
            if versions is None:
                raise self._error("key_not_found", name=name)
            if operation == "rotate":
                versions.append(self._new_version())
                return self._bundle(name, versions[-1])
            if rest:
                version = next((v for v in versions if v.version == rest[0]), None)
                if version is None:
                    raise self._error("key_not_found", name=f"{name}/{rest[0]}")
            else:
                version = versions[-1]
            if operation == "get":
                return self._bundle(name, version)
            if not version.enabled:
                raise self._error(
                    "key_disabled",
                    operation={"wrapkey": "wrapKey", "unwrapkey": "unwrapKey"}[operation],
                )
            body = json.loads(raw or b"{}")
            rules = self.shapes["requests"][operation]
            missing = [f for f in rules["required"] if not body.get(f)]
            if missing:
                raise self._error("bad_parameter", message=f"Property {missing[0]} is required")
            if body["alg"] != "RSA-OAEP-256":
                raise self._error(
                    "bad_parameter",
                    message=f"Algorithm {body['alg']} is not supported by this fixture",
                )
            oaep = padding.OAEP(
                mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=None
            )
            if operation == "wrapkey":
                out = version.private.public_key().encrypt(_unb64url(body["value"]), oaep)
            else:
                try:
                    out = version.private.decrypt(_unb64url(body["value"]), oaep)
                except ValueError:
                    raise self._error("bad_parameter", message="Invalid ciphertext") from None
            return _fill(
                self.shapes["responses"]["keyOperationResult"],
                {"kid": f"{self.base}/keys/{name}/{version.version}", "value": _b64url(out)},
            )


def make_loopback_cert(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, as PEM files."""
    key = rsa.generate_private_key(65537, 2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


class FixtureServer:
    """One fixture served on 127.0.0.1 (TLS when a certificate is given) in a thread."""

    def __init__(self, fixture: Any, cert: tuple[Path, Path] | None = None) -> None:
        handler = type("Handler", (_Handler,), {"fixture": fixture})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        scheme = "http"
        if cert is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*cert)
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FixtureServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


class FixtureAzureCredential:
    """An azure-core TokenCredential that hands out the token the Key Vault fixture accepts
    (the role azure-identity's credentials play against Entra ID); records the scopes asked."""

    def __init__(self, token: str = AZURE_TOKEN) -> None:
        self.token = token
        self.scopes: list[tuple[str, ...]] = []

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        import time

        from azure.core.credentials import AccessToken

        self.scopes.append(scopes)
        return AccessToken(self.token, int(time.time()) + 3600)
