"""The PKCS#11 KMS: data keys wrapped under an AES-256 key that never leaves the HSM.

The key-encryption key is a token object (non-extractable, sensitive) labelled
`<object>.v<N>`; wrapping is AES-GCM inside the HSM with the envelope's context as the
additional data, so a data key unwraps only for the row it was wrapped for. Rotation makes
`<object>.v<N+1>` on the token; older versions stay to unwrap what they wrapped until re-wrap
moves it. Any PKCS#11 module works (SoftHSM2 in the tests, a network HSM in production); it
is named by an RFC 7512 URI:

    pkcs11:token=LABEL;object=KEY?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=FILE

The user PIN comes from `pin-source` (a file, `file:` optional), else DENPEX_PKCS11_PIN, else
`pin-value` (discouraged: the URI is configuration, not a secret). Never puts a PIN, a key or a
data key into an error message or a log.
"""

from __future__ import annotations

import os
import secrets
import threading
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from denpex.enterprise.kms_types import KmsError, WrappedKey, aad

NONCE_BYTES = 12
TAG_BITS = 128
INSTALL_HINT = "pip install python-pkcs11 (the kms extra)"


def parse_uri(uri: str) -> dict[str, str]:
    """The attributes of a PKCS#11 URI (path and query alike), percent-decoded."""
    if not uri.startswith("pkcs11:"):
        raise KmsError("a PKCS#11 KMS URL starts with pkcs11:")
    path, _, query = uri.removeprefix("pkcs11:").partition("?")
    found: dict[str, str] = {}
    for part in [p for p in path.split(";") if p] + [q for q in query.split("&") if q]:
        name, sep, value = part.partition("=")
        if not sep:
            raise KmsError(f"PKCS#11 URL: {name!r} has no value")
        found[name] = unquote(value)
    for needed in ("token", "object", "module-path"):
        if needed not in found:
            raise KmsError(f"PKCS#11 URL: {needed}= is missing")
    return found


def _pin(attrs: dict[str, str]) -> str:
    source = attrs.get("pin-source")
    if source:
        try:
            return Path(source.removeprefix("file:")).read_text().strip()
        except OSError as exc:
            raise KmsError(f"PKCS#11: cannot read the PIN file ({exc.strerror})") from None
    pin = os.environ.get("DENPEX_PKCS11_PIN") or attrs.get("pin-value")
    if not pin:
        raise KmsError("PKCS#11: no PIN (pin-source=FILE in the URL, or DENPEX_PKCS11_PIN)")
    return pin


# A PKCS#11 login holds for the whole process (a second C_Login is refused), so every KMS
# of one token shares one logged-in session. python-pkcs11 initialises a module with
# C_Initialize(NULL), which promises the module that no two threads call it at once (PKCS#11
# 2.40 §5.4: SoftHSM2 then takes no locks of its own): one lock per module, held for every
# call into it, keeps that promise. Keyed by module and token; the PIN's hash proves a later
# opener knows it too.
_SESSIONS: dict[tuple[str, str], tuple[Any, bytes]] = {}
_MODULE_LOCKS: dict[str, threading.Lock] = {}
_SESSIONS_LOCK = threading.Lock()


def _module_lock(module: str) -> threading.Lock:
    with _SESSIONS_LOCK:
        return _MODULE_LOCKS.setdefault(module, threading.Lock())


def _pkcs11() -> Any:
    """python-pkcs11, or a KmsError saying how to install it."""
    try:
        import pkcs11
    except ImportError:
        raise KmsError(f"the PKCS#11 KMS needs python-pkcs11 ({INSTALL_HINT})") from None
    return pkcs11


_ISOLATED: dict[str, Any] = {}


def _load_isolated(module: str) -> None:
    """Load `module` so that it calls the crypto library it was linked with, whatever else
    the process has loaded: a library loaded with RTLD_GLOBAL that exports the same names
    (TensorFlow's libtensorflow_framework exports BoringSSL's EVP_*) would otherwise take
    SoftHSM2's OpenSSL calls and crash it in C_Login. python-pkcs11's own dlopen of the same
    path then gets this copy (RTLD_DEEPBIND: the module's own dependencies come first)."""
    import ctypes

    if module not in _ISOLATED:
        _ISOLATED[module] = ctypes.CDLL(module, mode=os.RTLD_LAZY | os.RTLD_DEEPBIND)


