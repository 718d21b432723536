"""Connection options shared by `Client` and `AsyncClient`: channel, auth, retries.

Retries (`retry_wait`): a call the server did not take (UNAVAILABLE, or a call a server
shutting down dropped; with `retry_overloaded`, also RESOURCE_EXHAUSTED for load) is
tried again up to `max_retries` times, before its first token only. When the server said
when to come back (gRPC metadata `retry-after` or `radixmesh-retry-after`, in seconds or
as an HTTP date: convert.server_retry_after), the retry waits at least that long, plus a
jitter of up to `retry_after_jitter` of it, so that the clients a server turned away at
once do not all return at once; a server asking for more than `max_retry_after` is not
waited for (the error is raised, its `retry_after` set). Without it: exponential backoff
with full jitter. The call's deadline bounds it all.

A call that never reached a server (the channel could not connect: a server restarting,
or a dying process's listening socket that resets the connections the kernel still hands
it) is retried for a time, not a count: for `connect_retry_window` seconds from its first
such failure, each wait the same jittered backoff (capped at `max_backoff`), these retries
not counted against `max_retries` (`max_retries=0` still turns every retry off), and the
deadline bounds them as any. Why a time: a count cannot outlast a restart (three retries
are over within 0.7 s, while grpc-core, after one failed connect, fails every call at once
until its next connection attempt), and the count is there to bound what a server that
answers is asked again, while a client that cannot connect asks no server anything (its
connection attempts are paced by the channel's backoff, not by the retries). The
channel's own reconnect backoff is fitted to this schedule (RECONNECT_OPTIONS), so that
over the window the retries meet fresh connection attempts, not the channel's old failure.
"""

from __future__ import annotations

import ipaddress
import json
import math
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from radixmesh.errors import InvalidArgument
from radixmesh.keepalive import KEEPALIVE

from .convert import is_overloaded, never_connected, server_retry_after, server_went_away

# The SDK's retry backoff (ClientOptions.backoff, max_backoff): full jitter, doubling.
BACKOFF_S = 0.1
MAX_BACKOFF_S = 2.0
CONNECT_RETRY_WINDOW_S = 10.0  # ClientOptions.connect_retry_window

# grpc-core's reconnect backoff after a failed connect (1 s, growing 1.6x with 20%
# jitter up to 120 s by default) is a time in which the channel fails every call at once,
# without a connection attempt: the SDK's retries would all fall into it. So the channel
# tries again after the SDK's first backoff (also grpc-core's floor, 100 ms) and never
# waits longer than the SDK's longest wait between retries: over a connect retry window
# a server back within it is connected to at most about 2.4 s later, and the next retry
# (at most MAX_BACKOFF_S later) reaches it. `grpc.min_reconnect_backoff_ms` is left at
# its default: grpc-core reads it as the least time one connection attempt is given (20
# s), not as a backoff, and shortening it would cut off slow handshakes (TLS across a
# WAN); a call's deadline already bounds an attempt that hangs.
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", round(BACKOFF_S * 1000)),
    ("grpc.max_reconnect_backoff_ms", round(MAX_BACKOFF_S * 1000)),
]
# Keepalive: the policy the router's and the worker's servers enforce (keepalive.py).
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    *KEEPALIVE.client_options(),
    *RECONNECT_OPTIONS,
]
# gRPC's own balancer for a list of routers: each call goes to the next READY address.
ROUND_ROBIN = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})


@dataclass(frozen=True)
class ClientOptions:
    api_key: str | None = None  # sent as `authorization: Bearer <key>`
    tls: bool = False  # TLS with the system roots, or `root_certificates`
    root_certificates: bytes | None = None  # PEM; implies tls
    timeout: float | None = None  # default deadline per call, seconds (None: none)
    max_retries: int = 3  # on UNAVAILABLE before the first token
    backoff: float = BACKOFF_S  # first retry waits up to this (full jitter), doubling
    max_backoff: float = MAX_BACKOFF_S
    connections: int = 1  # channels (each its own connection per address) calls rotate over
    max_retry_after: float = 30.0  # the longest server's retry-after waited for, seconds
    retry_after_jitter: float = 0.2  # a retry-after wait: uniform in [r, r * (1 + this)]
    retry_overloaded: bool = False  # also retry RESOURCE_EXHAUSTED (overload), after its r
    # A call whose channel could not connect is retried this long from its first such
    # failure, however many retries that takes (module docstring), seconds.
    connect_retry_window: float = CONNECT_RETRY_WINDOW_S

    def __post_init__(self) -> None:
        if self.connections < 1:
            raise InvalidArgument("connections", f"must be >= 1, got {self.connections}")
        for name in (
            "max_retry_after",
            "retry_after_jitter",
            "backoff",
            "max_backoff",
            "connect_retry_window",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise InvalidArgument(name, f"must be a number >= 0, got {value}")

    @property
    def secure(self) -> bool:
        return self.tls or self.root_certificates is not None

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.api_key}"),) if self.api_key else ()

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.root_certificates)

    def retry_delay(
        self, attempt: int, uniform: Callable[[float, float], float] | None = None
    ) -> float:
        """Full jitter: uniform in [0, min(max_backoff, backoff * 2**attempt)] (attempt 0
        first). `uniform`: the draw (default random.uniform, looked up per call)."""
        uniform = uniform or random.uniform
        return uniform(0.0, min(self.max_backoff, self.backoff * 2**attempt))

    def retry_after_delay(
        self, retry_after: float, uniform: Callable[[float, float], float] | None = None
    ) -> float | None:
        """The wait for a server's `retry_after` r: uniform in [r, r * (1 +
        retry_after_jitter)], at most max_retry_after; None (no retry) when r itself is
        over max_retry_after."""
        if retry_after > self.max_retry_after:
            return None
        uniform = uniform or random.uniform
        jittered = uniform(retry_after, retry_after * (1.0 + self.retry_after_jitter))
        return min(max(jittered, retry_after), self.max_retry_after)


