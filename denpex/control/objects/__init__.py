"""The control plane's object store: report archives, incident evidence bundles and RMA
attachments kept as objects under tenants/<tenant>/<kind>/<name>, on an S3-compatible
endpoint (s3.py, boto3) or on the local filesystem (files.py, the default and the fallback).

The tenant of every key comes from the caller's authenticated principal (`scoped`) or from
the leader's own per-tenant pass (`for_leader`), never from a payload; a name cannot climb
out of its kind's folder. Every object carries its SHA-256, checked again on each read, and
its kind's size limit (objects.yaml) is enforced before anything is written.
"""

from __future__ import annotations

from urllib.parse import parse_qs, unquote, urlsplit

from denpex.control.objects.model import (
    TENANT_ROOT,
    Backend,
    ObjectCorrupt,
    ObjectError,
    ObjectInfo,
    ObjectNotFound,
    ObjectRefused,
    ObjectTooLarge,
    segment,
    settings,
    sha256_of,
)
from denpex.enterprise import Principal, is_authentic

__all__ = [
    "Backend",
    "ObjectCorrupt",
    "ObjectError",
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectRefused",
    "ObjectStore",
    "ObjectTooLarge",
    "TenantObjects",
    "open_objects",
]


class TenantObjects:
    """One tenant's objects: every key is built here from the bound tenant and a kind."""

    def __init__(self, store: ObjectStore, tenant: str) -> None:
        self.store = store
        self.tenant = tenant
        self._prefix = f"{TENANT_ROOT}/{segment(tenant)}/"

    def folder(self, kind: str) -> str:
        if kind not in settings()["kinds"]:
            raise ObjectRefused(f"object kind {kind!r}: one of {', '.join(settings()['kinds'])}")
        return f"{self._prefix}{kind}/"

    def key(self, kind: str, name: str) -> str:
        return self.folder(kind) + segment(name)

    def put(self, kind: str, name: str, data: bytes, content_type: str) -> ObjectInfo:
        key = self.key(kind, name)
        spec = settings()["kinds"][kind]
        if content_type not in spec["content_types"]:
            raise ObjectRefused(f"{kind}: content type {content_type!r} not accepted")
        if len(data) > int(spec["max_bytes"]):
            raise ObjectTooLarge(
                f"{kind}/{name}: {len(data)} bytes is over the {spec['max_bytes']}-byte limit "
                "(objects.yaml)"
            )
        return self.store.backend.put(key, data, sha256_of(data), content_type)

    def get(self, kind: str, name: str) -> tuple[bytes, ObjectInfo]:
        data, info = self.store.backend.get(self.key(kind, name))
        if sha256_of(data) != info.sha256:
            raise ObjectCorrupt(
                f"{kind}/{name} in {self.store.backend.where}: the bytes read back do not "
                f"match their SHA-256 {info.sha256}; restore the object from a backup"
            )
        return data, info

    def head(self, kind: str, name: str) -> ObjectInfo:
        return self.store.backend.head(self.key(kind, name))

    def exists(self, kind: str, name: str) -> bool:
        try:
            self.head(kind, name)
        except ObjectNotFound:
            return False
        return True

    def list(self, kind: str) -> list[tuple[str, ObjectInfo]]:
        """(name within the kind, info) of every object of `kind`, by key."""
        folder = self.folder(kind)
        return [
            (unquote(info.key[len(folder) :]), info) for info in self.store.backend.list(folder)
        ]

    def delete(self, kind: str, name: str) -> bool:
        return self.store.backend.delete(self.key(kind, name))

    def read(self, ref: str) -> bytes:
        """The bytes of `kind/name` (how a notice names an attachment)."""
        kind, _, name = ref.partition("/")
        return self.get(kind, name)[0]


class ObjectStore:
    """The handle the server holds; tenant views come only from `scoped` / `for_leader`."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    @property
    def where(self) -> str:
        return self.backend.where

    @property
    def kind(self) -> str:
        return self.backend.kind

    def scoped(self, principal: Principal) -> TenantObjects:
        """The objects of an authenticated principal's tenant (and of no one else)."""
        if not is_authentic(principal):
            raise PermissionError("a tenant's objects need a Principal from denpex.enterprise")
        return TenantObjects(self, principal.tenant)

    def for_leader(self, tenant: str) -> TenantObjects:
        """The leader's per-tenant passes (RMA hand-off): the tenant it is working for."""
        return TenantObjects(self, tenant)

    def read_for(self, tenant: str, ref: str) -> bytes:
        """What the notifier reads an attachment with: `ref` is kind/name in `tenant`."""
        return self.for_leader(tenant).read(ref)


def open_objects(url: str) -> ObjectStore:
    """An object store from a URL: file:///PATH, or s3://BUCKET[/PREFIX][?endpoint=URL&
    region=R&sse=AES256|aws:kms&kms_key=ID&checksum=sha256|md5&create=1] (credentials from
    boto3's chain: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, a profile, an instance role)."""
    parts = urlsplit(url)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ObjectRefused(f"--objects {url!r}: file:///ABSOLUTE/PATH")
        from denpex.control.objects.files import FileBackend

        return ObjectStore(FileBackend(parts.path))
    if parts.scheme == "s3":
        from denpex.control.objects.s3 import S3Backend, S3Options

        if not parts.netloc:
            raise ObjectRefused(f"--objects {url!r}: s3://BUCKET[/PREFIX]")
        return ObjectStore(S3Backend(S3Options.from_url(parts.netloc, parts.path, query)))
    raise ObjectRefused(f"--objects {url!r}: expected file:///PATH or s3://BUCKET[/PREFIX]")
