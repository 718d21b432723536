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

from .convert import is_overloaded, server_retry_after, server_went_away

# Keepalive: the policy the router's and the worker's servers enforce (keepalive.py).
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    *KEEPALIVE.client_options(),
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
    backoff: float = 0.1  # first retry waits up to this (full jitter), doubling each time
    max_backoff: float = 2.0
    connections: int = 1  # channels (each its own connection per address) calls rotate over
    max_retry_after: float = 30.0  # the longest server's retry-after waited for, seconds
    retry_after_jitter: float = 0.2  # a retry-after wait: uniform in [r, r * (1 + this)]
    retry_overloaded: bool = False  # also retry RESOURCE_EXHAUSTED (overload), after its r

    def __post_init__(self) -> None:
        if self.connections < 1:
            raise InvalidArgument("connections", f"must be >= 1, got {self.connections}")
        for name in ("max_retry_after", "retry_after_jitter", "backoff", "max_backoff"):
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
