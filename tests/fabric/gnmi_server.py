"""A gNMI target on loopback for tests: a grpcio server implementing Capabilities and
Subscribe (STREAM) with the protobuf classes pygnmi ships, streaming scripted OpenConfig
interface notifications.

Starts, stops and restarts on the same 127.0.0.1 port (reconnect tests); never listens
elsewhere; checks the username/password metadata a gNMI client sends.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from concurrent import futures
from typing import Any

import grpc
from pygnmi.spec.v080 import gnmi_pb2, gnmi_pb2_grpc

COUNTERS = (
    "in-octets",
    "out-octets",
    "in-errors",
    "out-errors",
    "in-discards",
    "out-discards",
    "in-fcs-errors",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def interface_prefix(name: str) -> gnmi_pb2.Path:
    return gnmi_pb2.Path(
        elem=[
            gnmi_pb2.PathElem(name="interfaces"),
            gnmi_pb2.PathElem(name="interface", key={"name": name}),
            gnmi_pb2.PathElem(name="state"),
        ]
    )


def notification(name: str, values: dict[str, Any]) -> gnmi_pb2.SubscribeResponse:
    """One Notification for an interface: counters as uint_val under state/counters,
    oper-status as string_val under state (the shapes OpenConfig targets send)."""
    updates = []
    for leaf, value in values.items():
        if leaf == "oper-status":
            path = gnmi_pb2.Path(elem=[gnmi_pb2.PathElem(name="oper-status")])
            typed = gnmi_pb2.TypedValue(string_val=str(value))
        else:
            path = gnmi_pb2.Path(
                elem=[gnmi_pb2.PathElem(name="counters"), gnmi_pb2.PathElem(name=leaf)]
            )
            typed = gnmi_pb2.TypedValue(uint_val=int(value))
        updates.append(gnmi_pb2.Update(path=path, val=typed))
    return gnmi_pb2.SubscribeResponse(
        update=gnmi_pb2.Notification(
            timestamp=time.time_ns(), prefix=interface_prefix(name), update=updates
        )
    )


class FakeGnmiTarget:
    """A switch's gNMI server. `interfaces` holds the current values every new
    subscription starts with; `push()` sends a change to every open subscription."""

    def __init__(self, username: str = "denpex", password: str = "s3cret") -> None:
        self.port = free_port()
        self.username = username
        self.password = password
        self.interfaces: dict[str, dict[str, Any]] = {
            "Ethernet1/1": {"oper-status": "UP", **dict.fromkeys(COUNTERS, 0)},
            "Ethernet1/2": {"oper-status": "UP", **dict.fromkeys(COUNTERS, 0)},
        }
        self.subscriptions: list[gnmi_pb2.SubscriptionList] = []
        self._streams: list[queue.SimpleQueue] = []
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None

    @property
    def address(self) -> str:
        return "127.0.0.1"

    def start(self) -> FakeGnmiTarget:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        gnmi_pb2_grpc.add_gNMIServicer_to_server(_Servicer(self), server)
        server.add_insecure_port(f"127.0.0.1:{self.port}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            with self._lock:
                for stream in self._streams:
                    stream.put(None)
            self._server.stop(grace=0).wait()
            self._server = None

    def push(self, name: str, **values: Any) -> None:
        """Change leaves (python names: oper_status, in_errors ...) and stream them."""
        leaves = {k.replace("_", "-"): v for k, v in values.items()}
        self.interfaces.setdefault(name, {}).update(leaves)
        message = notification(name, leaves)
        with self._lock:
            for stream in self._streams:
                stream.put(message)

    def open_streams(self) -> int:
        with self._lock:
            return len(self._streams)

    def authorised(self, context: grpc.ServicerContext) -> bool:
        metadata = dict(context.invocation_metadata())
        return (metadata.get("username"), metadata.get("password")) == (
            self.username,
            self.password,
        )

    def stream(self, first: gnmi_pb2.SubscribeRequest, context: grpc.ServicerContext):
        self.subscriptions.append(first.subscribe)
        outbox: queue.SimpleQueue = queue.SimpleQueue()
        with self._lock:
            self._streams.append(outbox)
            initial = [notification(n, dict(v)) for n, v in self.interfaces.items()]
        try:
            yield from initial
            yield gnmi_pb2.SubscribeResponse(sync_response=True)
            while context.is_active():
                try:
                    message = outbox.get(timeout=0.1)
                except queue.Empty:
                    continue
                if message is None:
                    return
                yield message
        finally:
            with self._lock:
                self._streams.remove(outbox)


class _Servicer(gnmi_pb2_grpc.gNMIServicer):
    def __init__(self, target: FakeGnmiTarget) -> None:
        self.target = target

    def Capabilities(self, request, context):
        if not self.target.authorised(context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad username or password")
        return gnmi_pb2.CapabilityResponse(
            supported_models=[
                gnmi_pb2.ModelData(
                    name="openconfig-interfaces", organization="OpenConfig", version="3.0.0"
                )
            ],
            supported_encodings=[gnmi_pb2.JSON, gnmi_pb2.JSON_IETF, gnmi_pb2.PROTO],
            gNMI_version="0.8.0",
        )

    def Subscribe(self, request_iterator, context):
        if not self.target.authorised(context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad username or password")
        first = next(request_iterator)
        if first.subscribe.mode != gnmi_pb2.SubscriptionList.STREAM:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "only STREAM subscriptions")
        # a STREAM subscription outlives the client's half-close of its request stream
        yield from self.target.stream(first, context)
