"""The keepalive policy: the clients' pings never outrun what the servers tolerate.

The unit tests read the options every client and server of the cluster is built with; the
loopback tests run a real gRPC server and a channel that idles with pings, watching the
channel's state: a GOAWAY ENHANCE_YOUR_CALM ("too_many_pings") takes a READY channel to
IDLE. The control case (a server that does not set the interval, grpc-core's five
minutes) shows that the watch sees one.
"""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from radixmesh.client.options import CHANNEL_OPTIONS
from radixmesh.errors import InvalidArgument
from radixmesh.keepalive import KEEPALIVE, GrpcOptions, KeepalivePolicy
from radixmesh.router.server import _SERVER_OPTIONS
from radixmesh.worker.server import grpc_options as worker_options

PING_ARGS = {
    "grpc.keepalive_time_ms",
    "grpc.keepalive_timeout_ms",
    "grpc.keepalive_permit_without_calls",
    "grpc.http2.max_pings_without_data",
    "grpc.http2.min_ping_interval_without_data_ms",
    "grpc.http2.max_ping_strikes",
}


def pings(options: list[tuple[str, object]]) -> dict[str, object]:
    """The ping settings of a list of grpc options (any other name mentioning a ping or a
    keepalive is a typo grpc-core would ignore)."""
    found = {k: v for k, v in options if "ping" in k or "keepalive" in k}
    assert set(found) <= PING_ARGS, set(found) - PING_ARGS
    return found


def test_the_clients_pings_satisfy_the_servers_policy() -> None:
    client = pings(list(CHANNEL_OPTIONS))
    for server in (pings(list(_SERVER_OPTIONS)), pings(list(worker_options(1 << 20, 100)))):
        assert server == dict(KEEPALIVE.server_options())
        interval = server["grpc.http2.min_ping_interval_without_data_ms"]
        assert client["grpc.keepalive_time_ms"] == 30_000
        assert interval == 10_000
        assert client["grpc.keepalive_permit_without_calls"] == 1
        assert server["grpc.keepalive_permit_without_calls"] == 1


def test_a_client_faster_than_the_server_allows_is_refused() -> None:
    with pytest.raises(InvalidArgument) as e:
        KeepalivePolicy(client_interval=5.0, min_recv_interval=10.0)
    assert e.value.field == "client_interval"
    for field in ("client_interval", "server_interval", "timeout", "min_recv_interval"):
        with pytest.raises(InvalidArgument) as e:
            KeepalivePolicy(**{field: float("nan")})  # type: ignore[arg-type]
        assert e.value.field == field
    with pytest.raises(InvalidArgument) as e:
        KeepalivePolicy(max_ping_strikes=-1)
    assert e.value.field == "max_ping_strikes"


# A policy scaled down 30 times (grpc-core's client pings at most once a second): pings
# every second, tolerated every third of one, and one early ping forgiven, so that a
# server without the policy answers the third ping with its GOAWAY.
FAST = KeepalivePolicy(
    client_interval=1.0,
    server_interval=60.0,
    timeout=5.0,
    min_recv_interval=1 / 3,
    max_ping_strikes=1,
)


def idle_with_pings(server_options: GrpcOptions, seconds: float) -> list[str]:
    """A channel with FAST's client options makes one call, then idles (pinging) for
    `seconds` or until it leaves READY; its states after the call."""
    server = grpc.server(futures.ThreadPoolExecutor(2), options=server_options)
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=FAST.client_options())
    try:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        states: list[str] = []
        left = threading.Event()

        def watch(state: grpc.ChannelConnectivity) -> None:
            states.append(state.name)
            if state != grpc.ChannelConnectivity.READY:
                left.set()

        channel.subscribe(watch)  # called with the current state (READY) first
        left.wait(seconds)
        return states
    finally:
        channel.close()
        server.stop(None)


def test_a_client_idling_with_pings_keeps_its_connection() -> None:
    start = time.monotonic()
    assert idle_with_pings(FAST.server_options(), 3.5) == ["READY"]  # three pings or more
    assert time.monotonic() - start >= 3.5


def test_a_server_without_the_policy_sends_goaway() -> None:
    # The interval unset: grpc-core's default (5 min); the third ping is one too many.
    lax = [(k, v) for k, v in FAST.server_options() if "min_ping_interval" not in k]
    assert idle_with_pings(lax, 20.0) == ["READY", "IDLE"]
