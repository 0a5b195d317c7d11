"""The S3 backend against Debian's Ceph RGW on loopback (tests/control/rgw_server.py): the
semantics every backend shares, and what only a real S3 implementation shows: signatures
and unknown keys refused, Content-MD5 checked (a body changed in transit is refused and
nothing is stored), SSE refused where RGW has no KMS, and the control plane's archive and
bundle routes served from RGW. Skipped only where the Ceph binaries are not installed
(scripts/system-packages.txt lists them, so CI has them)."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator

import pytest

from denpex.control.objects import ObjectError, ObjectNotFound, open_objects
from tests.control.rgw_server import CephRgw, missing_binaries

pytestmark = [
    pytest.mark.slow,  # a Ceph monitor, OSD and radosgw start for the module (~15 s)
    pytest.mark.skipif(
        bool(missing_binaries()),
        reason=f"Ceph RGW not installed ({', '.join(missing_binaries())} missing): "
        "apt-get install ceph-mon ceph-osd radosgw ceph-common (scripts/system-packages.txt)",
    ),
]


@pytest.fixture(scope="module")
def rgw(tmp_path_factory) -> Iterator[CephRgw]:
    server = CephRgw(tmp_path_factory.mktemp("ceph"))
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def keys(rgw, monkeypatch):
    for name, value in rgw.keys.items():
        monkeypatch.setenv(name, value)


def test_rgw_put_get_head_list_delete(rgw, keys):
    store = open_objects(f"s3://denpex-objects/cp?endpoint={rgw.url}&create=1")
    store.backend.check()
    red, blue = store.for_leader("red"), store.for_leader("blue")
    body = b'{"id": "r-1"}'
    info = red.put("reports", "r-1", body, "application/json")
    assert info.sha256 == hashlib.sha256(body).hexdigest()
    assert red.get("reports", "r-1") == (body, red.head("reports", "r-1"))
    assert [n for n, _ in red.list("reports")] == ["r-1"]
    assert blue.list("reports") == []
    with pytest.raises(ObjectNotFound):
        blue.get("reports", "r-1")
    assert red.delete("reports", "r-1") and not red.delete("reports", "r-1")


def test_rgw_refuses_a_wrong_secret_an_unknown_key_and_a_damaged_body(rgw, keys, monkeypatch):
    url = f"s3://denpex-auth?endpoint={rgw.url}&create=1"
    store = open_objects(url)
    store.backend.check()
    store.for_leader("red").put("reports", "r", b"{}", "application/json")
    backend = store.backend
    damaged = base64.b64encode(hashlib.md5(b"other bytes").digest()).decode()
    with pytest.raises(Exception, match="BadDigest"):  # Content-MD5 that is not the body's
        backend.client.put_object(Bucket="denpex-auth", Key="x", Body=b"{}", ContentMD5=damaged)
    assert not store.for_leader("red").exists("reports", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(ObjectError, match="signature: check AWS_SECRET_ACCESS_KEY"):
        open_objects(url).for_leader("red").get("reports", "r")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "NOBODYHASTHISKEY0000")
    with pytest.raises(ObjectError, match="does not know the access key"):
        open_objects(url).for_leader("red").get("reports", "r")


def test_rgw_a_missing_bucket_and_refused_encryption_are_named(rgw, keys):
    with pytest.raises(ObjectError, match="bucket 'not-made' does not exist"):
        open_objects(f"s3://not-made?endpoint={rgw.url}").backend.check()
    store = open_objects(f"s3://denpex-sse?endpoint={rgw.url}&create=1&sse=AES256")
    store.backend.check()
    with pytest.raises(ObjectError, match="refused sse=AES256"):
        store.for_leader("red").put("reports", "r", b"{}", "application/json")


def test_rgw_serves_the_control_planes_archives_and_bundles(rgw, keys, tmp_path):
    from tests.control.conftest import Api
    from tests.control.helpers import report
    from tests.control.test_object_routes import post_raw

    url = f"s3://denpex-cp/site-a?endpoint={rgw.url}&create=1"
    api = Api(f"sqlite:///{tmp_path / 'cp.db'}", objects_url=url)
    try:
        raw, reply = post_raw(api, report(job="job-rgw", report_id="r-rgw-1"))
        assert reply.status_code == 201
        assert api.get("/api/v1/reports/r-rgw-1/archive").content == raw
        api.tick()
        items = api.get("/api/v1/incidents").json()["items"]
        incident = next(i["id"] for i in items if i["component"]["kind"] == "job")
        bundle = api.get(f"/api/v1/incidents/{incident}/bundle")
        assert bundle.status_code == 200
        assert api.client.get("/healthz").json()["objects"] == "s3"
        keys_in_bucket = [
            item["Key"]
            for item in api.runtime.objects.backend.client.list_objects_v2(Bucket="denpex-cp")[
                "Contents"
            ]
        ]
        assert "site-a/tenants/acme/reports/r-rgw-1" in keys_in_bucket
        assert any(k.startswith("site-a/tenants/acme/bundles/incident-") for k in keys_in_bucket)
    finally:
        api.close()
