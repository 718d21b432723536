"""Admission control at the router: how many requests reach the workers at once, how many
wait for a turn and for how long, and how fast each caller may send.

- `Admission.slot()`: a request that goes to a worker (a generation's stream, an
  embedding, a select's score) holds a slot while it runs. At most `max_concurrent`
  are held; up to `max_queued` more wait for one, each for at most `queue_timeout`
  seconds. A request past the queue, or one that waited too long, is `Overloaded` (429 /
  RESOURCE_EXHAUSTED with a Retry-After). A slot is taken before the request is routed,
  so a refused or shed request leaves nothing in the workers' load accounting.
- `RateLimiter.take(caller)`: a token bucket per caller (a digest of its key): `rate`
  requests a second on average, `burst` at once. An empty bucket is `Overloaded` with
  the seconds until it holds a token again.

Both are bounded: the waiters by `max_queued`, the buckets by `MAX_CALLERS` (the least
recently seen caller's bucket is dropped first; it comes back full).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from radixmesh.errors import Overloaded, Unavailable

MAX_CALLERS = 100_000


class Admission:
    def __init__(self, max_concurrent: int, max_queued: int, queue_timeout: float) -> None:
        """`max_concurrent` 0: no cap (nothing waits)."""
        self.max_concurrent = max_concurrent
        self.max_queued = max_queued
        self.queue_timeout = queue_timeout
        self.active = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.closed: str | None = None  # why no request is admitted any more (draining)
        self.refused = 0  # requests refused at a full queue or after waiting too long

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold a slot for the body; Overloaded when none came in time."""
        await self._acquire()
        try:
            yield
        finally:
            self._release()

    async def _acquire(self) -> None:
        if self.closed is not None:
            raise Unavailable(self.closed)
        if not self.max_concurrent or self.active < self.max_concurrent:
            self.active += 1
            return
        if len(self._waiters) >= self.max_queued:
            self.refused += 1
            raise Overloaded(
                f"the router is at its limit ({self.active} requests running, "
                f"{len(self._waiters)} waiting)",
                retry_after=1.0,
            )
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(turn)
        try:
            async with asyncio.timeout(self.queue_timeout):
                await turn
        except BaseException as e:
            if turn.done() and not turn.cancelled() and turn.exception() is None:
                self._release()  # handed a slot just as it gave up: pass it on
            elif turn in self._waiters:
                self._waiters.remove(turn)
            if isinstance(e, TimeoutError):
                self.refused += 1
                raise Overloaded(
                    f"no turn within {self.queue_timeout:g} s: the router is busy",
                    retry_after=1.0,
                ) from None
            raise

    def _release(self) -> None:
        while self._waiters:  # hand the slot to the first one still waiting
            turn = self._waiters.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self.active -= 1

    def close(self, why: str) -> None:
        """Admit nothing more; those waiting get Unavailable(why)."""
        self.closed = why
        while self._waiters:
            turn = self._waiters.popleft()
            if not turn.done():
                turn.set_exception(Unavailable(why))


class RateLimiter:
    """Token buckets, one per caller: `rate` tokens a second, at most `burst` held."""

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = max(burst, 1)
        self.clock = clock
        self._buckets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()
        self.refused = 0

    def take(self, caller: str) -> None:
        """Take one token from `caller`'s bucket, or Overloaded saying when to retry."""
        if self.rate <= 0:
            return
        now = self.clock()
        tokens, stamp = self._buckets.pop(caller, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - stamp) * self.rate)
        if tokens < 1.0:
            self._buckets[caller] = (tokens, now)
            self.refused += 1
            wait = (1.0 - tokens) / self.rate
            raise Overloaded(
                f"rate limit: {self.rate:g} requests a second (burst {self.burst})",
                retry_after=wait,
            )
        self._buckets[caller] = (tokens - 1.0, now)
        while len(self._buckets) > MAX_CALLERS:
            self._buckets.popitem(last=False)
