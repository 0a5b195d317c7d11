"""gNMI STREAM subscription to switch interface counters and oper-status (OpenConfig), and the
"gnmi" collector: a thread per target fills a latest-values table that `collect()` reads, so a
poll never waits on the network. Never writes to a target (no Set).

Client library: pygnmi (maintained, on grpcio, gNMI protos bundled) builds the channel, TLS,
credentials, Capabilities and the Subscribe request; we iterate its raw stream ourselves so
that a dropped stream is seen at once and reconnected with backoff.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from denpex.core.collector import CollectContext, Observation, poll_finding
from denpex.core.events import Event, metric
from denpex.core.roots import Roots
from denpex.fabric.base import FabricCollector
from denpex.fabric.ufm.collector import read_secret

log = logging.getLogger(__name__)
INSTALL_HINT = "install the gNMI client: pip install 'denpex[fabric]' (pygnmi, grpcio)"
COUNTER_METRICS = {
    "in-octets": "gnmi_interface_in_bytes_total",
    "out-octets": "gnmi_interface_out_bytes_total",
    "in-errors": "gnmi_interface_in_errors_total",
    "out-errors": "gnmi_interface_out_errors_total",
    "in-discards": "gnmi_interface_in_discards_total",
    "out-discards": "gnmi_interface_out_discards_total",
    "in-fcs-errors": "gnmi_interface_in_fcs_errors_total",
}
ERROR_LEAVES = ("in-errors", "out-errors", "in-fcs-errors")
# a target's `network` → the detector of its interface errors: on the RDMA training fabric
# they corrupt IB/RoCE traffic, on a TCP network they surface as socket errors between ranks
ERROR_DETECTORS = {
    "rdma": "net.ib_error.gnmi_interface_errors",
    "tcp": "net.socket_error.gnmi_interface_errors",
}
HELP = {
    "gnmi_target_connected": "1 while the gNMI subscription to the target is open",
    "gnmi_interface_oper_up": "1 when the switch interface's oper-status is UP",
    **{
        name: f"Switch interface counter {leaf} (OpenConfig state/counters)"
        for leaf, name in COUNTER_METRICS.items()
    },
}
Values = dict[tuple[str, str], float | str]  # (interface, leaf) → latest value


def _leaf_name(text: str) -> str:
    return text.rsplit(":", 1)[-1]  # "openconfig-interfaces:in-octets" → "in-octets"


def parse_update(parsed: Mapping[str, Any] | None) -> list[tuple[str, str, float | str]]:
    """pygnmi's `telemetryParser` form of one SubscribeResponse → (interface, leaf, value)
    for the OpenConfig interface leaves; JSON containers are flattened to their leaves."""
    if not parsed or "update" not in parsed:
        return []
    notification = parsed["update"]
    prefix = notification.get("prefix") or ""
    out: list[tuple[str, str, float | str]] = []
    for update in notification.get("update") or []:
        full = "/".join(p.strip("/") for p in (prefix, update.get("path") or "") if p)
        start = full.find("interface[name=")
        if start < 0:
            continue
        end = full.find("]", start)
        name = full[start + len("interface[name=") : end]
        rest = full[end + 1 :].strip("/")
        leaf = _leaf_name(rest.rsplit("/", 1)[-1]) if rest else ""
        value = update.get("val")
        items = (
            [(_leaf_name(k), v) for k, v in _flatten(value)]
            if isinstance(value, dict)
            else [(leaf, value)]
        )
        for key, item in items:
            if key == "oper-status":
                out.append((name, key, str(item).upper()))
            elif key in COUNTER_METRICS:
                try:
                    out.append((name, key, float(item)))  # uint64 arrives as a string in JSON
                except (TypeError, ValueError):
                    continue
    return out


def _flatten(value: Mapping[str, Any]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, item in value.items():
        out += _flatten(item) if isinstance(item, dict) else [(key, item)]
    return out


def subscribe_request(sample_interval_s: float) -> dict[str, Any]:
    """The pygnmi subscribe dict: counters sampled, oper-status on change."""
    return {
        "mode": "stream",
        "subscription": [
            {
                "path": "/interfaces/interface[name=*]/state/counters",
                "mode": "sample",
                "sample_interval": int(sample_interval_s * 1e9),
            },
            {"path": "/interfaces/interface[name=*]/state/oper-status", "mode": "on_change"},
        ],
    }


class TargetStream:
    """One target's subscription, kept open by a daemon thread; `snapshot()` is all the
    collector ever touches."""

    def __init__(self, target: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        self.name = str(target.get("name") or f"{target['address']}:{target['port']}")
        self.target = target
        self.options = options
        self._lock = threading.Lock()
        self._values: Values = {}
        self._connected = False
        self._last_error: str | None = None
        self._last_message = 0.0  # time.monotonic() of the newest response
        self._stop = threading.Event()
        self._client: Any = None
        self._call: Any = None
        self._thread = threading.Thread(target=self._run, name=f"gnmi-{self.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._hang_up()
        self._thread.join(timeout=2.0)

    def snapshot(self) -> tuple[Values, bool, str | None]:
        with self._lock:
            return dict(self._values), self._connected, self._last_error

    def silent_for(self) -> float:
        """Seconds since the open subscription last sent anything (0 when not open)."""
        with self._lock:
            return time.monotonic() - self._last_message if self._connected else 0.0

    def _connect(self) -> Any:
        from pygnmi.client import gNMIclient  # lazy: optional dependency

        t = self.target
        insecure = bool(t.get("insecure", False))
        ca_file, cert, key = t.get("ca_file"), t.get("cert_file"), t.get("key_file")
        if not insecure and not ca_file and t.get("tls_trust_server_cert"):
            # pygnmi then fetches the target's certificate and trusts whatever it is
            log.warning("gnmi target %s: trusting its certificate unverified", self.name)
        elif not insecure and not ca_file:
            raise ValueError(
                f"gnmi target {self.name}: TLS needs ca_file (or insecure: true for a "
                "plaintext lab target)"
            )
        client = gNMIclient(
            target=(str(t["address"]), int(t["port"])),
            username=str(t.get("username") or ""),
            password=read_secret(t, "password") or "",
            insecure=insecure,
            path_cert=cert if cert and key else ca_file,
            path_key=key if cert and key else None,
            path_root=ca_file if cert and key else None,
            override=t.get("tls_server_name"),
            gnmi_timeout=float(self.options.get("connect_timeout_s", 5.0)),
        )
        self._client = client
        return client.connect()

    def _run(self) -> None:
        backoff = float(self.options.get("backoff_initial_s", 1.0))
        most = float(self.options.get("backoff_max_s", 60.0))
        while not self._stop.is_set():
            try:
                from pygnmi.client import telemetryParser

                client = self._connect()
                request = subscribe_request(float(self.options.get("sample_interval_s", 10.0)))
                self._call = client.subscribe(subscribe=request)
                if self._stop.is_set():  # stop() ran while we connected
                    break
                with self._lock:
                    self._connected, self._last_error = True, None
                    self._last_message = time.monotonic()
                backoff = float(self.options.get("backoff_initial_s", 1.0))
                for message in self._call:
                    changes = parse_update(telemetryParser(message))
                    with self._lock:
                        self._last_message = time.monotonic()
                        for interface, leaf, value in changes:
                            self._values[(interface, leaf)] = value
                raise ConnectionError("the target ended the subscription")
            except Exception as exc:  # any failure: record it, back off, reconnect
                why = _describe(exc)
            finally:
                self._hang_up()
            with self._lock:
                self._connected = False
                self._last_error = f"gnmi target {self.name}: {why}"
            self._stop.wait(backoff)
            backoff = min(backoff * 2, most)

    def _hang_up(self) -> None:
        call, client, self._call, self._client = self._call, self._client, None, None
        for action in (getattr(call, "cancel", None), getattr(client, "close", None)):
            try:
                if action:
                    action()
            except Exception:
                pass  # already closed


def _describe(exc: BaseException) -> str:
    """A one-line reason: the gRPC status when there is one, else the exception."""
    inner = getattr(exc, "orig_exc", None) or exc
    details = getattr(inner, "details", None)
    code = getattr(inner, "code", None)
    if callable(details) and callable(code):
        return f"{code().name}: {details()}"
    if type(exc).__name__ == "FutureTimeoutError":
        return "no connection within the connect timeout (unreachable or not a gRPC server)"
    return str(exc) or type(exc).__name__


class GnmiCollector(FabricCollector):
    name = "gnmi"
    stability = "experimental"
    default_interval_s = 15.0
    default_budget_s = 1.0
    metrics_help = HELP

    def __init__(self, roots: Roots, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(roots, options)
        self._streams: list[TargetStream] = []
        self._started = False
        self._last_counters: dict[tuple[str, str, str], float] = {}

    def available(self) -> tuple[bool, str]:
        if importlib.util.find_spec("pygnmi") is None:
            return False, f"pygnmi is not installed; {INSTALL_HINT}"
        targets = self.options.get("targets") or []
        if not targets:
            return False, "no targets configured (collectors.gnmi.targets)"
        networks = {str(t.get("network", "rdma")) for t in targets} - set(ERROR_DETECTORS)
        if networks:
            return False, f"gnmi targets: network must be one of rdma, tcp (not {sorted(networks)})"
        return True, f"interface counters of {len(targets)} gNMI target(s)"

    def degraded(self) -> str | None:
        stale_after = float(self.options.get("stale_after_s", 60.0))
        reasons = []
        for stream in self._streams:
            _, up, error = stream.snapshot()
            silent = stream.silent_for()
            if not up and error:
                reasons.append(error)
            elif up and silent > stale_after:
                reasons.append(f"gnmi target {stream.name}: no update for {silent:.0f} s")
        return "; ".join(reasons) or None

    def collect(self, ctx: CollectContext) -> list[Observation]:
        if not self._started:
            self._started = True
            if self.available()[0]:
                self._streams = [TargetStream(t, self.options) for t in self.options["targets"]]
                for stream in self._streams:
                    stream.start()
        out: list[Observation] = []
        for stream in self._streams:
            values, connected, _ = stream.snapshot()
            out.append(self._metric(ctx, "gnmi_target_connected", float(connected), stream.name))
            out += self._target(ctx, stream, values)
        return out

    def close(self) -> None:
        for stream in self._streams:
            stream.stop()

    def _metric(
        self, ctx: CollectContext, name: str, value: float, target: str, interface: str = ""
    ) -> Event:
        labels = {"target": target, **({"interface": interface} if interface else {})}
        return metric(
            name,
            value,
            source="gnmi",
            counter=name.endswith("_total"),
            labels=labels,
            host=ctx.host,
            ts_ns=ctx.now_ns,
        )

    def _target(
        self, ctx: CollectContext, stream: TargetStream, values: Values
    ) -> list[Observation]:
        out: list[Observation] = []
        patterns = [str(p) for p in stream.target.get("fabric_interfaces") or []]
        threshold = float(self.options.get("error_delta_threshold", 1))
        errors: dict[str, float] = {}
        for (interface, leaf), value in sorted(values.items()):
            key = (stream.name, interface)
            if leaf == "oper-status":
                out.append(
                    self._metric(
                        ctx, "gnmi_interface_oper_up", float(value == "UP"), stream.name, interface
                    )
                )
                fabric = any(fnmatch.fnmatchcase(interface, p) for p in patterns)
                if value == "UP":
                    self.edges.clear(("down", *key))
                elif value == "DOWN" and fabric and self.edges.first(("down", *key)):
                    out.append(self._down_evidence(ctx, stream, interface))
                continue
            assert isinstance(value, float)
            out.append(self._metric(ctx, COUNTER_METRICS[leaf], value, stream.name, interface))
            if leaf in ERROR_LEAVES:
                before = self._last_counters.get((*key, leaf))
                self._last_counters[(*key, leaf)] = value
                if before is not None and value >= before:  # lower: the counter was reset
                    errors[interface] = errors.get(interface, 0.0) + value - before
        for interface, delta in sorted(errors.items()):
            key = (stream.name, interface)
            watched = not patterns or any(fnmatch.fnmatchcase(interface, p) for p in patterns)
            if self.edges.rising(("errors", *key), delta >= threshold and watched):
                out.append(self._error_evidence(ctx, stream, interface, delta))
        return out

    def _down_evidence(
        self, ctx: CollectContext, stream: TargetStream, interface: str
    ) -> Observation:
        return self._evidence(ctx, stream, interface, "net.link_down.gnmi_oper_down", {})

    def _error_evidence(
        self, ctx: CollectContext, stream: TargetStream, interface: str, delta: float
    ) -> Observation:
        network = str(stream.target.get("network", "rdma"))
        extra = {"new_errors": str(int(delta)), "network": network}
        return self._evidence(ctx, stream, interface, ERROR_DETECTORS[network], extra)

    def _evidence(
        self,
        ctx: CollectContext,
        stream: TargetStream,
        interface: str,
        detector_id: str,
        extra: dict[str, str],
    ) -> Observation:
        captures = {"target": stream.name, "interface": interface, **extra}
        return poll_finding(ctx, "gnmi", detector_id, attrs=dict(captures), captures=captures)
