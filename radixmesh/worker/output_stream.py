"""How a request's outputs leave the worker: through an output stream (the outputs of
many requests, sent to one reader in batches), or on the request's own call as the first
and the rest (`first_and_rest`) or joined whole (`join`).

A router reads every token of every request it placed on this worker. One gRPC message
per request and token costs it a read each; through an output stream it reads one message
a step for all of its requests (docs/router-tier.md has what that saves). A request's
outputs that pile up while the reader is behind are joined into one (`RequestOutput.then`),
so a slow reader gets fewer, larger messages instead of a growing queue.

Owned by the worker's event loop: the Generate handlers `put`, the stream's handler
`take`s; nothing here is touched from another thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from radixmesh.errors import Unavailable

if TYPE_CHECKING:
    from radixmesh.worker.request_output import RequestOutput

# Streams one worker keeps open at once: one per router replica, with room for restarts.
MAX_OUTPUT_STREAMS = 64


class OutputStream:
    def __init__(self) -> None:
        self._ready: dict[str, RequestOutput] = {}  # outputs that go with the next message
        self._held: dict[str, RequestOutput] = {}  # outputs that wait for a later one
        self._wake = asyncio.Event()
        self.closed = False

    def put(self, rid: str, out: RequestOutput, send: bool) -> None:
        """Queue `out` for request `rid`; with `send` false it waits for a later output
        that may go (a non-streamed request's middle part). Unavailable once closed."""
        if self.closed:
            raise Unavailable("the output stream this request was to use closed")
        if (held := self._held.pop(rid, None)) is not None:
            out = held.then(out)
        if (ready := self._ready.get(rid)) is not None:
            self._ready[rid] = ready.then(out)  # it goes anyway: take this along
        elif send:
            self._ready[rid] = out
            self._wake.set()
        else:
            self._held[rid] = out

    async def take(self) -> list[tuple[str, RequestOutput]] | None:
        """The outputs that may go, in the order their requests became ready; waits for
        one. None once closed and nothing is left to send."""
        while not self._ready:
            if self.closed:
                return None
            self._wake.clear()
            await self._wake.wait()
        ready, self._ready = self._ready, {}
        return list(ready.items())

    def discard(self, rid: str) -> None:
        """Drop what is queued for `rid` (it failed: its call carries the error)."""
        self._ready.pop(rid, None)
        self._held.pop(rid, None)

    def close(self) -> None:
        """Take no more outputs; what is ready still goes (a finished request's last)."""
        self.closed = True
        self._held.clear()
        self._wake.set()


async def first_and_rest(outputs: AsyncIterator[RequestOutput]) -> AsyncIterator[RequestOutput]:
    """The first output as soon as it comes (the prompt is prefilled), then the rest
    joined into one: two messages for a router that needs no token in between."""
    first = True
    rest: RequestOutput | None = None
    async for out in outputs:
        if first:
            first = False
            yield out
        else:
            rest = out if rest is None else rest.then(out)
    if rest is not None:
        yield rest


async def join(outputs: AsyncIterator[RequestOutput]) -> RequestOutput:
    """A request's outputs as one (a stream ends with its finished output)."""
    joined: RequestOutput | None = None
    async for out in outputs:
        joined = out if joined is None else joined.then(out)
    assert joined is not None
    return joined
