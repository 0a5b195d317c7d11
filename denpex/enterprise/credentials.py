"""Where the server's own credentials come from (its database URL and password, the OIDC
client secret, the KMS token and cloud keys): a Kubernetes secret, either mounted as a volume
(the kubelet's projected layout: each key a symlink into `..data`, which the kubelet swaps
atomically to a new timestamped folder on rotation) or read through the API with the official
`kubernetes` client. Values are read again after a rotation, so a rotated password reaches
the next database connection without a restart.

It must never log a value, put one into an error or a repr, or read outside the secret's
folder; errors name the source and the key only.
"""

from __future__ import annotations

import base64
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from denpex.core import kube_client

KEY = re.compile(r"^[-._a-zA-Z0-9]+$")  # a Secret's data key (Kubernetes' own rule)
DATA_LINK = "..data"

# The keys denpex reads from the secret, and what each is for.
DB_URL = "db-url"  # the store's URL, when neither --db nor DENPEX_SERVER_DB gives one
DB_PASSWORD = "db-password"  # PostgreSQL's password, asked at each new connection
OIDC_CLIENT_SECRET = "oidc-client-secret"  # the web client's secret at the OpenID provider
BAO_TOKEN = "bao-token"  # the OpenBao / Vault token of the transit KMS
AWS_ACCESS_KEY_ID = "aws-access-key-id"  # the AWS KMS's access key (with the next)
AWS_SECRET_ACCESS_KEY = "aws-secret-access-key"


class CredentialError(RuntimeError):
    """A credential that cannot be read (never carries the value)."""


class CredentialSource(Protocol):
    def get(self, key: str) -> str | None:
        """The value of `key` now (None when the secret has no such key)."""
        ...

    def describe(self) -> str: ...

    def keys(self) -> list[str]:
        """The keys the secret holds now (names only)."""
        ...


def _check_key(key: str) -> None:
    if not KEY.match(key) or key.startswith(".."):
        raise CredentialError(f"{key!r} is not a Kubernetes secret key")


class MountedSecret:
    """A Secret (or projected volume) mounted at `path`. Each value is cached with the
    `..data` link it was read under; a swapped link (a rotation) reads the file again."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[str, str | None]] = {}  # key → (version, value)
        if not self.path.is_dir():
            raise CredentialError(f"the secret volume {self.path} is not mounted (no such folder)")

    def __repr__(self) -> str:
        return f"MountedSecret({str(self.path)!r})"

    def describe(self) -> str:
        return f"the secret volume at {self.path}"

    def keys(self) -> list[str]:
        return sorted(p.name for p in self.path.iterdir() if not p.name.startswith("."))

    def version(self) -> str:
        """Which copy of the secret the volume shows: the `..data` link's target (a plain
        folder without the kubelet's layout: its files' modification times)."""
        try:
            return os.readlink(self.path / DATA_LINK)
        except OSError:
            stamps = sorted(
                (p.name, p.stat().st_mtime_ns) for p in self.path.iterdir() if p.is_file()
            )
            return repr(stamps)

    def get(self, key: str) -> str | None:
        _check_key(key)
        for _ in range(20):  # each try reads one copy; a copy deleted under us: the next one
            version = self.version()
            with self._lock:
                hit = self._cache.get(key)
            if hit is not None and hit[0] == version:
                return hit[1]
            linked = (self.path / DATA_LINK).is_symlink()
            # read inside the copy `..data` named, so the value belongs to that version
            file = self.path / version / key if linked else self.path / key
            try:
                value: str | None = file.read_text().rstrip("\n")
            except FileNotFoundError:
                if linked and self.version() != version:
                    time.sleep(0.001)  # swapped, and the old copy is being removed: again
                    continue
                value = None  # the current copy has no such key
            except OSError as exc:
                raise CredentialError(
                    f"{self.describe()}: cannot read key {key!r} ({exc.strerror})"
                ) from None
            with self._lock:
                self._cache[key] = (version, value)
            return value
        raise CredentialError(f"{self.describe()}: key {key!r} changed while being read")


class KubeSecret:
    """A Secret read through the API server (in-cluster service account, else kubeconfig,
    else an explicit `host`); read again after `ttl_s`, so a rotation shows within it."""

    def __init__(
        self,
        namespace: str,
        name: str,
        *,
        host: str | None = None,
        ttl_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.namespace, self.name, self.ttl_s = namespace, name, ttl_s
        self._host = host
        self._clock = clock
        self._lock = threading.Lock()
        self._api: Any = None
        self._data: dict[str, str] = {}
        self._fetched: float | None = None

    def __repr__(self) -> str:
        return f"KubeSecret({self.namespace!r}, {self.name!r})"

    def describe(self) -> str:
        return f"the Kubernetes secret {self.namespace}/{self.name}"

    def keys(self) -> list[str]:
        self.get("db-url")  # fetched (or fresh enough) as a read would
        with self._lock:
            return sorted(self._data)

    def _core(self) -> Any:
        if self._api is None:
            try:
                self._api = kube_client.core_v1(self._host)
            except kube_client.KubeUnavailable as exc:
                raise CredentialError(f"{self.describe()}: {exc}") from None
        return self._api

    def _fetch(self) -> dict[str, str]:
        from kubernetes.client.exceptions import ApiException

        try:
            secret = self._core().read_namespaced_secret(self.name, self.namespace)
        except ApiException as exc:
            raise CredentialError(f"{self.describe()}: {exc.status} {exc.reason}") from None
        except OSError as exc:
            raise CredentialError(
                f"{self.describe()}: unreachable ({type(exc).__name__})"
            ) from None
        data = {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}
        data.update(secret.string_data or {})
        return data

    def get(self, key: str) -> str | None:
        _check_key(key)
        with self._lock:
            now = self._clock()
            if self._fetched is None or now - self._fetched >= self.ttl_s:
                self._data = self._fetch()
                self._fetched = now
            return self._data.get(key)


def open_source(spec: str) -> CredentialSource:
    """A credential source from `spec`: k8s-volume:///PATH (a mounted secret) or
    k8s-secret://NAMESPACE/NAME[?ttl_s=30&host=URL] (the API)."""
    parts = urlsplit(spec)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    if parts.scheme == "k8s-volume":
        return MountedSecret(parts.netloc + parts.path if parts.netloc else parts.path)
    if parts.scheme == "k8s-secret":
        name = parts.path.strip("/")
        if not parts.netloc or not name or "/" in name:
            raise CredentialError(f"{spec!r}: expected k8s-secret://NAMESPACE/NAME")
        return KubeSecret(
            parts.netloc, name, host=query.get("host"), ttl_s=float(query.get("ttl_s", 30))
        )
    raise CredentialError(f"{spec!r}: expected k8s-volume:///PATH or k8s-secret://NAMESPACE/NAME")
