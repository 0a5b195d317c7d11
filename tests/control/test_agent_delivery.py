"""Agent → server: the agent's own spool, shipper and OTLP exporter, configured with
`server: {url, token_file}`, delivering to a real `denpex server` that is killed -9 and
restarted mid-stream. Every acknowledged event (spooled) arrives; none is stored twice."""

from __future__ import annotations

import signal
import threading
import time

import pytest
import sqlalchemy as sa

from denpex.agent.config import ConfigError, load_config
from denpex.agent.otlp import OtlpHttpExporter
from denpex.agent.shipper import Shipper
from denpex.agent.spool import Spool
from denpex.control.db import Database
from tests.control.conftest import ServerProcess, mint
from tests.control.helpers import evidence


def agent_config(tmp_path, url: str, token: str):
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    config_file = tmp_path / "agent.yaml"
    config_file.write_text(f"server: {{url: '{url}/', token_file: '{token_file}'}}\n")
    return load_config(str(config_file))


def test_server_setting_becomes_the_otlp_endpoint(tmp_path):
    config = agent_config(tmp_path, "http://cp:9479", "dpx_x")
    assert config.otlp["endpoint"] == "http://cp:9479"
    assert config.otlp["headers"]["Authorization"] == "Bearer dpx_x"
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "server: {url: 'http://cp', token_file: '/nonexistent/t'}\n"
        "otlp: {endpoint: 'http://c:4318'}\n"
    )
    with pytest.raises(ConfigError, match=r"server\.url and otlp\.endpoint"):
        load_config(str(bad))


def stored(url: str, tenant: str) -> list[str]:
    db = Database(url)
    try:
        with db.tenant_tx(tenant) as conn:
            return list(conn.execute(sa.text("SELECT id FROM evidence")).scalars())
    finally:
        db.dispose()


@pytest.mark.slow
def test_spool_delivery_survives_a_killed_server(tmp_path, server_processes):
    url = f"sqlite:///{tmp_path / 'control.db'}"
    token = mint(url, "red", "operator")
    server = ServerProcess(url, tmp_path / "server.log").start()
    server_processes.append(server)
    config = agent_config(tmp_path, server.base, token)
    otlp = config.otlp
    spool = Spool(tmp_path / "spool", fsync="batch")
    shipper = Shipper(
        spool,
        OtlpHttpExporter(otlp["endpoint"], headers=otlp["headers"], timeout_s=2.0),
        batch_size=50,
        min_backoff_s=0.05,
        max_backoff_s=0.5,
        seed=7,
    )
    shipper.start()
    total, chunk = 3000, 100
    submitted: list[str] = []

    def produce() -> None:
        for start in range(0, total, chunk):
            items = evidence(chunk, host=f"node{start // chunk % 4}", prefix=f"s{start}")
            shipper.submit_evidence(items)  # returned: acknowledged (spooled)
            submitted.extend(e.id for e in items)
            time.sleep(0.02)

    producer = threading.Thread(target=produce)
    producer.start()
    deadline = time.monotonic() + 60
    while len(stored(url, "red")) < total // 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    server.kill(signal.SIGKILL)  # mid-stream: batches in flight are lost to it
    time.sleep(1.0)
    server.start()
    producer.join(60)
    try:
        assert shipper.stop(timeout=60), shipper.stats()
    finally:
        spool.close()
    ids = stored(url, "red")
    assert len(submitted) == total
    assert sorted(ids) == sorted(submitted)  # nothing lost, nothing twice
    assert shipper.stats()["failed_total"] >= 1  # it did see the server down
