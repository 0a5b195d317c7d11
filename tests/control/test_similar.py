"""Similar past incidents over the API, on SQLite, on Debian's PostgreSQL (no pgvector: the
numpy search) and on PostgreSQL 16 with pgvector (pgserver's bundled build): vectors stored
beside the incidents when the leader's pass opens them, found again by a restarted server,
the same answer from every store, the resolution note shown, an incident's summary with its
retrieval block."""

from __future__ import annotations

import itertools
import os
import unittest.mock
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.control.helpers import report
from tests.control.pg import OWNER

_pgvector_names = itertools.count()

CASES = [
    (
        "job-oom",
        "cuda.oom",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    ),
    ("job-disk", "host.disk_full", "OSError: [Errno 28] No space left on device: '/ckpt/step_9'"),
    (
        "job-xid",
        "gpu.fallen_off_bus",
        "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
    ),
]


@pytest.fixture(scope="session")
def pgvector_server(tmp_path_factory) -> Iterator[object]:
    """PostgreSQL 16.2 with pgvector, as the pgserver wheel bundles it (Debian 12 has no
    pgvector); its socket in a temporary folder, no TCP port; stopped at the end."""
    # pgserver keeps a lock in the user's runtime folder, chosen when it is imported: without
    # XDG_RUNTIME_DIR that is /tmp/runtime-<uid>, which would outlive the test run
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    os.environ.setdefault("XDG_RUNTIME_DIR", str(tmp_path_factory.mktemp("runtime")))
    try:
        import pgserver
    finally:
        if runtime is None:
            del os.environ["XDG_RUNTIME_DIR"]
    server = pgserver.get_server(tmp_path_factory.mktemp("pgvector"), cleanup_mode="delete")
    try:
        # a non-superuser owner with PostgreSQL 16's defaults: migration 0001 must grant it
        # SET on the tenant role it creates itself (16 gives a role's creator only ADMIN)
        server.psql(f"CREATE ROLE {OWNER} LOGIN CREATEROLE")
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def pgvector_url(pgvector_server) -> str:
    """A fresh database owned by the non-superuser owner, with the extension created by the
    superuser (pgvector is not a trusted extension: a DBA creates it, as in production)."""
    name = f"v{os.getpid()}_{next(_pgvector_names)}"
    pgvector_server.psql(f"CREATE DATABASE {name} OWNER {OWNER}")
    import psycopg

    socket_dir = parse_qs(urlsplit(pgvector_server.get_uri()).query)["host"][0]
    with psycopg.connect(host=socket_dir, user="postgres", dbname=name, autocommit=True) as c:
        c.execute("CREATE EXTENSION vector")
    return f"postgresql://{OWNER}@/{name}?host={socket_dir}"


