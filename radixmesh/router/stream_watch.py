"""Reads of the workers' Generate streams, watched: a stream that sends nothing for
`stall_timeout` seconds is given up (a hung worker, e.g. SIGSTOPped, must not hold its
callers for minutes), and `stop` ends every read at once when the router shuts down."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from radixmesh.errors import Unavailable


class WorkerStalled(Unavailable):
    """A worker's stream sent nothing for `stall_timeout` seconds (hung)."""


class StreamWatch:
    def __init__(self, stall_timeout: float) -> None:
        self.stall_timeout = stall_timeout
        self.stopping: str | None = None  # why the streams left were stopped (shutdown)
        self._reads: set[asyncio.Timeout] = set()  # the timeouts of the reads now waiting

    async def read(self, call: Any, worker_id: str) -> AsyncIterator[Any]:
        """`call`'s messages; WorkerStalled when one takes longer than `stall_timeout`,
        Unavailable(why) once `stop(why)` was called."""
        while True:
            if self.stopping is not None:
                raise Unavailable(self.stopping)
            try:
                async with asyncio.timeout(self.stall_timeout) as deadline:
                    self._reads.add(deadline)
                    try:
                        resp = await call.read()
                    finally:
                        self._reads.discard(deadline)
            except TimeoutError:
                if self.stopping is not None:
                    raise Unavailable(self.stopping) from None
                raise WorkerStalled(
                    f"worker {worker_id} sent nothing for {self.stall_timeout:g} s"
                ) from None
            if resp is grpc.aio.EOF:
                return
            yield resp

    def stop(self, why: str) -> None:
        """End every read now (and every later one): each raises Unavailable(why)."""
        self.stopping = why
        now = asyncio.get_running_loop().time()
        for deadline in list(self._reads):
            deadline.reschedule(now)
