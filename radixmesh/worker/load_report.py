"""The engine's load as the worker's server last read it, and how old that read is.

GetLoad is the router's health poll. Reading the load needs the engine: its scheduler
answers between steps, and with the engine in a child process the read also crosses the
pipe. Under a burst that is seconds: the poll passed the router's `health_timeout`, and
a worker serving at full speed was marked down. So GetLoad answers from the server process:
it starts a read (at most one at a time), waits for it up to `FRESH_WAIT_S`, and otherwise
answers with the last load it has and that load's age (the seconds since the engine last
answered). The answer then says the server is up, and the age says when the engine was
last heard from, so that a hung engine behind a live server is still seen (the router
judges both: router/liveness.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from radixmesh.worker.stats import SchedulerStats

# Seconds GetLoad waits for a fresh read before it answers with the last one. An idle
# engine answers in about a millisecond and a busy one within a scheduler step; a quarter
# second keeps the answer far inside any router's health timeout (2 s by default) while
# sparing most polls a stale load.
FRESH_WAIT_S = 0.25


class LoadReporter:
    """`read` is the engine's blocking stats call (run on a thread)."""

    def __init__(
        self, read: Callable[[], SchedulerStats], fresh_wait: float = FRESH_WAIT_S
    ) -> None:
        self.read = read
        self.fresh_wait = fresh_wait
        self.stats: SchedulerStats | None = None
        self.read_at = 0.0  # time.monotonic() when `stats` came from the engine
        self._reading: asyncio.Task[None] | None = None

    async def current(self) -> tuple[SchedulerStats, float]:
        """The freshest load to be had now and its age in seconds. Waits for the first
        read without a bound (the caller's deadline bounds it): there is nothing older."""
        reading = self._reading
        if reading is None or reading.done():
            if reading is not None:
                reading.exception()  # a failure no caller waited for: this read retries
            reading = self._reading = asyncio.ensure_future(self._read())
        if self.stats is None:
            await asyncio.shield(reading)
        else:
            await asyncio.wait({reading}, timeout=self.fresh_wait)
        error = reading.exception() if reading.done() else None
        if error is not None:
            raise error  # the engine is gone (Unavailable) or failed
        assert self.stats is not None
        return self.stats, max(time.monotonic() - self.read_at, 0.0)

    async def _read(self) -> None:
        stats = await asyncio.to_thread(self.read)
        self.stats, self.read_at = stats, time.monotonic()
