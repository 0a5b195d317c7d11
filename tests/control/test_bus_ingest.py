"""JetStream ingest: the agent's spool and shipper publishing through the JetStreamExporter
to a real 3-node NATS JetStream cluster on loopback, two server replicas consuming one
durable consumer into a real PostgreSQL; the stream's leader is killed mid-stream. Every
acknowledged (spooled) event is stored, none twice. And the consumer's checks, message by
message: the tenant comes from the signing token, never the payload; a forged or tampered
message is refused and audited."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

from denpex.agent.config import ConfigError, load_config
from denpex.agent.delivery import Delivery
from denpex.agent.jetstream import JetStreamExporter
from denpex.agent.otlp import encode_logs
from denpex.agent.shipper import Shipper
from denpex.agent.spool import Spool
from denpex.control.db import Database
from denpex.control.server import Runtime, ServerOptions
from denpex.core import bus
from denpex.core.events import Event
from denpex.enterprise import hash_secret, parse_token
from tests.control.conftest import mint
from tests.control.helpers import evidence
from tests.control.nats_cluster import NatsCluster


def stored(url: str, tenant: str) -> list[str]:
    db = Database(url)
    try:
        with db.tenant_tx(tenant) as conn:
            query = sa.text("SELECT id FROM evidence WHERE tenant = :t")
            return list(conn.execute(query, {"t": tenant}).scalars())
    finally:
        db.dispose()


def audited(url: str, kind: str) -> list[str]:
    db = Database(url)
    try:
        with db.system_tx() as conn:
            rows = conn.execute(sa.text("SELECT line FROM audit WHERE kind = :k"), {"k": kind})
            return list(rows.scalars())
    finally:
        db.dispose()


def signed(token: str, kind: str, payload: bytes, msg_id: str = "m1") -> tuple[str, dict]:
    token_id, secret = parse_token(token) or ("", "")
    name = bus.subject(token_id, kind)
    return name, {
        bus.MSG_ID: msg_id,
        bus.SIGNATURE: bus.sign(hash_secret(secret), name, msg_id, payload),
    }


# --- the consumer's checks (no broker needed: one message at a time) ------------------------


@pytest.fixture
def runtime(tmp_path):
    url = f"sqlite:///{tmp_path / 'control.db'}"
    rt = Runtime(ServerOptions(url=url, jetstream=("nats://127.0.0.1:1",)))
    yield rt, url
    rt.db.dispose()


def test_tenant_comes_from_the_signing_token_and_forgeries_are_refused_and_audited(runtime):
    rt, url = runtime
    red, blue = mint(url, "red", "operator"), mint(url, "blue", "operator")
    consumer = rt.bus
    assert consumer is not None
    payload = encode_logs(evidence(3, prefix="r")).SerializeToString()
    name, headers = signed(red, "logs", payload)
    assert consumer.handle(name, headers, payload) == "stored"
    assert sorted(stored(url, "red")) == ["r-node1-0", "r-node1-1", "r-node1-2"]
    assert consumer.handle(name, headers, payload) == "stored"  # redelivery: a no-op
    assert len(stored(url, "red")) == 3

    # blue's token on red's subject, a tampered payload, no signature: all refused
    _, blue_headers = signed(blue, "logs", payload)
    assert consumer.handle(name, blue_headers, payload) == "refused"
    assert consumer.handle(name, headers, payload + b"\x00") == "refused"
    assert consumer.handle(name, {bus.MSG_ID: "m1"}, payload) == "refused"
    assert consumer.handle("denpex.ingest.red.logs", headers, payload) == "refused"

    # a payload that names another tenant than the signing token's: refused, audited
    other = encode_logs(
        [Event(body="x", host="node9", source="kmsg", tenant="red", ts_ns=1)]
    ).SerializeToString()
    name_b, headers_b = signed(blue, "logs", other, "m2")
    assert consumer.handle(name_b, headers_b, other) == "refused"
    assert stored(url, "blue") == []
    lines = audited(url, "ingest.refused")
    assert len(lines) == 5
    assert any('"tenant":"blue"' in line and "not this token" in line for line in lines)


def test_a_viewer_token_may_not_write_evidence_over_the_bus(runtime):
    rt, url = runtime
    viewer = mint(url, "red", "viewer")
    payload = encode_logs(evidence(1, prefix="v")).SerializeToString()
    name, headers = signed(viewer, "logs", payload)
    assert rt.bus is not None and rt.bus.handle(name, headers, payload) == "refused"
    assert stored(url, "red") == []


def test_jetstream_agent_settings(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("dpx_0123456789abcdef_" + "a" * 43 + "\n")
    config_file = tmp_path / "agent.yaml"
    config_file.write_text(
        "server: {jetstream: {servers: ['nats://a:4222', 'nats://b:4222']}, "
        f"token_file: '{token_file}'}}\n"
    )
    config = load_config(str(config_file), overrides={"state_dir": str(tmp_path / "state")})
    assert config.otlp["jetstream"]["servers"] == ["nats://a:4222", "nats://b:4222"]
    assert config.otlp["jetstream"]["token"].startswith("dpx_0123456789abcdef_")
    delivery = Delivery.from_config(config, {})
    assert delivery is not None and isinstance(delivery.shipper.exporter, JetStreamExporter)
    delivery.stop(timeout_s=0.5)
    config_file.write_text("server: {jetstream: {servers: ['nats://a:4222']}}\n")
    with pytest.raises(ConfigError, match=r"needs server\.token_file"):
        load_config(str(config_file))
    config_file.write_text(
        f"server: {{jetstream: {{servers: ['http://a']}}, token_file: '{token_file}'}}\n"
    )
    with pytest.raises(ConfigError, match="nats:// URLs"):
        load_config(str(config_file))


def test_an_unreachable_broker_is_a_retry_and_the_batch_stays_spooled(tmp_path):
    exporter = JetStreamExporter(["nats://127.0.0.1:1"], "dpx_0123456789abcdef_" + "a" * 43)
    try:
        spool = Spool(tmp_path / "spool")
        shipper = Shipper(spool, exporter, min_backoff_s=0.05, max_backoff_s=0.1)
        shipper.submit_evidence(evidence(5))
        assert shipper._ship_batch() is False
        assert shipper.stats()["failed_by_status"] == {"network": 1}
        assert spool.stats()["records_pending"] == 5
        spool.close()
    finally:
        exporter.close()


# --- the real cluster ----------------------------------------------------------------------


@pytest.fixture
def nats_cluster():
    cluster = NatsCluster(3)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.slow
def test_stream_leader_killed_mid_stream_loses_no_acked_event_stores_none_twice(
    tmp_path, pg_url, nats_cluster
):
    token = mint(pg_url, "red", "operator")
    options = ServerOptions(
        url=pg_url, jetstream=tuple(nats_cluster.urls), jetstream_ack_wait_s=3.0, loop_interval_s=5
    )
    replicas = [Runtime(options), Runtime(options)]
    for rt in replicas:
        rt.start_loop()
    exporter = JetStreamExporter(nats_cluster.urls, token, timeout_s=2.0)
    spool = Spool(tmp_path / "spool", fsync="batch")
    shipper = Shipper(spool, exporter, batch_size=50, min_backoff_s=0.05, max_backoff_s=0.5)
    try:
        for rt in replicas:
            assert rt.bus is not None and rt.bus.ready.wait(60), "no stream within 60 s"
        shipper.start()
        total, chunk = 3000, 100
        submitted: list[str] = []

        def produce() -> None:
            for start in range(0, total, chunk):
                items = evidence(chunk, host=f"node{start // chunk % 4}", prefix=f"s{start}")
                shipper.submit_evidence(items)  # returned: acknowledged (spooled)
                submitted.extend(e.id for e in items)
                time.sleep(0.03)

        producer = threading.Thread(target=produce)
        producer.start()
        deadline = time.monotonic() + 60
        while len(stored(pg_url, "red")) < total // 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        leader = nats_cluster.stream_leader(bus.STREAM)
        nats_cluster.kill(leader)  # mid-stream: publishes and acks in flight are cut
        producer.join(60)
        assert shipper.stop(timeout=60), shipper.stats()  # every batch acked by the stream
        deadline = time.monotonic() + 60
        while len(stored(pg_url, "red")) < total and time.monotonic() < deadline:
            time.sleep(0.1)
        ids = stored(pg_url, "red")
        assert len(submitted) == total
        assert sorted(ids) == sorted(submitted)  # 0 acked events lost, 0 stored twice
        assert nats_cluster.stream_leader(bus.STREAM) != leader
        consumed = [rt.bus.stored for rt in replicas if rt.bus is not None]
        assert sum(consumed) >= total // 50  # the replicas pulled every batch (some twice)
    finally:
        exporter.close()
        spool.close()
        for rt in replicas:
            rt.stop_loop()


def test_a_server_whose_broker_is_down_serves_and_stops_at_once(tmp_path):
    url = f"sqlite:///{tmp_path / 'control.db'}"
    rt = Runtime(ServerOptions(url=url, jetstream=("nats://127.0.0.1:1",)))
    rt.start_loop()
    time.sleep(0.5)  # connecting, in vain
    assert rt.bus is not None and not rt.bus.ready.is_set()
    started = time.monotonic()
    rt.stop_loop(timeout=10)
    assert rt.bus._thread is not None and not rt.bus._thread.is_alive()
    assert time.monotonic() - started < 5
