"""The ufm collector against a UFM REST server on loopback (tests/fabric/ufm_server.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from denpex.core.collector import CollectContext
from denpex.core.events import Event, Evidence
from denpex.core.roots import Roots
from denpex.fabric.ufm.collector import (
    UfmClient,
    UfmCollector,
    UfmError,
    local_guids,
    parse_ufm_time,
    parse_width,
)
from tests.fabric.ufm_server import FakeUfm, fixture

OUR_GUIDS = {"248a:0703:008a:850a": "mlx5_0", "248a:0703:008a:850b": "mlx5_1"}


def make_sysfs(root: Path) -> Roots:
    for guid, device in OUR_GUIDS.items():
        folder = root / "class" / "infiniband" / device
        (folder / "ports" / "1" / "gids").mkdir(parents=True)
        (folder / "node_guid").write_text(guid + "\n")
        (folder / "ports" / "1" / "gids" / "0").write_text(f"fe80:0000:0000:0000:{guid}\n")
    return Roots(sysfs=str(root))


@pytest.fixture
def ufm():
    server = FakeUfm().start()
    yield server
    server.stop()


@pytest.fixture
def roots(tmp_path: Path) -> Roots:
    return make_sysfs(tmp_path / "sys")


def collector(ufm: FakeUfm, roots: Roots, tmp_path: Path, **options) -> UfmCollector:
    secret = tmp_path / "ufm.pw"
    secret.write_text(ufm.password + "\n")
    config = {"url": ufm.url, "username": ufm.username, "password_file": str(secret)}
    return UfmCollector(roots, {**config, **options})


def poll(c: UfmCollector, roots: Roots) -> tuple[list[Event], list[Evidence]]:
    out = c.collect(CollectContext(roots=roots, host="gpu-node-07"))
    for item in out:
        event = item.event if isinstance(item, Evidence) else item
        assert event.host == "gpu-node-07" and event.ts_ns
    return [o for o in out if isinstance(o, Event)], [o for o in out if isinstance(o, Evidence)]


def metrics(events: list[Event], name: str) -> dict[str, float]:
    return {e.attrs.get("port", ""): e.attrs["value"] for e in events if e.body == name}


def test_parsers():
    assert parse_width("4x") == 4 and parse_width("N/A") is None
    assert parse_ufm_time("2026-11-28 09:02:44.120") == 1795856564120000000
    assert parse_ufm_time("2026-11-28 09:02:44") == 1795856564000000000
    assert parse_ufm_time(None) is None


def test_local_guids_from_sysfs(roots):
    assert local_guids(roots) == {"248a0703008a850a", "248a0703008a850b"}
    assert local_guids(Roots(sysfs="/nonexistent-sysfs")) == set()


def test_ports_alarms_events_to_metrics_and_evidence(ufm, roots, tmp_path):
    c = collector(ufm, roots, tmp_path)
    assert c.available()[0]
    events, evidence = poll(c, roots)
    # only this node's ports, asked for by system GUID
    assert metrics(events, "ufm_port_up") == {"248a0703008a850a_1": 1.0, "248a0703008a850b_1": 1.0}
    rate = metrics(events, "ufm_port_rate_bits_per_second")
    assert rate["248a0703008a850a_1"] == 400e9
    assert metrics(events, "ufm_up") == {"": 1.0}
    # where the fabric places this host, for the control plane's topology
    assert c.host_facts() == {"switch": "leaf-sw-03", "switch_guid": "b8599f0300e4c1a0"}
    assert any("system=248a0703008a850a" in path for path, _ in ufm.requests)
    # the Critical alarm is about another switch, the one about us is only a Warning;
    # the Critical event existed before the first poll (baseline)
    assert evidence == []
    active = {
        e.attrs["severity"]: e.attrs["value"] for e in events if e.body == "ufm_alarms_active"
    }
    assert active == {"Warning": 1.0}

    # a port of ours goes down, a Major alarm and new events arrive
    ufm.port("248a0703008a850a_1").update(physical_state="Polling", logical_state="Down")
    ufm.alarms.append(fixture("alarm_link_downed.json"))
    ufm.events += fixture("event_new.json")
    events, evidence = poll(c, roots)
    assert metrics(events, "ufm_port_up")["248a0703008a850a_1"] == 0.0
    by_sig = {e.signature: e for e in evidence}
    assert set(by_sig) == {
        "net.link_down.ufm_port_down",
        "net.link_down.ufm_alarm",
        "net.ib_error.ufm_event",
    }
    down = by_sig["net.link_down.ufm_port_down"]
    assert down.category == "net.link_down" and down.action == "check_fabric"
    assert "leaf-sw-03" in down.summary and down.captures["port"] == "248a0703008a850a_1"
    alarm = by_sig["net.link_down.ufm_alarm"]
    assert alarm.severity == "error" and alarm.captures["alarm_id"] == "7"
    assert alarm.event.ts_ns == parse_ufm_time("2026-11-28 09:02:44.120")
    assert by_sig["net.ib_error.ufm_event"].captures["event_id"] == "97301"  # not gpu-node-11's

    # next poll: nothing new, nothing repeated
    _, evidence = poll(c, roots)
    assert evidence == []


def test_degraded_width_is_link_evidence(ufm, roots, tmp_path):
    c = collector(ufm, roots, tmp_path, expected_speed="NDR")
    poll(c, roots)
    ufm.port("248a0703008a850b_1")["active_width"] = "2x"
    _, evidence = poll(c, roots)
    assert [e.signature for e in evidence] == ["net.link_down.ufm_port_degraded"]
    assert evidence[0].severity == "warning" and "2x of 4x" in evidence[0].summary
    ufm.port("248a0703008a850b_1").update(active_width="4x", active_speed="HDR")
    _, evidence = poll(c, roots)
    assert "HDR below NDR" in evidence[0].summary


def test_state_dir_keeps_dedup_across_restarts(ufm, roots, tmp_path):
    ufm.alarms.append(fixture("alarm_link_downed.json"))
    first = collector(ufm, roots, tmp_path, state_dir=str(tmp_path / "state"))
    _, evidence = poll(first, roots)
    assert [e.captures.get("alarm_id") for e in evidence] == ["7"]
    ufm.events += fixture("event_new.json")
    again = collector(ufm, roots, tmp_path, state_dir=str(tmp_path / "state"))
    _, evidence = poll(again, roots)
    # the alarm is not reported twice; the event is new since the saved id
    assert [e.signature for e in evidence] == ["net.ib_error.ufm_event"]


def test_wrong_credentials_say_so(ufm, roots, tmp_path):
    c = collector(ufm, roots, tmp_path)
    ufm.password = "rotated"
    events, evidence = poll(c, roots)
    assert evidence == []
    why = c.degraded()
    assert why and "refused the username and password (HTTP 401)" in why
    assert "s3cret" not in why and "rotated" not in why
    assert [e.body for e in events if e.kind == "state"] == [why]
    assert metrics(events, "ufm_up") == {"": 0.0}


def test_token_auth_uses_v3(ufm, roots, tmp_path, monkeypatch):
    ufm.token = "tok-123"
    monkeypatch.setenv("UFM_TOKEN_FOR_TEST", "tok-123")
    c = UfmCollector(roots, {"url": ufm.url, "token_env": "UFM_TOKEN_FOR_TEST"})
    events, _ = poll(c, roots)
    assert c.degraded() is None and metrics(events, "ufm_up") == {"": 1.0}
    assert all(path.startswith("/ufmRestV3/") for path, _ in ufm.requests)
    assert "tok-123" not in repr(c._client)


@pytest.mark.parametrize("status", [500, 503])
def test_server_error_then_recovery(ufm, roots, tmp_path, status):
    c = collector(ufm, roots, tmp_path)
    poll(c, roots)
    ufm.fail_status = status
    events, _ = poll(c, roots)
    assert c.degraded() == f"UFM at {ufm.url} answered HTTP {status} for /resources/ports"
    assert len([e for e in events if e.kind == "state"]) == 1
    events, _ = poll(c, roots)  # still blind: no second state event
    assert [e for e in events if e.kind == "state"] == []
    ufm.fail_status = None
    events, _ = poll(c, roots)
    assert c.degraded() is None
    assert [e.body for e in events if e.kind == "state"] == [f"UFM at {ufm.url} answers again"]


def test_timeout_then_recovery(ufm, roots, tmp_path):
    c = collector(ufm, roots, tmp_path, timeout_s=0.3)
    ufm.delay_s = 1.0
    poll(c, roots)
    assert "did not answer /resources/ports within 0.3 s" in (c.degraded() or "")
    ufm.delay_s = 0.0
    poll(c, roots)
    assert c.degraded() is None


def test_unreachable_and_misconfigured(roots, tmp_path):
    c = UfmCollector(
        roots, {"url": "http://127.0.0.1:9", "username": "u", "password_env": "X_UNSET_PW"}
    )
    assert c.available() == (
        False,
        "UFM username given but no password: set password_file or password_env",
    )
    assert UfmCollector(roots, {}).available()[0] is False
    client = UfmClient("http://127.0.0.1:9", username="u", password="p", timeout_s=1)
    with pytest.raises(UfmError, match=r"cannot reach UFM at http://127\.0\.0\.1:9"):
        client.ports(deadline=float("inf"))


def test_no_hca_and_nothing_configured(ufm, tmp_path):
    empty = Roots(sysfs=str(tmp_path / "empty"))
    c = collector(ufm, empty, tmp_path)
    poll(c, empty)
    assert "no HCA found" in (c.degraded() or "")
    c = collector(ufm, empty, tmp_path, systems=["gpu-node-11"])
    events, evidence = poll(c, empty)
    assert metrics(events, "ufm_port_up") == {"0c42a1030079a66d_1": 0.0}
    assert [e.signature for e in evidence] == ["net.link_down.ufm_port_down"]