def _session(attrs: dict[str, str]) -> tuple[Any, threading.Lock]:
    import hashlib

    pkcs11 = _pkcs11()
    module, label, pin = attrs["module-path"], attrs["token"], _pin(attrs)
    digest = hashlib.sha256(pin.encode()).digest()
    lock = _module_lock(module)
    with lock:
        known = _SESSIONS.get((module, label))
        if known is not None:
            if known[1] != digest:
                raise KmsError(f"PKCS#11: wrong PIN for token {label!r}")
            return known[0], lock
        try:
            _load_isolated(module)
            lib = pkcs11.lib(module)
        except (pkcs11.PKCS11Error, RuntimeError, OSError) as exc:
            raise KmsError(f"PKCS#11: cannot load module {module} ({type(exc).__name__})") from None
        try:
            session = lib.get_token(token_label=label).open(rw=True, user_pin=pin)
        except pkcs11.PKCS11Error as exc:
            raise KmsError(f"PKCS#11: cannot open token {label!r} ({type(exc).__name__})") from None
        _SESSIONS[(module, label)] = (session, digest)
        return session, lock


def open_token(uri: str) -> None:
    """Load the module and log in to the token of `uri` now, once for the process: the
    server calls it at start-up, so that a wrong PIN or a missing token stops the start, not
    the first request that needs a key."""
    _session(parse_uri(uri))


class Pkcs11Kms:
    """wrap/unwrap/rotate/rewrap under HSM-held AES keys (the Kms protocol of kms_types.py)."""

    name = "pkcs11"

    def __init__(self, uri: str) -> None:
        self._p11 = _pkcs11()
        attrs = parse_uri(uri)
        self.label = attrs["object"]
        self._session, self._lock = _session(attrs)
        with self._lock:
            if not self._versions():
                self._generate(1)

    def _versions(self) -> dict[int, Any]:
        from pkcs11 import Attribute, ObjectClass

        found: dict[int, Any] = {}
        prefix = f"{self.label}.v"
        for obj in self._session.get_objects({Attribute.CLASS: ObjectClass.SECRET_KEY}):
            label = getattr(obj, "label", None) or ""
            if label.startswith(prefix) and label[len(prefix) :].isdigit():
                found[int(label[len(prefix) :])] = obj
        return found

    def _generate(self, version: int) -> None:
        from pkcs11 import Attribute, KeyType

        self._session.generate_key(
            KeyType.AES,
            256,
            label=f"{self.label}.v{version}",
            store=True,
            template={
                Attribute.EXTRACTABLE: False,
                Attribute.SENSITIVE: True,
                Attribute.ENCRYPT: True,
                Attribute.DECRYPT: True,
            },
        )

    def _gcm(self, nonce: bytes, context: dict[str, str]) -> dict[str, Any]:
        from pkcs11 import Mechanism
        from pkcs11.mechanisms import GCMParams

        return {
            "mechanism": Mechanism.AES_GCM,
            "mechanism_param": GCMParams(nonce, aad(context), TAG_BITS),
        }

    def wrap(self, data_key: bytes, context: dict[str, str]) -> WrappedKey:
        nonce = secrets.token_bytes(NONCE_BYTES)
        with self._lock:
            versions = self._versions()
            current = max(versions)
            try:
                sealed = versions[current].encrypt(data_key, **self._gcm(nonce, context))
            except self._p11.PKCS11Error as exc:
                raise KmsError(f"PKCS#11: wrap failed ({type(exc).__name__})") from None
        return WrappedKey(self.name, f"v{current}", nonce + bytes(sealed))

    def unwrap(self, wrapped: WrappedKey, context: dict[str, str]) -> bytes:
        ref = wrapped.key_ref.removeprefix("v")
        with self._lock:
            key = self._versions().get(int(ref)) if ref.isdigit() else None
            if key is None:
                raise KmsError(f"PKCS#11: no key {self.label}.{wrapped.key_ref} on the token")
            nonce, sealed = wrapped.blob[:NONCE_BYTES], wrapped.blob[NONCE_BYTES:]
            try:
                return bytes(key.decrypt(sealed, **self._gcm(nonce, context)))
            except self._p11.PKCS11Error:
                raise KmsError(
                    "PKCS#11: the data key does not unwrap (wrong key or context)"
                ) from None

    def rotate(self) -> str:
        with self._lock:
            version = max(self._versions()) + 1
            self._generate(version)
        return f"v{version}"

    def rewrap(self, wrapped: WrappedKey, context: dict[str, str]) -> WrappedKey:
        return self.wrap(self.unwrap(wrapped, context), context)
