"""The router's HTTP listener: aiohttp's request handling behind a guard that applies
`ListenerLimits` (radixmesh/listener.py) to each connection.

aiohttp bounds an idle keep-alive connection (`keepalive_timeout`, which the front end
sets to `idle_timeout`) but nothing else: a connection that sends part of a head, or a
byte a second, stays open for as long as the client likes, and there is no cap on how
many are open. So the listening socket's protocol factory is `ConnectionGuard`, and each
connection's protocol a `_Connection` that stands between the socket and aiohttp's
`RequestHandler`:

- at accept, it counts the connection, in total and for its peer address; one past either
  cap gets a fixed 503 with `Retry-After` written at once (no parsing, no handler, no
  task) and is closed once the client has read it and closed its end, or after
  REFUSAL_LINGER seconds; waiting for the client's end keeps the kernel from resetting the
  connection over a request the client had already sent, which would lose the 503.
  At most MAX_LINGERING refusals wait so (each holds a descriptor); past that they are
  closed at once;
- it starts a `header_timeout` timer, stopped when the front end's middleware sees the
  request (`ConnectionGuard.request`: aiohttp parsed the head), and started again by the
  first byte after a request finished; a connection whose timer runs out gets a 408 (one
  still in its TLS handshake: nothing) and is closed. TLS is started here
  (`loop.start_tls`), not by the server, so that the cap and the timer cover connections
  that are still in their handshake;
- the body is the middleware's to time (`body_timeout`, http.py), as only it knows when
  the head ended;
- where the API takes keys (`keyed`), a connection is keyless until a request on it
  carries a valid key (the middleware tells `ConnectionGuard.outcome`). Keyless
  connections have caps of their own (`keyless_connections` per port, `keyless_per_peer`
  per address; one more evicts the oldest keyless one, of its address first), and one is
  closed after `auth_failures` 401s (that 401 says `Connection: close`) or
  `auth_window` seconds after its accept (idle: closed at once; else after the response
  in flight, which says `Connection: close`). A connection that authenticated is never
  evicted: keyless ones cannot take its capacity (listener.py says why).

Refusals and timeouts are counted into a `Tally`: one log line per interval, never one per
connection. So are the errors aiohttp logs (`ServerLog`): a malformed request, which it
answers 400 and would log with a traceback each time, is counted; any other error (a
handler's bug) logs its traceback once per interval and the others are counted.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from radixmesh.listener import (
    STRUCK_AT_ACCEPT,
    KeylessConnections,
    ListenerLimits,
    Tally,
    listen_backlog,
)

# Seconds a refused connection stays open for the client to read the 503 and close first.
REFUSAL_LINGER = 2.0
# Refused connections waiting so at once (their descriptors come out of the reserve).
MAX_LINGERING = 256

_REFUSAL_BODY = (
    b'{"error": {"message": "too many connections: try again later", '
    b'"type": "service_unavailable_error", "param": null, "code": "too_many_connections"}}'
)
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
    % (len(_REFUSAL_BODY), _REFUSAL_BODY)
)
_TIMEOUT_BODY = (
    b'{"error": {"message": "the request head did not arrive in time", '
    b'"type": "invalid_request_error", "param": null, "code": "request_timeout"}}'
)
TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_TIMEOUT_BODY), _TIMEOUT_BODY)
)


class ConnectionGuard:
    """The protocol factory of the HTTP listening socket: `_Connection`s that count
    themselves against `max_connections` (total) and `limits.max_connections_per_peer`,
    time their request heads, and hand the rest to `handler_factory`'s protocols (aiohttp's
    `web.Server`). `ssl_context`: TLS, started by each connection once admitted."""

    def __init__(
        self,
        limits: ListenerLimits,
        max_connections: int,
        handler_factory: Callable[[], asyncio.Protocol],
        tally: Tally,
        ssl_context: ssl.SSLContext | None = None,
        keyed: bool = False,
    ) -> None:
        self.limits = limits
        self.keyed = keyed
        self.max_connections = max_connections
        self.handler_factory = handler_factory
        self.tally = tally
        self.ssl_context = ssl_context
        self.open = 0  # admitted connections now open
        self.peers: Counter[str] = Counter()  # admitted connections per peer address
        self.lingering = 0  # refused connections waiting for their client to close
        self.connections: set[_Connection] = set()
        self.by_transport: dict[Any, _Connection] = {}  # the handler's transport -> its own
        # Admitted, not authenticated (when `keyed`).
        self.keyless: KeylessConnections[_Connection] = KeylessConnections(limits)
        self.closed: Counter[str] = Counter()  # keyless connections closed, by reason

    @property
    def keyless_open(self) -> int:
        return len(self.keyless)

    def __call__(self) -> _Connection:
        return _Connection(self)

    def admit(self, peer: str) -> str | None:
        """Count a new connection from `peer` in; or why it is refused (not counted)."""
        if self.open >= self.max_connections:
            return "refused over max_connections"
        per_peer = self.limits.max_connections_per_peer
        if per_peer and self.peers[peer] >= per_peer:
            return "refused over max_connections_per_peer"
        if self.keyed and self.keyless.refuses(peer, time.monotonic()):
            self.closed[STRUCK_AT_ACCEPT] += 1
            return STRUCK_AT_ACCEPT
        self.open += 1
        self.peers[peer] += 1
        return None

    def hold_keyless(self, conn: _Connection) -> tuple[float, str]:
        """Count an admitted connection as keyless (`KeylessConnections.hold`); returns the
        seconds it has to authenticate and why it is closed if it does not."""
        return self.keyless.hold(conn, time.monotonic())

    def forget(self, conn: _Connection) -> None:
        """`conn` is no longer keyless (it authenticated, was shed, or closed)."""
        self.keyless.forget(conn)

    def count(self, reason: str) -> None:
        self.closed[reason] += 1
        self.tally.add(reason)

    def outcome(self, transport: Any, ok: bool) -> None:
        """A request on `transport` did (`ok`) or did not carry a valid key."""
        conn = self.by_transport.get(transport)
        if conn is not None:
            if ok:
                conn.authenticated()
            else:
                conn.failed()

    def closing(self, transport: Any) -> bool:
        """Whether the response to the request on `transport` is its connection's last."""
        conn = self.by_transport.get(transport)
        return conn is not None and conn.closing

    def release(self, peer: str) -> None:
        self.open -= 1
        self.peers[peer] -= 1
        if not self.peers[peer]:
            del self.peers[peer]

    @contextmanager
    def request(self, transport: Any) -> Iterator[None]:
        """Around the handling of one request on `transport` (the middleware's
        `request.transport`): its head arrived, so the header timer stops."""
        conn = self.by_transport.get(transport)
        if conn is not None:
            conn.request_started()
        try:
            yield
        finally:
            if conn is not None:
                conn.request_finished()

    def close(self) -> None:
        """Close the connections aiohttp does not hold yet (in their TLS handshake, or
        refused); aiohttp closes its own on shutdown."""
        for conn in list(self.connections):
            if conn.handler is None and conn.transport is not None:
                conn.transport.abort()
        self.tally.close()


