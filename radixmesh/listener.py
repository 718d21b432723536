"""Connection limits at every listener: how long a connection may take to say what it
wants, how long it may sit idle, and how many may be open, shared by the router's HTTP
and gRPC ports and the worker's gRPC port.

Without them a client that connects and sends nothing (or one byte a second, or a head
that never ends) holds a descriptor for as long as it likes; some 20,000 of those (the
descriptor limit) stopped a router's HTTP and gRPC ports alike, and every accept() that
failed with EMFILE meanwhile logged a traceback (hundreds of megabytes in minutes).

- `header_timeout`: from the connection (or, on a kept-alive HTTP connection, the first
  byte of the next request) to the end of the request head; TLS handshake included. For
  gRPC it is grpc-core's handshake timeout, which also covers the client's HTTP/2
  SETTINGS frame: a socket that sends nothing is closed after it.
- `body_timeout`: from the end of the head to the end of the body (HTTP; a gRPC request
  message has no such bound in grpc-core: its connection counts against the cap).
- `idle_timeout`: a connection with no request in flight for this long is closed (HTTP
  keep-alive; gRPC's `max_connection_idle`, a GOAWAY the client reconnects after).
- `max_connections`: connections open at once per listener. Past it, HTTP answers 503
  with Retry-After and closes; gRPC closes at once (grpc-core's
  `grpc.max_allowed_incoming_connections`). 0: from the descriptor limit
  (`connection_cap`), so that the process runs out of connections before it runs out of
  descriptors and accept() never fails for want of one.
- `max_connections_per_peer`: connections from one address at once (HTTP only: grpc-core
  has no such cap; the total cap and the handshake timeout bound gRPC). 0: no cap.

Where the port takes keys, a connection that has not authenticated (keyless: no request
on it carried a valid key yet) is not one the listener keeps (gate.py does it for gRPC,
router/http/listener.py for HTTP):

- `keyless_connections` / `keyless_per_peer`: keyless connections open at once per port and
  per address; one more evicts the oldest keyless one (of that address first). They are
  a share of `max_connections`, never a claim on it: a connection that authenticated is
  never evicted for a keyless one, so a flood of keyless connections cannot take the
  capacity of clients that hold a key (the router's own connections to a worker).
- `auth_failures`: failed authentications after which a keyless connection is closed.
- `auth_window`: seconds from the accept within which a connection must authenticate.
- An address that had `keyless_per_peer` keyless connections closed (evicted, failed or
  out of time) within `auth_window` seconds is struck (`Strikes`) until that window ends:
  its new connections are held on probation (`KeylessConnections`). At most
  `PROBATION_PER_PEER` of them are open at once and each has `PROBATION_WINDOW` seconds,
  not `auth_window`, to authenticate. With all of them open, a new one takes the place of
  the oldest if that one is `PROBATION_GRACE` seconds old, and is closed at accept if not.
  So an attacker that reconnects as fast as it is closed gets a handful of connections
  a second, most of its attempts cost an accept and a close, and a client with a key
  behind the same address (one NAT, one node, the router's own host) still gets in: it
  authenticates a round trip after its handshake, within the grace that keeps its place.
  Closing every connection of a struck address at accept instead shut such a client out
  for as long as the flood went on (each round of closes starts a new window): a router
  whose workers saw a reconnecting client on its own address never reached them.

Why: 1,024 keyless connections per port are far more than clients that connect before
their first call ever hold at once (they authenticate within a round trip); 64 per
address allow a pool of clients behind one NAT to start at once. 3 failures allow a
retry or two with a fixed key; 10 s is a TLS handshake and a first call on any network.

Why these defaults: 10 s for a request head is ample for any client on any network
(nginx's `client_header_timeout` is 60 s, but a head is a few hundred bytes; a head that
takes longer is an attack or a dead client). 60 s for a body: the largest body allowed
(16 MiB) arrives in 60 s at 2.3 Mbit/s, and an API body is mostly kilobytes. 75 s idle:
above the 60 s idle timeout of common load balancers (AWS ALB, nginx upstream
keep-alive), so the balancer closes first and never sends a request into a connection
the router is closing. 1,000 per peer: a busy client pool or a proxy holds tens to
hundreds; one address holding more is hoarding (set 0 behind a proxy that funnels every
client through one address).
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import functools
import logging
import math
import resource
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, cast

from radixmesh.errors import InvalidArgument

logger = logging.getLogger(__name__)

# Descriptors kept out of the connection caps for everything else the process opens:
# worker channels, log and model files, the event loop's own, a metrics port.
RESERVED_DESCRIPTORS = 1024
# Descriptors one connection through the gRPC gate holds: the client's, the gate's to
# grpc-core, and grpc-core's end of that (gate.py).
GATED_DESCRIPTORS = 3
# One summary line per this many seconds, at most, for each listener's refusals,
# timeouts and failed accept() calls.
LOG_INTERVAL = 10.0


@dataclass(frozen=True)
class ListenerLimits:
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    idle_timeout: float = 75.0
    max_connections: int = 0  # per listener; 0: from the descriptor limit
    max_connections_per_peer: int = 1000  # 0: no cap
    keyless_connections: int = 1024  # per port, of connections that have not authenticated
    keyless_per_peer: int = 64
    auth_failures: int = 3  # failed authentications that close a keyless connection
    auth_window: float = 10.0  # seconds a connection may stay keyless

    def __post_init__(self) -> None:
        for name in ("header_timeout", "body_timeout", "idle_timeout", "auth_window"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise InvalidArgument(name, f"must be > 0 seconds, got {value}")
        for name in ("max_connections", "max_connections_per_peer"):
            if getattr(self, name) < 0:
                raise InvalidArgument(name, f"must be >= 0, got {getattr(self, name)}")
        for name in ("keyless_connections", "keyless_per_peer", "auth_failures"):
            if getattr(self, name) < 1:
                raise InvalidArgument(name, f"must be >= 1, got {getattr(self, name)}")


def descriptor_limit() -> int:
    """This process's soft RLIMIT_NOFILE (2**20 when unlimited)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def raise_descriptor_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (the soft one is often
    1,024 while the hard one allows far more); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft if soft != resource.RLIM_INFINITY else 1 << 20
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as e:  # a sandbox may refuse; the caps follow the soft one
        logger.warning("could not raise the descriptor limit from %d: %s", soft, e)
        return soft
    return target


