"""The gnmi collector against a gNMI target on loopback (tests/fabric/gnmi_server.py)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

pytest.importorskip("pygnmi", reason="pip install 'denpex[fabric]'")

from denpex.core.collector import CollectContext
from denpex.core.events import Event, Evidence
from denpex.core.roots import Roots
from denpex.fabric.gnmi import GnmiCollector, parse_update
from tests.fabric.gnmi_server import FakeGnmiTarget, free_port

ROOTS = Roots()
FAST = {"connect_timeout_s": 1.0, "backoff_initial_s": 0.1, "backoff_max_s": 0.4}


def wait_until(check: Callable[[], object], timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(0.05)


@pytest.fixture
def switch():
    target = FakeGnmiTarget().start()
    yield target
    target.stop()


def make(switch: FakeGnmiTarget, monkeypatch, **target_options) -> GnmiCollector:
    monkeypatch.setenv("GNMI_PW_FOR_TEST", switch.password)
    target = {
        "name": "leaf-sw-03",
        "address": switch.address,
        "port": switch.port,
        "insecure": True,
        "username": switch.username,
        "password_env": "GNMI_PW_FOR_TEST",
        "fabric_interfaces": ["Ethernet1/*"],
        **target_options,
    }
    return GnmiCollector(ROOTS, {**FAST, "targets": [target]})


@pytest.fixture
def collectors():
    made: list[GnmiCollector] = []
    yield made
    for c in made:
        c.close()


def poll(c: GnmiCollector) -> tuple[dict[tuple[str, str], float], list[Evidence]]:
    out = c.collect(CollectContext(roots=ROOTS, host="gpu-node-07"))
    values = {}
    for item in out:
        event = item.event if isinstance(item, Evidence) else item
        assert event.host == "gpu-node-07" and event.ts_ns
        if isinstance(item, Event):
            values[(item.body, item.attrs.get("interface", ""))] = item.attrs["value"]
    return values, [o for o in out if isinstance(o, Evidence)]


def test_parse_update_typed_and_json_values():
    parsed = {
        "update": {
            "prefix": "interfaces/interface[name=Ethernet1/1]/state",
            "update": [
                {"path": "counters/in-octets", "val": 5},
                {"path": "oper-status", "val": "down"},
                {"path": "counters", "val": {"openconfig-interfaces:in-errors": "7"}},
                {"path": "description", "val": "uplink"},
            ],
        }
    }
    assert parse_update(parsed) == [
        ("Ethernet1/1", "in-octets", 5.0),
        ("Ethernet1/1", "oper-status", "DOWN"),
        ("Ethernet1/1", "in-errors", 7.0),
    ]
    assert parse_update({"sync_response": True}) == [] and parse_update(None) == []


def test_values_arrive_and_down_interface_is_evidence(switch, monkeypatch, collectors):
    c = make(switch, monkeypatch)
    collectors.append(c)
    assert c.available()[0]
    switch.interfaces["Ethernet1/1"]["in-octets"] = 1234
    poll(c)  # starts the subscription; never waits for it
    wait_until(lambda: poll(c)[0].get(("gnmi_interface_in_bytes_total", "Ethernet1/1")) == 1234)
    values, evidence = poll(c)
    assert values[("gnmi_target_connected", "")] == 1.0
    assert values[("gnmi_interface_oper_up", "Ethernet1/2")] == 1.0
    assert evidence == [] and c.degraded() is None
    sub = switch.subscriptions[0].subscription
    assert [s.mode for s in sub] == [2, 1]  # SAMPLE counters, ON_CHANGE oper-status
    assert sub[0].sample_interval == 10_000_000_000

    switch.push("Ethernet1/2", oper_status="DOWN")
    evidence: list[Evidence] = []

    def saw_down() -> bool:
        values, found = poll(c)
        evidence.extend(found)
        return values.get(("gnmi_interface_oper_up", "Ethernet1/2")) == 0.0

    wait_until(saw_down)
    assert [e.signature for e in evidence] == ["net.link_down.gnmi_oper_down"]
    assert evidence[0].captures == {"target": "leaf-sw-03", "interface": "Ethernet1/2"}
    assert evidence[0].action == "check_fabric"
    assert poll(c)[1] == []  # reported once


def test_error_counters_rising_is_evidence(switch, monkeypatch, collectors):
    c = make(switch, monkeypatch, network="tcp")
    collectors.append(c)
    poll(c)
    wait_until(lambda: ("gnmi_interface_in_errors_total", "Ethernet1/1") in poll(c)[0])
    switch.push("Ethernet1/1", in_errors=40, in_fcs_errors=2)
    found: list[Evidence] = []
    wait_until(lambda: found.extend(poll(c)[1]) or found)
    assert [e.signature for e in found] == ["net.socket_error.gnmi_interface_errors"]
    assert found[0].captures["new_errors"] == "42"


def test_server_restart_reconnects_and_values_resume(switch, monkeypatch, collectors):
    c = make(switch, monkeypatch)
    collectors.append(c)
    poll(c)
    wait_until(lambda: poll(c)[0].get(("gnmi_target_connected", "")) == 1.0)
    switch.stop()
    wait_until(lambda: c.degraded() is not None)
    assert "leaf-sw-03" in (c.degraded() or "")
    assert poll(c)[0][("gnmi_target_connected", "")] == 0.0
    switch.interfaces["Ethernet1/1"]["out-octets"] = 999
    switch.start()
    wait_until(lambda: poll(c)[0].get(("gnmi_interface_out_bytes_total", "Ethernet1/1")) == 999)
    assert c.degraded() is None


def test_unreachable_target_is_degraded_and_collect_never_blocks(monkeypatch, collectors):
    target = {"name": "gone", "address": "127.0.0.1", "port": free_port(), "insecure": True}
    c = GnmiCollector(ROOTS, {**FAST, "targets": [target]})
    collectors.append(c)
    started = time.monotonic()
    values, _ = poll(c)
    assert time.monotonic() - started < 0.5
    assert values[("gnmi_target_connected", "")] == 0.0
    wait_until(lambda: c.degraded() is not None)
    assert (c.degraded() or "").startswith("gnmi target gone: ")


def test_silent_subscription_is_degraded(switch, monkeypatch, collectors):
    c = make(switch, monkeypatch)
    c.options["stale_after_s"] = 0.5  # the test target sends nothing after its first sync
    collectors.append(c)
    poll(c)
    wait_until(lambda: "no update for" in (c.degraded() or ""))
    switch.push("Ethernet1/1", in_octets=1)
    wait_until(lambda: c.degraded() is None, timeout_s=2.0)


def test_wrong_password_is_degraded(switch, monkeypatch, collectors):
    c = make(switch, monkeypatch)
    collectors.append(c)
    switch.password = "rotated"
    poll(c)
    wait_until(lambda: c.degraded() is not None)
    assert "UNAUTHENTICATED" in (c.degraded() or "")


def test_tls_without_ca_is_refused(switch, monkeypatch, collectors):
    c = make(switch, monkeypatch, insecure=False)
    collectors.append(c)
    poll(c)
    wait_until(lambda: c.degraded() is not None)
    assert "TLS needs ca_file" in (c.degraded() or "")


def test_available_says_what_is_missing():
    assert GnmiCollector(ROOTS, {}).available() == (
        False,
        "no targets configured (collectors.gnmi.targets)",
    )