@pytest.fixture(params=["sqlite", "postgresql", "pgvector"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'control.db'}"
    return request.getfixturevalue("pg_url" if request.param == "postgresql" else "pgvector_url")


def seed(api) -> dict[str, int]:
    """The three jobs' reports, one leader pass; {category: its job incident's id}."""
    for job, category, line in CASES:
        body = report(job=job, category=category)
        diag = body["diagnosis"]
        diag["root_cause"]["signature"] = None
        diag["summary"] = f"{line} (rank 3 on node1)."
        diag["timeline"][1].update(line=line, category=category, signature=category + ".x")
        assert api.post("/api/v1/reports", json=body).status_code == 201
    api.tick()
    items = api.get("/api/v1/incidents").json()["items"]
    # the jobs' own incidents (the fleet rules add one for the GPU that fell off the bus)
    return {i["category"]: i["id"] for i in items if i["component"]["kind"] == "job"}


@pytest.fixture
def seeded(api, monkeypatch):
    monkeypatch.setenv("DENPEX_RAG", "on")
    return api, seed(api)


def _counting_encode():
    """A patch of Embedder.encode that records how many texts each call embeds."""
    from denpex.retrieval import embedding

    calls: list[int] = []
    real = embedding.Embedder.encode

    def counting(self, texts):
        calls.append(len(texts))
        return real(self, texts)

    return calls, unittest.mock.patch.object(embedding.Embedder, "encode", counting)


def test_each_store_searches_the_way_it_can(seeded, request):
    api, _ = seeded
    from denpex.control import pgvector_search

    engine = request.node.callspec.params["db_url"]
    assert pgvector_search.available(api.runtime.db) is (engine == "pgvector")


def test_a_restarted_server_finds_the_incident_without_embedding_it_again(db_url, monkeypatch):
    monkeypatch.setenv("DENPEX_RAG", "on")
    from tests.control.conftest import Api

    first = Api(db_url)
    try:
        ids = seed(first)  # the leader's pass stores each new incident's vector
    finally:
        first.close()
    again = Api(db_url)
    try:
        calls, patch = _counting_encode()
        with patch:
            again.tick()  # a new leader: nothing is left to embed
            reply = again.get("/api/v1/incidents/similar", params={"q": "No space left on device"})
        assert reply.status_code == 200, reply.text
        assert reply.json()["items"][0]["id"] == f"incident:{ids['host.disk_full']}"
        assert calls == [1], "only the query is embedded: the incidents' vectors were stored"
    finally:
        again.close()


def test_every_store_gives_the_same_answer(tmp_path, pg_url, pgvector_url, monkeypatch):
    """numpy over SQLite, numpy over Debian's PostgreSQL and pgvector: same incidents, same
    order, same similarity (to float32 rounding)."""
    monkeypatch.setenv("DENPEX_RAG", "on")
    from tests.control.conftest import Api

    queries = [
        "CUDA out of memory. Tried to allocate 512.00 MiB on GPU 1",
        "OSError: [Errno 28] No space left on device\nRuntimeError: checkpoint save failed",
        "GPU has fallen off the bus",
    ]
    answers = []
    for url in (f"sqlite:///{tmp_path / 'control.db'}", pg_url, pgvector_url):
        api = Api(url)
        try:
            ids = seed(api)
            names = {v: k for k, v in ids.items()}
            got = []
            for q in queries:
                items = api.get("/api/v1/incidents/similar", params={"q": q, "k": 3}).json()
                got.append(
                    [
                        (names.get(int(i["id"].split(":")[1]), i["category"]), i["score"])
                        for i in items["items"]
                    ]
                )
            answers.append(got)
        finally:
            api.close()
    sqlite, debian, pgvector = answers
    assert [[c for c, _ in q] for q in sqlite] == [[c for c, _ in q] for q in pgvector]
    assert [[c for c, _ in q] for q in sqlite] == [[c for c, _ in q] for q in debian]
    for a, b in zip(sqlite, pgvector, strict=True):
        assert [s for _, s in a] == pytest.approx([s for _, s in b], abs=2e-4)
    assert sqlite[0][0][0] == "cuda.oom" and sqlite[1][0][0] == "host.disk_full"


def test_the_nearest_incident_comes_first_with_how_it_was_resolved(seeded):
    api, ids = seeded
    path = f"/api/v1/incidents/{ids['cuda.oom']}/resolve"
    done = api.post(path, json={"note": "lowered the micro-batch to 4"}).json()
    assert done["resolved"]["note"] == "lowered the micro-batch to 4"
    reply = api.get(
        "/api/v1/incidents/similar",
        params={"q": "CUDA out of memory. Tried to allocate 512.00 MiB on GPU 1", "k": 2},
    )
    assert reply.status_code == 200, reply.text
    items = reply.json()["items"]
    assert items[0]["id"] == f"incident:{ids['cuda.oom']}"
    assert items[0]["resolution"].startswith("resolved by token:")
    assert items[0]["resolution"].endswith(": lowered the micro-batch to 4")
    assert items[1]["resolution"] == "open, not resolved yet"
    assert len(items) == 2 and items[0]["score"] > items[1]["score"]


def test_vectors_are_stored_once_and_the_other_tenant_sees_none(seeded):
    api, _ = seeded
    from denpex.control.store import TenantStore
    from denpex.retrieval import embedding

    q = {"q": "No space left on device"}
    assert api.get("/api/v1/incidents/similar", params=q).json()["items"][0]["category"] == (
        "host.disk_full"
    )
    calls, patch = _counting_encode()
    with patch:
        api.get("/api/v1/incidents/similar", params=q)
    assert calls == [1], "only the query is embedded once the incidents' vectors are stored"
    stored = TenantStore(api.runtime.store, "acme", None).incident_vectors(embedding.MODEL_ID, 10)
    every = api.get("/api/v1/incidents").json()["items"]
    assert len(stored) == len(every) >= 3 and all(vector is not None for _, vector in stored)
    assert (
        TenantStore(api.runtime.store, "globex", None).incident_vectors(embedding.MODEL_ID, 10)
        == []
    )
    assert api.get("/api/v1/incidents/similar", params=q, tenant="globex").json()["items"] == []


def test_an_incident_summary_keeps_its_explanation_and_cites_the_others(seeded):
    api, ids = seeded
    reply = api.get(f"/api/v1/incidents/{ids['host.disk_full']}/summary")
    assert reply.status_code == 200, reply.text
    body = reply.json()
    incident = api.get(f"/api/v1/incidents/{ids['host.disk_full']}").json()
    assert body["explanation"] == incident["explanation"]  # unchanged, first
    block = body["retrieval"]
    assert block["evidence"] == ["e2"], block
    assert f"incident:{ids['host.disk_full']}" not in {i["id"] for i in block["incidents"]}
    assert "host.disk_full" in {r.get("category") for r in block["runbook"]}
    assert "runbook (for evidence e2)" in body["text"]


def test_without_the_extra_the_server_says_what_to_install(seeded, monkeypatch):
    api, ids = seeded
    monkeypatch.setenv("DENPEX_RAG", "off")
    reply = api.get("/api/v1/incidents/similar", params={"q": "anything"})
    assert reply.status_code == 503 and "denpex[rag]" in reply.json()["error"]["message"]
    summary = api.get(f"/api/v1/incidents/{ids['cuda.oom']}/summary").json()
    assert summary["retrieval"] is None and summary["explanation"]


def test_a_resolve_note_must_be_text(seeded):
    api, ids = seeded
    path = f"/api/v1/incidents/{ids['gpu.fallen_off_bus']}/resolve"
    assert api.post(path, json={"note": 5}).status_code == 400
    assert (
        api.post(path, content=b"{", headers={"content-type": "application/json"}).status_code
        == 400
    )
    assert api.post(path).json()["resolved"]["note"] is None  # no body: as before


@pytest.mark.slow
def test_denpex_scan_shows_a_resolved_past_incident_from_the_server(tmp_path, server_processes):
    """The whole path: a scan ships its report, the server opens an incident, an operator
    resolves it with a note, and the next scan of the same failure shows it under its verdict."""
    import json
    import os
    import subprocess
    import sys
    import time
    import urllib.request
    from pathlib import Path

    from tests.control.conftest import ServerProcess, mint

    url = f"sqlite:///{tmp_path / 'control.db'}"
    token = mint(url, "red", "operator")
    os.environ["DENPEX_RAG"] = "on"  # the server process inherits it
    try:
        server = ServerProcess(url, tmp_path / "server.log").start()
    finally:
        os.environ["DENPEX_RAG"] = "off"
    server_processes.append(server)
    log = Path(__file__).resolve().parents[1] / "corpus" / "ckpt_enospc.log"
    env = {
        **os.environ,
        "DENPEX_RAG": "on",
        "DENPEX_AGENT_URL": "off",
        "DENPEX_SERVER_URL": server.base,
        "DENPEX_TOKEN": token,
        "DENPEX_OUTBOX": str(tmp_path / "outbox"),
        "COLUMNS": "120",
    }

    def scan(job: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "denpex", "scan", "--no-color", str(log)],
            env={**env, "DENPEX_JOB": job},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 1, done.stderr
        return done.stderr

    def call(path: str, data: bytes | None = None) -> dict:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        request = urllib.request.Request(server.base + path, data, headers)
        with urllib.request.urlopen(request, timeout=30) as reply:
            return json.loads(reply.read())

    first = scan("job-1")
    assert "similar past incidents" not in first  # nothing in the past yet
    deadline = time.monotonic() + 60
    while not (items := call("/api/v1/incidents")["items"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert items, "the server opened no incident"
    note = json.dumps({"note": "moved checkpoints to the bigger volume"}).encode()
    call(f"/api/v1/incidents/{items[0]['id']}/resolve", note)
    second = scan("job-2")
    head, _, block = second.partition("similar past incidents (for evidence")
    assert "root cause: host.disk_full" in head
    assert f"[incident:{items[0]['id']}] host.disk_full" in block
    assert "moved checkpoints to the bigger volume" in " ".join(block.split())
    assert "job job-2" not in block  # the incident its own report opened is not "past"
