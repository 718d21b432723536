"""Outputs from the scheduler thread to the asyncio queues of one event loop's requests."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import TypeVar

from radixmesh.worker.request_output import RequestOutput

T = TypeVar("T")


class Mailbox:
    """Outputs from the scheduler thread to the queues of one event loop's requests.

    One wake-up of the loop (`call_soon_threadsafe`, a write to its self-pipe) carries
    every output that arrived since the loop last drained: a step that produces a token for
    256 streams wakes the loop once, not 256 times."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[asyncio.Queue[RequestOutput], RequestOutput]] = []
        self._scheduled = False

    def put(self, q: asyncio.Queue[RequestOutput], out: RequestOutput) -> None:
        """From the scheduler thread."""
        with self._lock:
            self._items.append((q, out))
            if self._scheduled:
                return
            self._scheduled = True
        # A closed loop (RuntimeError): its requests' consumers are gone already.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, []
            self._scheduled = False
        for q, out in items:
            q.put_nowait(out)


async def next_item(q: asyncio.Queue[T], poll_s: float, check: Callable[[], None]) -> T:
    """The queue's next item, calling `check` (which raises when the producer is gone)
    every `poll_s` seconds while none comes.

    Not `asyncio.wait_for`: on Python 3.11 it returns the item and swallows the caller's
    cancellation when both happen in one loop iteration, and a cancelled (disconnected,
    expired) stream must always reach its `finally` and abort its request."""
    if not q.empty():  # the common case under load: no waiting, no timer
        return q.get_nowait()
    getter = asyncio.ensure_future(q.get())
    try:
        while True:
            done, _ = await asyncio.wait({getter}, timeout=poll_s)
            if done:
                return getter.result()
            check()
    finally:
        getter.cancel()  # no-op when done
