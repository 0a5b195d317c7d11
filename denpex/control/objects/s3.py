"""The S3 backend of the object store (boto3), for AWS S3 and any S3-compatible endpoint (Ceph
RGW, moto's server, MinIO): one PUT per object with its SHA-256 as object metadata, with
Content-MD5 (which every S3 server checks, Ceph RGW 16 included) and, unless checksum=md5, also
x-amz-checksum-sha256 (AWS checks it; servers that predate flexible checksums ignore it);
server-side encryption when asked.

Credentials come from boto3's own chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, a
profile, an instance role), as for the AWS KMS. Every botocore failure becomes an ObjectError
that names the bucket and the endpoint and says what to do; it must never leak a traceback or
answer a missing bucket as a missing object.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from denpex.control.objects.model import ObjectError, ObjectInfo, ObjectNotFound, ObjectRefused

_MISSING_KEY = {"NoSuchKey", "404", "NotFound"}
_REFUSED = {
    "AccessDenied": "refused access: give the credentials s3:GetObject, s3:PutObject, "
    "s3:ListBucket and s3:DeleteObject on it",
    "InvalidAccessKeyId": "does not know the access key: check AWS_ACCESS_KEY_ID",
    "SignatureDoesNotMatch": "rejected the request signature: check AWS_SECRET_ACCESS_KEY",
    "AllAccessDisabled": "has all access to the bucket disabled",
}


@dataclass(frozen=True, slots=True)
class S3Options:
    bucket: str
    prefix: str = ""  # keys live under this prefix (no leading or trailing slash)
    endpoint_url: str | None = None  # None: AWS's own endpoint for the region
    region: str = "us-east-1"
    sse: str | None = None  # "AES256" or "aws:kms"
    kms_key: str | None = None  # with sse=aws:kms: the key id or alias (None: the bucket's)
    checksum: str = "sha256"  # "sha256": x-amz-checksum-sha256 too; "md5": Content-MD5 only
    create: bool = False  # create the bucket when it is missing (the appliance's own RGW)
    timeout_s: float = 10.0

    @classmethod
    def from_url(cls, bucket: str, path: str, query: Mapping[str, str]) -> S3Options:
        known = {"endpoint", "region", "sse", "kms_key", "checksum", "create", "timeout"}
        unknown = sorted(set(query) - known)
        if unknown:
            raise ObjectRefused(f"s3:// URL: unknown option {unknown[0]!r} ({', '.join(known)})")
        sse = query.get("sse") or None
        if sse not in (None, "AES256", "aws:kms"):
            raise ObjectRefused(f"s3:// URL: sse={sse!r}: AES256 or aws:kms")
        checksum = query.get("checksum", "sha256")
        if checksum not in ("sha256", "md5"):
            raise ObjectRefused(f"s3:// URL: checksum={checksum!r}: sha256 or md5")
        return cls(
            bucket=bucket,
            prefix=path.strip("/"),
            endpoint_url=query.get("endpoint") or None,
            region=query.get("region", "us-east-1"),
            sse=sse,
            kms_key=query.get("kms_key") or None,
            checksum=checksum,
            create=query.get("create", "").lower() in ("1", "true", "yes"),
            timeout_s=float(query.get("timeout", 10.0)),
        )


class S3Backend:
    kind = "s3"

    def __init__(self, options: S3Options) -> None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise ObjectError(
                "an s3:// object store needs boto3: pip install 'denpex[server]'"
            ) from None
        self.options = options
        at = options.endpoint_url or f"AWS {options.region}"
        self.where = f"s3://{options.bucket}/{options.prefix} at {at}"
        # "when_required": servers without flexible checksums (older RGW, s3rver) refuse the
        # aws-chunked trailer boto3 sends by default; the SHA-256 is sent explicitly instead
        config = Config(
            region_name=options.region,
            connect_timeout=options.timeout_s,
            read_timeout=options.timeout_s,
            retries={"max_attempts": 3, "mode": "standard"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            s3={"addressing_style": "path"},
        )
        # its own session: boto3's default one keeps the first credentials it resolved
        session = boto3.session.Session()
        self.client = session.client("s3", endpoint_url=options.endpoint_url, config=config)

    # --- errors ------------------------------------------------------------------------------

    def _error(self, what: str, exc: Exception) -> ObjectError:
        from botocore.exceptions import (
            ClientError,
            ConnectTimeoutError,
            EndpointConnectionError,
            NoCredentialsError,
            ReadTimeoutError,
        )

        if isinstance(exc, EndpointConnectionError | ConnectTimeoutError | ReadTimeoutError):
            return ObjectError(
                f"object store {self.where}: the endpoint does not answer ({what}); start it "
                "or fix the endpoint in --objects"
            )
        if isinstance(exc, NoCredentialsError):
            return ObjectError(
                f"object store {self.where}: no credentials; set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or a profile) for the server"
            )
        if isinstance(exc, ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code == "NoSuchBucket" or (what == "check" and code in ("404", "NotFound")):
                return ObjectError(
                    f"object store {self.where}: bucket {self.options.bucket!r} does not exist; "
                    "create it, or add create=1 to the --objects URL"
                )
            if code in _REFUSED or code == "403":  # a HEAD's 403 has no body, so no code
                why = _REFUSED.get(code, _REFUSED["AccessDenied"])
                return ObjectError(f"object store {self.where}: the server {why} ({what})")
            if code in _MISSING_KEY:
                return ObjectNotFound(f"no object {what}")
            if code in ("BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch"):
                return ObjectError(
                    f"object store {self.where}: {what}: the server found the bytes changed in "
                    f"transit ({code}); nothing was stored, send it again"
                )
            if code == "InvalidRequest" and self.options.sse is not None:
                return ObjectError(
                    f"object store {self.where}: {what}: the server refused sse="
                    f"{self.options.sse} (InvalidRequest; Ceph RGW serves SSE only over TLS "
                    "with a KMS set up): set it up there, or drop sse= from --objects"
                )
            message = exc.response.get("Error", {}).get("Message") or ""
            return ObjectError(f"object store {self.where}: {what}: {code} {message}".rstrip())
        return ObjectError(f"object store {self.where}: {what}: {type(exc).__name__}: {exc}")

    def _key(self, key: str) -> str:
        return f"{self.options.prefix}/{key}" if self.options.prefix else key

    def _unkey(self, key: str) -> str:
        return key[len(self.options.prefix) + 1 :] if self.options.prefix else key

    # --- the Backend protocol ------------------------------------------------------------------

    def check(self) -> None:
        try:
            self.client.head_bucket(Bucket=self.options.bucket)
            return
        except Exception as exc:
            error = self._error("check", exc)
            if not (self.options.create and "does not exist" in str(error)):
                raise error from None
        try:
            if self.options.region == "us-east-1":
                self.client.create_bucket(Bucket=self.options.bucket)
            else:
                self.client.create_bucket(
                    Bucket=self.options.bucket,
                    CreateBucketConfiguration={"LocationConstraint": self.options.region},
                )
        except Exception as exc:
            raise self._error("create bucket", exc) from None

    def put(self, key: str, data: bytes, sha256: str, content_type: str) -> ObjectInfo:
        args: dict[str, Any] = {
            "Bucket": self.options.bucket,
            "Key": self._key(key),
            "Body": data,
            "ContentType": content_type,
            "Metadata": {"sha256": sha256},
        }
        args["ContentMD5"] = base64.b64encode(hashlib.md5(data).digest()).decode()
        if self.options.checksum == "sha256":
            args["ChecksumSHA256"] = base64.b64encode(bytes.fromhex(sha256)).decode()
        if self.options.sse is not None:
            args["ServerSideEncryption"] = self.options.sse
            if self.options.sse == "aws:kms" and self.options.kms_key:
                args["SSEKMSKeyId"] = self.options.kms_key
        try:
            self.client.put_object(**args)
        except Exception as exc:
            raise self._error(key, exc) from None
        return self.head(key)

    def _info(self, key: str, answer: Mapping[str, Any]) -> ObjectInfo:
        sha256 = (answer.get("Metadata") or {}).get("sha256")
        if not sha256:
            raise ObjectError(
                f"object store {self.where}: {key} has no sha256 metadata (not written by denpex)"
            )
        stored = answer.get("LastModified")
        return ObjectInfo(
            key,
            int(answer["ContentLength"]),
            str(sha256),
            str(answer.get("ContentType") or "application/octet-stream"),
            int(stored.timestamp() * 1e9) if stored is not None else 0,
        )

    def get(self, key: str) -> tuple[bytes, ObjectInfo]:
        try:
            answer = self.client.get_object(Bucket=self.options.bucket, Key=self._key(key))
            data = answer["Body"].read()
        except Exception as exc:
            raise self._error(key, exc) from None
        return data, self._info(key, answer)

    def head(self, key: str) -> ObjectInfo:
        try:
            answer = self.client.head_object(Bucket=self.options.bucket, Key=self._key(key))
        except Exception as exc:
            raise self._error(key, exc) from None
        return self._info(key, answer)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.options.bucket, Prefix=self._key(prefix)
        )
        try:
            keys = [self._unkey(item["Key"]) for page in pages for item in page.get("Contents", [])]
        except Exception as exc:
            raise self._error(f"list {prefix}", exc) from None
        for key in sorted(keys):
            try:
                yield self.head(key)
            except ObjectNotFound:
                continue  # deleted between the listing and the HEAD

    def delete(self, key: str) -> bool:
        try:
            self.head(key)
        except ObjectNotFound:
            return False
        try:
            self.client.delete_object(Bucket=self.options.bucket, Key=self._key(key))
        except Exception as exc:
            raise self._error(key, exc) from None
        return True
