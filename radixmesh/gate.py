"""The gRPC gate: the public gRPC port of a server that takes keys, in front of grpc-core.

grpc-core (grpc.aio) gives Python no hold on a connection: it cannot say which calls came
on which connection, close one, or cap the connections that never authenticated. So a
client that finished the HTTP/2 handshake and sent one keyless call every 30 s kept its
connection for ever, and ~9,500 of them took every slot of the router's port (new
clients failed, with no log line). The gate is an asyncio TCP listener on the public
address that accepts each connection, counts it, and splices its bytes both ways to the
grpc server, which listens on a loopback-only port of its own:

- the auth interceptor (auth.py) reports each call's outcome with `context.peer()`, the
  gate's own outbound address (127.0.0.1:<port>), which names the client connection;
  `report` marks that connection authenticated, for good, or counts a failure;
- a connection that is not authenticated (keyless) is closed after
  `limits.auth_failures` failed calls, or `limits.auth_window` seconds after its accept;
- keyless connections have caps of their own, per port and per address
  (`keyless_connections`, `keyless_per_peer`): one past a cap evicts the oldest keyless
  connection (of the same address first). Authenticated connections are never evicted:
  they count only against `max_connections`, so a flood of keyless connections cannot
  keep the clients that hold a key out (on a worker: the router);
- closing a plaintext connection sends HTTP/2 GOAWAY first (the gate follows the frames
  of a keyless connection, in both directions, to write it between two frames and name
  the last stream the server saw); over TLS (spliced encrypted) it is a plain close.

Everything the gate closes or refuses is counted in `closed` (a metric, see
`KeylessCollector`) and in a `Tally`: one log line per interval. An authenticated
connection is spliced without looking at its bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from radixmesh.listener import (
    STRUCK_AT_ACCEPT,
    KeylessConnections,
    ListenerLimits,
    Tally,
    listen_backlog,
)

logger = logging.getLogger(__name__)

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_HEADERS = 0x1
_GOAWAY = 0x7
_END_STREAM = 0x1
# Bytes read from one side before the other side's buffer must drain (flow control both
# ways: a reader that does not read stops the writer, instead of the gate buffering).
_HIGH_WATER = 256 * 1024
# A connection closed for its failed calls stays open until the last one's
# UNAUTHENTICATED has gone to the client (the interceptor reports before it answers):
# plaintext, until the frame that ends that stream (then GOAWAY: the client's later
# calls go to a new connection), at most FAILED_LINGER seconds; over TLS, where no frame
# can be seen or sent, FAILED_LINGER_TLS seconds, during which its calls are still
# answered (the close without GOAWAY fails the client's next call UNAVAILABLE).
FAILED_LINGER = 5.0
FAILED_LINGER_TLS = 2.0


def goaway(last_stream: int) -> bytes:
    """An HTTP/2 GOAWAY frame, NO_ERROR: streams past `last_stream` were not processed,
    so a gRPC client retries them on a new connection."""
    payload = (last_stream & 0x7FFFFFFF).to_bytes(4, "big") + (0).to_bytes(4, "big")
    return len(payload).to_bytes(3, "big") + bytes([_GOAWAY, 0]) + (0).to_bytes(4, "big") + payload


class Frames:
    """Where one direction of an HTTP/2 connection is between frames, the highest stream
    a HEADERS frame opened, and the highest one a HEADERS frame ended (END_STREAM: a
    response's trailers); headers are not decoded."""

    def __init__(self, preface: int = 0) -> None:
        self.skip = preface  # bytes of payload (or the client's preface) still to pass
        self.head = b""  # a frame header not yet complete
        self.last_stream = 0
        self.last_ended = 0

    def feed(self, data: bytes) -> None:
        i, n = 0, len(data)
        while i < n:
            if self.skip:
                step = min(self.skip, n - i)
                i += step
                self.skip -= step
                continue
            need = 9 - len(self.head)
            self.head += data[i : i + need]
            i += need
            if len(self.head) == 9:
                head, self.head = self.head, b""
                self.skip = int.from_bytes(head[:3], "big")
                if head[3] == _HEADERS:
                    stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
                    self.last_stream = max(self.last_stream, stream)
                    if head[4] & _END_STREAM:
                        self.last_ended = max(self.last_ended, stream)

    @property
    def between(self) -> bool:
        return not self.skip and not self.head


class Gate:
    """The public side of one gRPC port (see the module docstring). `report` is the auth
    interceptor's hook; `upstream`: the grpc server's loopback port."""

    def __init__(
        self,
        limits: ListenerLimits,
        max_connections: int,
        tally: Tally,
        *,
        tls: bool = False,
    ) -> None:
        self.limits = limits
        self.max_connections = max_connections
        self.tally = tally
        self.tls = tls
        self.upstream = 0
        self.open = 0
        self.keyless: KeylessConnections[_Client] = KeylessConnections(limits)
        self.by_local_port: dict[int, _Client] = {}  # outbound port -> its client
        self.closed: Counter[str] = Counter()  # since start, by reason (the metric)
        self._server: asyncio.Server | None = None

    @property
    def keyless_open(self) -> int:
        return len(self.keyless)

    async def start(self, host: str, port: int, upstream: int, *, reuse_port: bool = True) -> int:
        """Listen on host:port; returns the bound port. `reuse_port` (SO_REUSEPORT, as
        grpc-core does): router replicas share the port; a worker's is its own."""
        self.upstream = upstream
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Client(self),
            host,
            port,
            backlog=listen_backlog(),
            reuse_port=reuse_port,
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for client in self.keyless:
                client.abort()
        self.tally.close()

    def report(self, peer: str, ok: bool) -> None:
        """A call on the connection whose gate-side address is `peer` (grpc's
        `context.peer()`, e.g. "ipv4:127.0.0.1:40123") did (`ok`) or did not carry a key."""
        port = _port_of(peer)
        client = self.by_local_port.get(port) if port is not None else None
        if client is None:
            return
        if ok:
            client.authenticated()
        else:
            client.failed()

    # ---- accounting -------------------------------------------------------------------

    def count(self, reason: str) -> None:
        self.closed[reason] += 1
        self.tally.add(reason)

    def admit(self, client: _Client) -> tuple[float, str] | None:
        """Count `client` in as keyless (`KeylessConnections.hold`: the oldest keyless one
        of its address, or of the port, is shed where a cap is full); returns the seconds
        it has to authenticate and why it is closed if it does not. None (counted): over
        `max_connections`, or from a struck address with no place on probation."""
        if self.open >= self.max_connections:
            self.count("refused over max_connections")
            return None
        now = time.monotonic()
        if self.keyless.refuses(client.peer, now):
            self.count(STRUCK_AT_ACCEPT)
            return None
        self.open += 1
        return self.keyless.hold(client, now)

    def forget(self, client: _Client) -> None:
        """`client` is no longer keyless (it authenticated, or it closed)."""
        self.keyless.forget(client)


def _port_of(peer: str) -> int | None:
    _, _, port = peer.rpartition(":")
    return int(port) if port.isdigit() else None


class _Client(asyncio.Protocol):
    """One accepted connection and its splice to the grpc server (`_Upstream`)."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self.transport: asyncio.Transport | None = None
        self.upstream: _Upstream | None = None
        self.peer = ""
        self.counted = False
        self.keyless = True
        self.failures = 0
        self.pending: list[bytes] = []  # before the upstream connection is up
        self.eof = False
        self.timer: asyncio.TimerHandle | None = None
        self.to_server: Frames | None = None if gate.tls else Frames(len(_PREFACE))
        self.to_client: Frames | None = None if gate.tls else Frames()
        self.connecting: asyncio.Task[None] | None = None
        self.shedding = False
        self.awaited = 0  # the stream whose answer goes out before a close for failures
        self.server_eof = False  # the server's EOF was passed on: nothing more to write
        self.unauthenticated = "closed at auth_window without a key"  # why, at its window

    # ---- the client's side ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        deadline = self.gate.admit(self)
        if deadline is None:
            transport.abort()
            return
        window, self.unauthenticated = deadline
        self.counted = True
        transport.set_write_buffer_limits(_HIGH_WATER)
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(window, self._window_passed)
        self.connecting = loop.create_task(self._connect())

    def data_received(self, data: bytes) -> None:
        if self.keyless and self.to_server is not None:
            self.to_server.feed(data)
        if self.upstream is None or self.upstream.transport is None:
            self.pending.append(data)
            if sum(map(len, self.pending)) > _HIGH_WATER and self.transport is not None:
                self.transport.pause_reading()
            return
        self.upstream.transport.write(data)

    def eof_received(self) -> bool | None:
        if self.upstream is not None and self.upstream.transport is not None:
            if self.upstream.transport.can_write_eof():
                self.upstream.transport.write_eof()
        else:
            self.eof = True
        return True  # half-close: the server may still answer

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.counted:
            self.counted = False
            self.gate.open -= 1
            self.gate.forget(self)
        if self.connecting is not None:
            self.connecting.cancel()
        if self.upstream is not None:
            self.upstream.close()
        self.transport = None

    def pause_writing(self) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.resume_reading()

    # ---- authentication ---------------------------------------------------------------

    def authenticated(self) -> None:
        if self.keyless and not self.shedding:
            self.keyless = False
            self.to_server = self.to_client = None  # spliced blind from now on
            self._disarm()
            self.gate.forget(self)

    def failed(self) -> None:
        if not self.keyless or self.shedding:
            return
        self.failures += 1
        if self.failures >= self.gate.limits.auth_failures:
            if self.to_server is None:
                linger = FAILED_LINGER_TLS
            else:  # close once that call's answer is out
                self.awaited, linger = self.to_server.last_stream, FAILED_LINGER
            self.shed("closed after auth_failures failed calls", linger=linger)

    def _window_passed(self) -> None:
        self.timer = None
        if self.keyless:
            self.shed(self.unauthenticated)

    def shed(self, reason: str, linger: float = 0.0) -> None:
        """Close a keyless connection, now or `linger` seconds later (once the server's
        answer to the call that failed is through): GOAWAY where it can go (plaintext,
        between two frames), then both sides, once what is buffered is written."""
        if self.shedding:
            return
        self.shedding = True
        self.gate.count(reason)
        self.gate.keyless.closed(self, time.monotonic())
        self.gate.forget(self)  # no longer a candidate for eviction
        self._disarm()
        if self.transport is None or self.transport.is_closing():
            return
        if linger:
            self.timer = asyncio.get_running_loop().call_later(linger, self._close)
        else:
            self._close()

    def _close(self) -> None:
        self.timer = None
        frames_in, frames_out = self.to_server, self.to_client
        transport = self.transport
        # Over TLS, mid-frame or after the server's EOF, no GOAWAY can go in: a plain close.
        if frames_in and frames_out and frames_out.between and not self.server_eof and transport:
            transport.write(goaway(frames_in.last_stream))
        if self.upstream is not None:
            self.upstream.close()
        if transport is not None:
            transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    # ---- the server's side ------------------------------------------------------------

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            transport, upstream = await loop.create_connection(
                lambda: _Upstream(self), "127.0.0.1", self.gate.upstream
            )
        except OSError:
            self.gate.count("closed: the grpc server did not accept")
            self.abort()
            return
        finally:
            self.connecting = None
        if self.transport is None:  # the client left meanwhile
            transport.close()
            return
        self.upstream = upstream
        port = int(transport.get_extra_info("sockname")[1])
        upstream.local_port = port
        self.gate.by_local_port[port] = self
        for data in self.pending:
            transport.write(data)
        self.pending.clear()
        if self.eof and transport.can_write_eof():
            try:
                transport.write_eof()
            except OSError:  # the server already reset it (the client's bytes were not gRPC)
                self.abort()
                return
        self.transport.resume_reading()

    def from_server(self, data: bytes) -> None:
        if self.transport is None:
            return
        frames = self.to_client
        if self.keyless and frames is not None:
            frames.feed(data)
        self.transport.write(data)
        if self.awaited and frames and frames.last_ended >= self.awaited and self.timer:
            self.timer.cancel()  # the failed call's answer is out: close now
            self._close()


class _Upstream(asyncio.Protocol):
    """The gate's connection to the grpc server for one `_Client`."""

    def __init__(self, client: _Client) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.local_port = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(_HIGH_WATER)
        with contextlib.suppress(OSError):  # the splice adds no Nagle delay of its own
            sock = transport.get_extra_info("socket")
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.client.from_server(data)

    def eof_received(self) -> bool | None:
        client = self.client.transport
        if client is not None and client.can_write_eof():
            client.write_eof()
            self.client.server_eof = True
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        gate = self.client.gate
        if gate.by_local_port.get(self.local_port) is self.client:
            del gate.by_local_port[self.local_port]
        self.transport = None
        if self.client.transport is not None:
            self.client.transport.close()

    def pause_writing(self) -> None:
        if self.client.transport is not None:
            self.client.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.client.transport is not None:
            self.client.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class KeylessSource(Protocol):
    """What a listener tells the metrics about its keyless connections."""

    closed: Counter[str]

    @property
    def keyless_open(self) -> int: ...


class KeylessCollector(Collector):
    """`radixmesh_listener_closed_total{listener, reason}`: connections a listener closed
    or refused (keyless ones evicted, closed after failures or the window; over the cap),
    and `radixmesh_listener_keyless_connections{listener}`: keyless connections open.
    `labels` are put on every sample (a worker's `model_name`, as its other metrics carry)."""

    def __init__(
        self, sources: dict[str, KeylessSource], labels: dict[str, str] | None = None
    ) -> None:
        self.sources = sources
        self.labels = dict(labels or {})

    def collect(self) -> Iterator[Metric]:
        closed = CounterMetricFamily(
            "radixmesh_listener_closed",
            "Connections a listener closed or refused, by reason.",
            labels=[*self.labels, "listener", "reason"],
        )
        keyless = GaugeMetricFamily(
            "radixmesh_listener_keyless_connections",
            "Connections open that have not authenticated.",
            labels=[*self.labels, "listener"],
        )
        fixed = list(self.labels.values())
        for name, source in self.sources.items():
            for reason, n in sorted(source.closed.items()):
                closed.add_metric([*fixed, name, reason], n)
            keyless.add_metric([*fixed, name], source.keyless_open)
        yield closed
        yield keyless

    def describe(self) -> Iterable[Metric]:
        return []