def connection_cap(limits: ListenerLimits, listeners: int, descriptors: int) -> int:
    """Connections each of `listeners` listeners may hold: `max_connections`, or the
    descriptors left after RESERVED_DESCRIPTORS (a quarter of a small limit) split
    evenly between the listeners."""
    if limits.max_connections:
        return limits.max_connections
    reserve = min(RESERVED_DESCRIPTORS, descriptors // 4)
    return max(1, (descriptors - reserve) // max(1, listeners))


def grpc_options(limits: ListenerLimits, max_connections: int) -> list[tuple[str, int]]:
    """grpc-core server arguments for `limits` (see the module docstring).

    Not set, on purpose: `grpc.max_connection_age_ms` (it would cut long generation streams
    and the router's stream of a worker's outputs once past its grace), and
    `grpc.max_concurrent_streams` (past it a client queues its calls silently, where the
    admission queue answers RESOURCE_EXHAUSTED with a Retry-After; the calls a connection
    may open are bounded by grpc-core's pending-call limit and admission)."""
    return [
        ("grpc.server_handshake_timeout_ms", _millis(limits.header_timeout)),
        ("grpc.max_connection_idle_ms", _millis(limits.idle_timeout)),
        ("grpc.max_allowed_incoming_connections", max_connections),
    ]


# Why a connection on probation (from an address `Strikes` blocks) was closed: a newer one
# of its address took its place, or PROBATION_WINDOW passed without a key.
STRUCK = "closed on probation: the address's keyless connections were closed too often"
# Why one was closed at accept: its address's probation places were all younger than
# PROBATION_GRACE.
STRUCK_AT_ACCEPT = "refused: the address's keyless connections were closed too often"
# A struck address's connections open at once. Together with PROBATION_GRACE this bounds
# what a flood from one address costs: 8 handshakes (and, for gRPC, splices) per 0.25 s.
PROBATION_PER_PEER = 8
# Seconds a connection on probation keeps its place against newer ones from its address:
# a client with a key needs its handshake and a first call (about two round trips).
PROBATION_GRACE = 0.25
# Seconds a connection on probation has to authenticate: a TLS handshake and a first
# call across a continent (three round trips of ~300 ms) fit in it.
PROBATION_WINDOW = 1.0
# Addresses `Strikes` remembers at most (past it, those whose window ended are dropped,
# then the oldest).
MAX_STRUCK_PEERS = 65_536


class Strikes:
    """Keyless connections closed per address in a fixed window of `window` seconds from
    the first; an address with `limit` of them is `blocked` until its window ends."""

    def __init__(self, limit: int, window: float) -> None:
        self.limit = limit
        self.window = window
        self.peers: dict[str, list[float]] = {}  # address -> [window start, closes]

    def add(self, peer: str, now: float) -> None:
        entry = self.peers.get(peer)
        if entry is None or now - entry[0] >= self.window:
            self.peers.pop(peer, None)  # re-inserted last: the dict stays oldest first
            if len(self.peers) >= MAX_STRUCK_PEERS:
                self._prune(now)
            self.peers[peer] = [now, 1.0]
        else:
            entry[1] += 1

    def blocked(self, peer: str, now: float) -> bool:
        entry = self.peers.get(peer)
        return entry is not None and entry[1] >= self.limit and now - entry[0] < self.window

    def _prune(self, now: float) -> None:
        for peer in [p for p, (start, _) in self.peers.items() if now - start >= self.window]:
            del self.peers[peer]
        for peer in list(self.peers)[: max(0, len(self.peers) - MAX_STRUCK_PEERS // 2)]:
            del self.peers[peer]


class Sheddable(Protocol):
    """A keyless connection as `KeylessConnections` sees it."""

    peer: str

    def shed(self, reason: str) -> None: ...


C = TypeVar("C", bound=Sheddable)


class KeylessConnections(Generic[C]):
    """The keyless connections of one port, oldest first: in all, per address, and those
    on probation per struck address (see the module docstring). `hold` counts a new one
    in, shedding the oldest where a cap is full; `forget` counts one out (it authenticated,
    was shed or closed). Shared by the gRPC gate and the HTTP listener."""

    def __init__(self, limits: ListenerLimits) -> None:
        self.limits = limits
        self.strikes = Strikes(limits.keyless_per_peer, limits.auth_window)
        self.all: dict[C, None] = {}
        self.by_peer: dict[str, dict[C, None]] = {}
        self.on_probation: dict[str, dict[C, float]] = {}  # -> the time of its accept

    def __len__(self) -> int:
        return len(self.all)

    def __iter__(self) -> Iterator[C]:
        return iter(list(self.all))

    def refuses(self, peer: str, now: float) -> bool:
        """Whether a new connection from `peer` is closed at accept: its address is struck
        and every place on probation is taken by one younger than PROBATION_GRACE."""
        held = self.on_probation.get(peer)
        if held is None or len(held) < PROBATION_PER_PEER:
            return False
        return now - next(iter(held.values())) < PROBATION_GRACE and self.strikes.blocked(peer, now)

    def hold(self, conn: C, now: float) -> tuple[float, str]:
        """Count `conn` in (`refuses` said no); returns the seconds it has to authenticate,
        and the reason it is closed for if it does not."""
        if self.strikes.blocked(conn.peer, now):
            held = self.on_probation.setdefault(conn.peer, {})
            if len(held) >= PROBATION_PER_PEER:
                next(iter(held)).shed(STRUCK)
            elif len(self.all) >= self.limits.keyless_connections:
                next(iter(self.all)).shed("evicted over keyless_connections")
            self.all[conn] = None
            self.on_probation.setdefault(conn.peer, {})[conn] = now  # (shedding may empty it)
            return PROBATION_WINDOW, STRUCK
        peers = self.by_peer.setdefault(conn.peer, {})
        if len(peers) >= self.limits.keyless_per_peer:
            next(iter(peers)).shed("evicted over keyless_per_peer")
        elif len(self.all) >= self.limits.keyless_connections:
            next(iter(self.all)).shed("evicted over keyless_connections")
        self.all[conn] = None
        self.by_peer.setdefault(conn.peer, {})[conn] = None
        return self.limits.auth_window, "closed at auth_window without a key"

    def forget(self, conn: C) -> None:
        self.all.pop(conn, None)
        _drop(self.by_peer, conn)
        _drop(self.on_probation, conn)

    def closed(self, conn: C, now: float) -> None:
        """`conn` was shed: a strike against its address."""
        self.strikes.add(conn.peer, now)


def _drop(group: dict[str, dict[C, Any]], conn: C) -> None:
    peers = group.get(conn.peer)
    if peers is not None:
        peers.pop(conn, None)
        if not peers:
            del group[conn.peer]


SOMAXCONN_PATH = "/proc/sys/net/core/somaxconn"


def listen_backlog() -> int:
    """The accept queue to ask for: the kernel's ceiling (`net.core.somaxconn`, which
    silently cuts any larger request), not asyncio's and aiohttp's 100-128, which a burst
    of connections overflows while the event loop is busy (the kernel then drops SYNs and
    clients wait out a retransmit: 1 s, then 3 s). grpc-core reads the same file."""
    try:
        with open(SOMAXCONN_PATH) as f:
            return max(128, min(int(f.read()), 65535))
    except (OSError, ValueError):
        return 4096


def _millis(seconds: float) -> int:
    return max(1, min(2**31 - 1, round(seconds * 1000)))


def release_freed_memory() -> None:
    """Hand the heap's free pages back to the system (glibc's `malloc_trim`). A flood of
    connections leaves grpc-core's and Python's per-connection buffers freed but kept by
    malloc's arenas, so RSS stayed ~20% above where it was long after; trimmed, it comes
    back. A no-op where libc has no malloc_trim."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return cast(Callable[[int], int], ctypes.CDLL(None).malloc_trim)
    except (OSError, AttributeError):
        return None


class Tally:
    """Counts of what a listener refused or closed, logged as one line per LOG_INTERVAL
    at most (never a line per connection: a flood must not become a flood of logs).
    After each line, the memory the closed connections freed goes back to the system
    (`release_freed_memory`): a line means connections came and went."""

    def __init__(self, name: str, interval: float = LOG_INTERVAL) -> None:
        self.name = name
        self.interval = interval
        self.counts: Counter[str] = Counter()  # since the last line logged
        self._flush: asyncio.TimerHandle | None = None
        self._since = 0.0  # when the first of `counts` came

    def add(self, what: str, n: int = 1) -> None:
        self.counts[what] += n
        if self._flush is None:
            loop = asyncio.get_running_loop()
            self._since = loop.time()
            self._flush = loop.call_later(self.interval, self.flush)

    def flush(self) -> None:
        self._flush = None
        if self.counts:
            seconds = asyncio.get_running_loop().time() - self._since
            parts = ", ".join(f"{n} {what}" for what, n in sorted(self.counts.items()))
            logger.warning("%s, in %.0f s: %s", self.name, seconds, parts)
            self.counts.clear()
            release_freed_memory()

    def close(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
        self.flush()


# What asyncio's accept loop reports when accept() fails for want of a resource; it
# retries after 1 s, but reports each of up to `backlog` failed calls per wake-up, each
# with a traceback, and schedules a retry for each.
_ACCEPT_FAILED = "socket.accept() out of system resource"

ExceptionHandler = Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object]


class AcceptErrors:
    """An event-loop exception handler that counts failed accept() calls into `tally`
    ("failed accept() (EMFILE)") instead of logging each, and drops the errors of the
    retries asyncio scheduled for a server closed since (they fail on its closed socket,
    each with a traceback, up to a second after the close); anything else goes to the
    handler installed before (or the loop's default). It stays installed for the loop's
    life, since those retries come after the server is gone."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally
        self._previous: ExceptionHandler | None = None

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        self._previous = loop.get_exception_handler()
        loop.set_exception_handler(self)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") == _ACCEPT_FAILED:
            code = getattr(context.get("exception"), "errno", None)
            name = errno.errorcode.get(code, "error") if isinstance(code, int) else "error"
            self.tally.add(f"failed accept() ({name})")
        elif _callback_name(context) == "_start_serving":
            pass  # a retry of accept() on a server closed since
        elif self._previous is not None:
            self._previous(loop, context)
        else:
            loop.default_exception_handler(context)


def _callback_name(context: dict[str, Any]) -> str:
    callback = getattr(context.get("handle"), "_callback", None)
    return str(getattr(callback, "__name__", ""))
