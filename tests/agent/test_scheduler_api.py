"""Scheduler isolation and the local API, served for real on loopback.

A collector that hangs must be reported stuck (event, metric, /healthz 503) while the others
keep their cadence; the API must answer Prometheus text and evidence JSON.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.error
import urllib.request
from typing import ClassVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from denpex.agent.config import load_config
from denpex.agent.daemon import Agent
from denpex.core import jsonio
from denpex.core.collector import CollectContext, Collector
from denpex.core.events import Event, metric
from denpex.core.wire import Registration
from denpex.lite.agent_link import AgentLink

RELEASE = threading.Event()


class Ticking(Collector):
    name = "ticking"
    default_interval_s = 0.05
    default_budget_s = 1.0
    metrics_help: ClassVar[dict[str, str]] = {"ticks_total": "Polls of the ticking test collector"}

    def __init__(self, roots, options=None):
        super().__init__(roots, options)
        self.ticks = 0

    def available(self):
        return True, "always"

    def collect(self, ctx: CollectContext):
        self.ticks += 1
        found = [metric("ticks_total", self.ticks, source="ticking", counter=True, host=ctx.host)]
        if self.ticks == 1:
            found.append(
                Event(
                    body="NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
                    source="kmsg",
                )
            )
        return found


class Hanging(Collector):
    name = "hanging"
    default_interval_s = 0.05
    default_budget_s = 0.2

    def available(self):
        return True, "always"

    def collect(self, ctx):
        RELEASE.wait(30)
        return []


class Missing(Collector):
    name = "missing"

    def available(self):
        return False, "no such device here"

    def collect(self, ctx):
        raise AssertionError("an unavailable collector is never polled")


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture
def agent(tmp_path):
    RELEASE.clear()
    config = load_config(overrides={"listen": "127.0.0.1:0", "state_dir": str(tmp_path)})
    agent = Agent(config, collector_classes=(Ticking, Hanging, Missing))
    agent.start()
    yield agent
    RELEASE.set()
    agent.stop()


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_a_hung_collector_is_reported_and_never_delays_the_others(agent):
    url = agent.api.url
    ticking = next(s for s in agent.states if s.name == "ticking")
    hanging = next(s for s in agent.states if s.name == "hanging")
    assert wait_for(lambda: hanging.stuck)
    before = ticking.polls_total
    time.sleep(0.5)
    assert ticking.polls_total - before >= 4  # kept its 50 ms cadence while the other hung
    status, body = get(url + "/healthz")
    report = jsonio.loads(body)
    assert status == 503 and report["status"] == "unhealthy" and report["blind"] == ["hanging"]
    assert report["unavailable"] == {"missing": "no such device here"}

    families = {
        f.name: f for f in text_string_to_metric_families(get(url + "/metrics")[1].decode())
    }
    stuck = {s.labels["collector"]: s.value for s in families["denpex_collector_stuck"].samples}
    assert stuck == {"ticking": 0, "hanging": 1}
    up = {s.labels["collector"]: s.value for s in families["denpex_collector_up"].samples}
    assert up == {"ticking": 1, "hanging": 1, "missing": 0}
    assert families["denpex_ticks"].type == "counter"
    assert families["denpex_ticks"].documentation == "Polls of the ticking test collector"

    RELEASE.set()
    assert wait_for(lambda: not hanging.stuck)
    assert get(url + "/healthz")[0] == 200


def test_evidence_and_registration_over_http(agent):
    url = agent.api.url
    assert wait_for(lambda: agent.pipeline.evidence_since(0))
    status, body = get(url + "/v1/evidence?since=0")
    (item,) = jsonio.loads(body)["evidence"]
    assert status == 200 and item["category"] == "gpu.fallen_off_bus"
    future = time.time_ns() + 10**12
    assert jsonio.loads(get(url + f"/v1/evidence?since={future}")[1])["evidence"] == []
    assert get(url + "/v1/evidence?since=yesterday")[0] == 400

    over_tcp = urllib.request.Request(
        url + "/v1/register", data=b'{"pid": 4242, "job": "llama"}', method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(over_tcp, timeout=5)
    assert refused.value.code == 403 and b"Unix socket" in refused.value.read()

    link = AgentLink(agent.config.socket, timeout_s=5)
    me = os.getpid()
    assert link.register(Registration(pid=me, job="llama", rank=1)), link.reason
    jobs = jsonio.loads(get(url + "/v1/jobs")[1])["jobs"]
    assert [(j["pid"], j["job"], j["rank"]) for j in jobs] == [(me, "llama", 1)]
    assert not link._call("POST", "/v1/register", b'{"pid": "x"}')
    assert "400" in link.reason and "pid" in link.reason
    assert link.unregister(me), link.reason
    assert not link.unregister(me) and "404" in link.reason
    assert get(url + "/nowhere")[0] == 404


def test_reload_restarts_collectors_with_new_settings(agent, tmp_path):
    config = load_config(
        overrides={
            "listen": "127.0.0.1:0",
            "state_dir": str(tmp_path),
            "collectors": {"hanging": {"enabled": False}},
        }
    )
    config.listen = agent.config.listen  # same socket
    RELEASE.set()
    agent.reload(config)
    assert [s.name for s in agent.states] == ["ticking"]
    assert agent.unavailable["hanging"] == "disabled in the configuration"
    assert get(agent.api.url + "/healthz")[0] == 200


OOM_LINE = (
    "Out of memory: Killed process 4242 (python) total-vm:1234kB, anon-rss:5678kB, "
    "file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:100kB oom_score_adj:0"
)


class Slow(Collector):
    """Polls once a minute: only a refresh makes it poll again within the test."""

    name = "slow"
    default_interval_s = 60.0
    default_budget_s = 1.0

    def __init__(self, roots, options=None):
        super().__init__(roots, options)
        self.polls = 0

    def available(self):
        return True, "always"

    def collect(self, ctx):
        self.polls += 1
        if self.polls == 2:  # what the kernel said after the first poll
            return [Event(body=OOM_LINE, source="kmsg")]
        return []


def test_fresh_evidence_polls_every_collector_before_answering(tmp_path):
    config = load_config(overrides={"listen": "127.0.0.1:0", "state_dir": str(tmp_path)})
    agent = Agent(config, collector_classes=(Slow,))
    agent.start()
    try:
        slow = agent.states[0]
        assert wait_for(lambda: slow.delivered_total == 1)
        assert jsonio.loads(get(agent.api.url + "/v1/evidence?since=0")[1])["evidence"] == []
        status, body = get(agent.api.url + "/v1/evidence?since=0&fresh=1")
        reply = jsonio.loads(body)
        assert status == 200 and reply["not_refreshed"] == []
        assert [e["category"] for e in reply["evidence"]] == ["host.oom_killed"]
        assert slow.collector.polls == 2
    finally:
        agent.stop()