class _Connection(asyncio.Protocol):
    """One accepted connection: counted, timed, and passed on to aiohttp's handler."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self.guard = guard
        self.transport: asyncio.Transport | None = None  # the socket's
        self.handler: asyncio.Protocol | None = None
        self.handler_transport: Any = None  # the socket's, or TLS's over it
        self.peer = ""
        self.admitted = False
        self.refused = False
        self.active = 0  # requests in flight
        self.timer: asyncio.TimerHandle | None = None
        self.early: list[bytes] = []  # decrypted before the handler was attached
        self.early_eof = False
        self.tls: asyncio.Task[None] | None = None  # the handshake (a task needs an owner)
        self.keyless = False
        self.failures = 0  # requests without a valid key
        self.closing = False  # the response in flight is the last
        self.window: asyncio.TimerHandle | None = None  # auth_window, while keyless
        self.unauthenticated = ""  # why it is closed at that window

    # ---- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.guard.connections.add(self)
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        why = self.guard.admit(self.peer)
        if why is not None:
            self._refuse(why)
            return
        self.admitted = True
        self._arm()
        if self.guard.keyed:
            self.keyless = True
            window, self.unauthenticated = self.guard.hold_keyless(self)
            self.window = asyncio.get_running_loop().call_later(window, self._window_passed)
        if self.guard.ssl_context is None:
            self._attach(transport)
        else:
            self.tls = asyncio.get_running_loop().create_task(self._start_tls(transport))

    def data_received(self, data: bytes) -> None:
        if self.handler is None:
            if not self.refused:  # decrypted before _start_tls resumed
                self.early.append(data)
            return
        if self.active == 0 and self.timer is None:
            self._arm()  # the first byte of the next request
        self.handler.data_received(data)

    def eof_received(self) -> bool | None:
        if self.handler is None:
            self.early_eof = True
            return False  # a refused connection: the client read the 503 and closed
        return self.handler.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._stop_window()
        if self.keyless:
            self.keyless = False
            self.guard.forget(self)
        self.guard.connections.discard(self)
        if self.refused:
            self.refused = False
            self.guard.lingering -= 1
        if self.admitted:
            self.admitted = False
            self.guard.release(self.peer)
        if self.handler is not None:
            self.guard.by_transport.pop(self.handler_transport, None)
            handler, self.handler = self.handler, None
            handler.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.handler is not None:
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        if self.handler is not None:
            self.handler.resume_writing()

    # ---- requests -----------------------------------------------------------------------

    def request_started(self) -> None:
        self.active += 1
        self._disarm()

    def request_finished(self) -> None:
        self.active -= 1

    # ---- authentication -----------------------------------------------------------------

    def authenticated(self) -> None:
        if self.keyless:
            self.keyless = False
            self._stop_window()
            self.guard.forget(self)

    def failed(self) -> None:
        if self.keyless:
            self.failures += 1
            if self.failures >= self.guard.limits.auth_failures:
                self.shed("closed after auth_failures 401s")

    def _window_passed(self) -> None:
        self.window = None
        if self.keyless:
            self.shed(self.unauthenticated)

    def shed(self, reason: str) -> None:
        """Close a keyless connection: at once when no request is in flight, else after
        the response in flight (the middleware marks it `Connection: close`)."""
        self.guard.count(reason)
        self.guard.keyless.closed(self, time.monotonic())
        self.guard.forget(self)
        self.keyless = False
        self._stop_window()
        self.closing = True
        if self.active == 0:
            if self.handler is not None:
                self.handler_transport.close()
            elif self.transport is not None:
                self.transport.abort()

    def _stop_window(self) -> None:
        if self.window is not None:
            self.window.cancel()
            self.window = None

    # ---- the parts ------------------------------------------------------------------------

    def _attach(self, transport: Any) -> None:
        self.handler = self.guard.handler_factory()
        self.handler_transport = transport
        self.guard.by_transport[transport] = self
        self.handler.connection_made(transport)
        for data in self.early:
            self.handler.data_received(data)
        self.early.clear()
        if self.early_eof and not self.handler.eof_received():
            transport.close()

    async def _start_tls(self, transport: asyncio.Transport) -> None:
        assert self.guard.ssl_context is not None
        loop = asyncio.get_running_loop()
        timeout = self.guard.limits.header_timeout
        try:
            tls = await loop.start_tls(
                transport,
                self,
                self.guard.ssl_context,
                server_side=True,
                ssl_handshake_timeout=timeout,
                ssl_shutdown_timeout=timeout,
            )
        except (OSError, RuntimeError):  # TimeoutError and ssl.SSLError are OSErrors
            transport.abort()  # a failed or timed-out handshake: start_tls closed it
            self.connection_lost(None)
            return
        if tls is None or transport.is_closing():
            self.connection_lost(None)
            return
        self._attach(tls)

    def _refuse(self, why: str) -> None:
        assert self.transport is not None
        guard = self.guard
        guard.tally.add(why)
        if guard.ssl_context is not None:  # no cheap 503 before a handshake
            self.transport.close()
            return
        self.transport.write(REFUSAL)
        if guard.lingering >= MAX_LINGERING:
            self.transport.close()
            return
        guard.lingering += 1
        self.refused = True
        self.transport.write_eof()
        self.timer = asyncio.get_running_loop().call_later(REFUSAL_LINGER, self.transport.abort)

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.guard.limits.header_timeout, self._head_timed_out)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _head_timed_out(self) -> None:
        self.timer = None
        self.guard.tally.add("closed at header_timeout")
        if self.handler is not None:  # past any TLS handshake: a 408 can be written
            self.handler_transport.write(TIMED_OUT)
            self.handler_transport.close()
        elif self.transport is not None:
            self.transport.abort()


class ServerLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server logger for the HTTP port (its `logger`): what it logs with a
    traceback per request (`exception`) comes through here at a bounded rate."""

    def __init__(self, tally: Tally) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self.tally = tally
        self._next = 0.0  # when a traceback may be logged again

    def exception(self, msg: object, *args: object, **kwargs: Any) -> None:
        error = kwargs.get("exc_info")
        if isinstance(error, HttpProcessingError):  # the client's malformed request: a 400
            self.tally.add("malformed requests (400)")
            return
        now = time.monotonic()
        if now < self._next:
            self.tally.add("errors handling requests (traceback not logged)")
            return
        self._next = now + self.tally.interval
        self.logger.exception(msg, *args, **kwargs)


class GuardedSite(web.BaseSite):
    """aiohttp's TCPSite with `guard` as the protocol factory (which does TLS itself)."""

    def __init__(
        self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard
    ) -> None:
        super().__init__(runner)
        self._host = host
        self._port = port
        self.guard = guard

    @property
    def name(self) -> str:
        scheme = "https" if self.guard.ssl_context else "http"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        # reuse_port: router replicas on one machine share the port (the kernel spreads
        # connections over them), as their gRPC servers do (gRPC sets SO_REUSEPORT itself).
        self._server = await asyncio.get_running_loop().create_server(
            self.guard, self._host, self._port, backlog=listen_backlog(), reuse_port=True
        )

    async def stop(self) -> None:
        await super().stop()
        self.guard.close()
