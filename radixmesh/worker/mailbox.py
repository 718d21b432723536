"""Outputs from the scheduler thread to the asyncio queues of one event loop's requests."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from radixmesh.worker.request_output import RequestOutput


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
