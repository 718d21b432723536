"""Connection options shared by `Client` and `AsyncClient`: channel, auth, retries."""

from __future__ import annotations

import ipaddress
import random
import socket
import time
from dataclasses import dataclass

import grpc

from radixmesh.errors import InvalidArgument

from .convert import server_went_away

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]


@dataclass(frozen=True)
class ClientOptions:
    api_key: str | None = None  # sent as `authorization: Bearer <key>`
    tls: bool = False  # TLS with the system roots, or `root_certificates`
    root_certificates: bytes | None = None  # PEM; implies tls
    timeout: float | None = None  # default deadline per call, seconds (None: none)
    max_retries: int = 3  # on UNAVAILABLE before the first token
    backoff: float = 0.1  # first retry waits up to this (full jitter), doubling each time
    max_backoff: float = 2.0

    @property
    def secure(self) -> bool:
        return self.tls or self.root_certificates is not None

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.api_key}"),) if self.api_key else ()

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.root_certificates)

    def retry_delay(self, attempt: int) -> float:
        """Full jitter: uniform in [0, min(max_backoff, backoff * 2**attempt)]."""
        return random.uniform(0.0, min(self.max_backoff, self.backoff * 2**attempt))


class Deadline:
    """One overall deadline for a call and its retries."""

    def __init__(self, timeout: float | None) -> None:
        self.at = None if timeout is None else time.monotonic() + timeout

    def remaining(self) -> float | None:
        return None if self.at is None else max(self.at - time.monotonic(), 0.0)

    def allows(self, delay: float) -> bool:
        return self.at is None or time.monotonic() + delay < self.at


def retryable(e: grpc.RpcError, attempt: int, options: ClientOptions) -> bool:
    return server_went_away(e) and attempt < options.max_retries


def channel_target(target: str) -> str:
    """A gRPC target for `target`: one `host:port` as it is, or several comma-separated
    (routers in front of the same workers) as one static list that gRPC's pick_first
    tries in order: a client whose router goes away fails over to the next. Host names
    in a list are resolved once, here (gRPC's ipv4: / ipv6: lists take addresses)."""
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