class Deadline:
    """One overall deadline for a call and its retries."""

    def __init__(self, timeout: float | None) -> None:
        self.at = None if timeout is None else time.monotonic() + timeout

    def remaining(self) -> float | None:
        return None if self.at is None else max(self.at - time.monotonic(), 0.0)

    def allows(self, delay: float) -> bool:
        return self.at is None or time.monotonic() + delay < self.at


# How long a client keeps asking whether its target is a router or a worker (the first
# call's probe, retried like a call while the server is away or still starting).
RESOLVE_TIMEOUT_S = 10.0


def retryable(e: grpc.RpcError, attempt: int, options: ClientOptions) -> bool:
    if attempt >= options.max_retries:
        return False
    return server_went_away(e) or (options.retry_overloaded and is_overloaded(e))


def retry_wait(
    e: grpc.RpcError,
    attempt: int,
    options: ClientOptions,
    uniform: Callable[[float, float], float] | None = None,
) -> float | None:
    """Seconds to wait before retrying the call that failed with `e` (module docstring);
    None: not retried."""
    if not retryable(e, attempt, options):
        return None
    retry_after = server_retry_after(e)
    if retry_after is None:
        return options.retry_delay(attempt, uniform)
    return options.retry_after_delay(retry_after, uniform)


class Retries:
    """One call's retry budget (module docstring): `max_retries` retries of failures a
    server answered, and `connect_retry_window` seconds of retries of failures to connect,
    counted from the first of these."""

    def __init__(self, options: ClientOptions, clock: Callable[[], float] = time.monotonic) -> None:
        self.options = options
        self.clock = clock
        self.attempt = 0  # retries counted against max_retries
        self.connect_attempt = 0  # retries of failures to connect (their backoff's step)
        self.connect_since: float | None = None  # the first failure to connect

    def reset(self) -> None:
        """A response came: a later failure starts a fresh budget (a stream's resume)."""
        self.attempt = self.connect_attempt = 0
        self.connect_since = None

    def wait(
        self, e: grpc.RpcError, uniform: Callable[[float, float], float] | None = None
    ) -> float | None:
        """Seconds to wait before retrying after `e`, the retry taken from the budget;
        None: not retried."""
        if self.options.max_retries > 0 and never_connected(e):
            now = self.clock()
            if self.connect_since is None:
                self.connect_since = now
            left = self.connect_since + self.options.connect_retry_window - now
            if left <= 0:
                return None
            self.connect_attempt += 1
            return min(self.options.retry_delay(self.connect_attempt - 1, uniform), left)
        wait = retry_wait(e, self.attempt, self.options, uniform)
        if wait is not None:
            self.attempt += 1
        return wait


def channel_target(target: str) -> str:
    """A gRPC target for `target`: one `host:port` as it is, or several comma-separated
    (routers in front of the same workers) as one static `ipv4:` / `ipv6:` list, which
    `channel_options` gives gRPC's round_robin balancer. Host names in a list are
    resolved once, here (gRPC's ipv4: / ipv6: lists take addresses)."""
    if "," not in target or ":/" in target or target.startswith(("ipv4:", "ipv6:", "dns:")):
        return target
    addresses = []
    for item in target.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not port.isdigit() or not host:
            raise InvalidArgument("target", f"{item!r} is not host:port")
        host = host.strip("[]")
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            info = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
            ip = ipaddress.ip_address(info[0][4][0])
        addresses.append((ip, int(port)))
    families = {ip.version for ip, _ in addresses}
    if len(families) > 1:
        raise InvalidArgument("target", "give addresses of one family (IPv4 or IPv6)")
    if families == {6}:
        return "ipv6:" + ",".join(f"[{ip}]:{port}" for ip, port in addresses)
    return "ipv4:" + ",".join(f"{ip}:{port}" for ip, port in addresses)


def is_address_list(target: str) -> bool:
    """Whether a channel target (channel_target's result) names several addresses."""
    return target.startswith(("ipv4:", "ipv6:")) and "," in target


def channel_options(target: str, connections: int = 1) -> list[tuple[str, int | str]]:
    """The channel arguments for one of `connections` channels to `target` (a
    channel_target result).

    Several addresses: round_robin, so calls spread over every READY router and skip
    those down or draining (pick_first, gRPC's default, would send every call to the
    first). One address keeps pick_first. Several connections: each channel gets its own
    subchannel pool, as gRPC otherwise shares one connection between channels of equal
    target and arguments, and the point is distinct connections the kernel can hand to
    different router processes sharing a port (SO_REUSEPORT)."""
    options: list[tuple[str, int | str]] = [*CHANNEL_OPTIONS]
    if is_address_list(target):
        options.append(("grpc.service_config", ROUND_ROBIN))
    if connections > 1:
        options.append(("grpc.use_local_subchannel_pool", 1))
    return options
