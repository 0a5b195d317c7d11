"""The object store in the control plane: every ingested report is archived byte for byte,
an incident's evidence bundle is built once per incident state and served from the store,
another tenant's ids answer 404, an object store that fails answers 503 and the sender's
retry completes the archive; on the filesystem and on a real S3 server (moto's), and
`denpex server` refuses to start on a bucket that is not there."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from denpex.control.objects import ObjectError
from denpex.control.objects.bundle import read_members
from tests.control.conftest import Api
from tests.control.helpers import report
from tests.control.s3_server import ACCESS, MotoS3


@pytest.fixture(scope="module")
def moto_s3() -> Iterator[MotoS3]:
    server = MotoS3().start()
    yield server
    server.stop()


_buckets = iter(range(1, 1_000_000))


@pytest.fixture(params=["filesystem", "s3"])
def objects_url(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch) -> str:
    if request.param == "filesystem":
        return f"file://{tmp_path / 'objects'}"
    for name, value in ACCESS.items():
        monkeypatch.setenv(name, value)
    server = request.getfixturevalue("moto_s3")
    return f"s3://cp-{next(_buckets)}/denpex?endpoint={server.url}&create=1&sse=AES256"


@pytest.fixture
def api(tmp_path: Path, objects_url: str) -> Iterator[Api]:
    app = Api(f"sqlite:///{tmp_path / 'control.db'}", objects_url=objects_url)
    yield app
    app.close()


def post_raw(api: Api, body: dict, tenant: str = "acme", gzipped: bool = False):
    raw = json.dumps(body, indent=1).encode()  # not how the server would write it back
    headers = {"Content-Type": "application/json"}
    if gzipped:
        headers["Content-Encoding"] = "gzip"
    sent = gzip.compress(raw) if gzipped else raw
    return raw, api.post("/api/v1/reports", tenant=tenant, content=sent, headers=headers)


def test_a_report_is_archived_as_received_and_only_its_tenant_reads_it(api):
    body = report(job="job-7", report_id="r-archived-1")
    raw, reply = post_raw(api, body, gzipped=True)
    assert reply.status_code == 201
    archive = api.get("/api/v1/reports/r-archived-1/archive")
    assert archive.status_code == 200 and archive.content == raw
    assert archive.headers["X-Denpex-Sha256"] == hashlib.sha256(raw).hexdigest()
    assert archive.headers["content-type"] == "application/json"
    assert api.get("/api/v1/reports/r-archived-1/archive", tenant="other").status_code == 404
    assert api.get("/api/v1/reports/r-none/archive").status_code == 404
    listed = api.runtime.objects.for_leader("acme").list("reports")
    assert [name for name, _ in listed] == ["r-archived-1"]
    assert api.runtime.objects.for_leader("other").list("reports") == []


def test_a_failed_archive_answers_503_and_the_retry_archives_it(api, monkeypatch):
    backend = api.runtime.objects.backend
    real_put = backend.put

    def down(*args, **kwargs):
        raise ObjectError(f"object store {backend.where}: the endpoint does not answer")

    monkeypatch.setattr(backend, "put", down)
    body = report(report_id="r-retried")
    raw, reply = post_raw(api, body)
    assert reply.status_code == 503 and "does not answer" in reply.json()["error"]
    monkeypatch.setattr(backend, "put", real_put)
    _, again = post_raw(api, body)
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert api.get("/api/v1/reports/r-retried/archive").content == raw


def test_an_incident_bundle_is_built_once_per_state_and_served_from_the_store(api):
    body = report(job="job-9", report_id="r-bundle-1")
    raw, _ = post_raw(api, body)
    api.tick()
    [incident] = [
        i for i in api.get("/api/v1/incidents").json()["items"] if i["component"]["kind"] == "job"
    ]
    path = f"/api/v1/incidents/{incident['id']}/bundle"
    first = api.get(path)
    assert first.status_code == 200 and first.headers["content-type"] == "application/gzip"
    members = read_members(first.content)
    assert members["reports/r-bundle-1.json"] == raw  # the archive, byte for byte
    assert json.loads(members["incident.json"])["id"] == incident["id"]
    assert {"evidence/r-bundle-1%2Fe1.json", "evidence/r-bundle-1%2Fe2.json"} <= set(members)
    manifest = json.loads(members["manifest.json"])
    assert manifest["tenant"] == "acme" and manifest["format"] == "denpex.bundle/v1"
    for name, entry in manifest["files"].items():
        assert hashlib.sha256(members[name]).hexdigest() == entry["sha256"], name
    assert first.headers["X-Denpex-Sha256"] == hashlib.sha256(first.content).hexdigest()
    again = api.get(path)
    assert again.content == first.content
    stored = api.runtime.objects.for_leader("acme").list("bundles")
    assert len(stored) == 1 and first.headers["X-Denpex-Object"] == f"bundles/{stored[0][0]}"
    # a new state of the incident is a new bundle; the same state rebuilt hashes the same
    api.post(f"/api/v1/incidents/{incident['id']}/acknowledge")
    third = api.get(path)
    assert third.content != first.content
    assert len(api.runtime.objects.for_leader("acme").list("bundles")) == 2
    assert api.get(path, tenant="other").status_code == 404
    assert api.runtime.objects.for_leader("other").list("bundles") == []
    assert api.get("/api/v1/incidents/999999/bundle").status_code == 404


def test_healthz_says_which_object_store_backend_serves(api, objects_url):
    expected = "filesystem" if objects_url.startswith("file:") else "s3"
    assert api.client.get("/healthz").json()["objects"] == expected


def test_the_server_refuses_to_start_on_a_bucket_that_is_not_there(moto_s3, tmp_path):
    url = f"s3://not-made-yet?endpoint={moto_s3.url}"
    env_keys = {**ACCESS}
    done = subprocess.run(
        [
            *(sys.executable, "-m", "denpex", "server"),
            *("--db", f"sqlite:///{tmp_path / 'cp.db'}", "--objects", url),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env_keys},
    )
    assert done.returncode == 2, done.stderr
    assert "bucket 'not-made-yet' does not exist" in done.stderr
    assert "Traceback" not in done.stderr
