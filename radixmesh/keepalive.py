"""Keepalive pings on every gRPC connection of the cluster: one policy for both ends.

Clients (the SDK, the router's channels to its workers) ping a connection that has been
silent for a while, so that a dead peer or a middlebox that dropped the connection is
found before a request waits on it; servers ping back for the same reason (a worker's
stream stays silent through a long prefill). grpc-core servers also police the pings
they receive: one that comes sooner than `grpc.http2.min_ping_interval_without_data_ms`
after the previous while no data flows is a strike, and past `grpc.http2.max_ping_strikes`
strikes the server closes the connection with GOAWAY ENHANCE_YOUR_CALM "too_many_pings".
That interval defaults to five minutes; a server that does not set it (or sets it under
a name grpc-core does not know: `grpc.http2.min_recv_ping_interval_without_data_ms` is
not one) answers a client pinging every 30 s with that GOAWAY after three pings. Without
calls the pings count only where `grpc.keepalive_permit_without_calls` allows them.

So the client's and the server's settings come from one `KeepalivePolicy`, which refuses
a client interval shorter than what the server tolerates: the client options
(`client_options`) and the router's and the worker's server options (`server_options`)
are built from `KEEPALIVE`, and a client can never outrun its server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from radixmesh.errors import InvalidArgument

GrpcOptions = list[tuple[str, int]]


@dataclass(frozen=True)
class KeepalivePolicy:
    """Seconds throughout; the defaults are gRPC's recommended ones for long streams."""

    client_interval: float = 30.0  # a client pings a connection silent this long
    server_interval: float = 30.0  # and a server does
    timeout: float = 10.0  # a ping unanswered this long closes the connection
    # The server tolerates pings this often on a connection without data (a third of the
    # client interval: a client's timer that fires late never makes the next one early).
    min_recv_interval: float = 10.0
    max_ping_strikes: int = 2  # early pings a server forgives before its GOAWAY (0: all)
    permit_without_calls: bool = True  # ping (and tolerate pings) with no call open

    def __post_init__(self) -> None:
        for name in ("client_interval", "server_interval", "timeout", "min_recv_interval"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise InvalidArgument(name, f"must be a positive number of seconds, got {value}")
        if self.client_interval < self.min_recv_interval:
            raise InvalidArgument(
                "client_interval",
                f"{self.client_interval} s is shorter than the {self.min_recv_interval} s "
                "between pings that servers tolerate: they would close the connection "
                "(GOAWAY too_many_pings)",
            )
        if self.max_ping_strikes < 0:
            raise InvalidArgument("max_ping_strikes", f"must be >= 0, got {self.max_ping_strikes}")

    def client_options(self) -> GrpcOptions:
        """A channel's arguments. (grpc-core's client sends a ping at most once a second
        whatever they say; `grpc.http2.min_time_between_pings_ms` is no longer read.)"""
        return [
            ("grpc.keepalive_time_ms", _millis(self.client_interval)),
            ("grpc.keepalive_timeout_ms", _millis(self.timeout)),
            ("grpc.keepalive_permit_without_calls", int(self.permit_without_calls)),
            ("grpc.http2.max_pings_without_data", 0),  # no cap on pings between messages
        ]

    def server_options(self) -> GrpcOptions:
        """A server's arguments: its own pings and what it tolerates of its clients'."""
        return [
            ("grpc.keepalive_time_ms", _millis(self.server_interval)),
            ("grpc.keepalive_timeout_ms", _millis(self.timeout)),
            ("grpc.keepalive_permit_without_calls", int(self.permit_without_calls)),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.http2.min_ping_interval_without_data_ms", _millis(self.min_recv_interval)),
            ("grpc.http2.max_ping_strikes", self.max_ping_strikes),
        ]


def _millis(seconds: float) -> int:
    return max(1, round(seconds * 1000))


KEEPALIVE = KeepalivePolicy()  # what every client and server of the cluster uses
