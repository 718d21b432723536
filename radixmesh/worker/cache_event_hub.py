"""Numbered cache events for subscribers on an asyncio loop.

The radix cache fires events on the scheduler thread. The hub's one listener numbers them
(1, 2, 3, ... within an `epoch` that is new for every process start) and hands each to
every subscriber's asyncio queue through `call_soon_threadsafe`, so the scheduler thread
never blocks on a slow consumer. The server adds "pending" events on its loop when a
request arrives (`publish_pending`), and "request_started" / "request_ended" when it is
prefilled and when it ends (`publish_request`: router replicas count each other's requests
from them): numbered under the same lock and queued to the loop in number order, so
subscribers see one gapless sequence. A consumer that falls more
than `max_queue` events behind is cut off (its stream ends) and must resubscribe and pull
a snapshot; the sequence numbers let it see a gap.
"""

from __future__ import annotations

import asyncio
import random
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from radixmesh.worker.kvcache.events import CacheEvent

if TYPE_CHECKING:
    from radixmesh.worker.serving_engine import ServingEngine


@dataclass(frozen=True)
class NumberedEvent:
    epoch: int
    sequence: int
    event: CacheEvent


@dataclass(frozen=True)
class Snapshot:
    epoch: int
    sequence: int  # the last event the snapshot includes
    events: list[CacheEvent]


class CacheEventHub:
    def __init__(
        self, engine: ServingEngine, loop: asyncio.AbstractEventLoop, max_queue: int = 65536
    ):
        """`engine`: an Engine or an EngineProcess (add_cache_listener, cache_snapshot)."""
        self.engine = engine
        self.loop = loop
        self.max_queue = max_queue
        self.epoch = random.getrandbits(63) or 1
        self._sequence = 0  # numbered under _lock (the engine's event thread, the loop)
        self._lock = threading.Lock()
        self._subscribers: set[asyncio.Queue[NumberedEvent | None]] = set()
        engine.add_cache_listener(self._on_event)

    def _on_event(self, event: CacheEvent) -> None:  # on the engine's event thread
        with self._lock:  # queued to the loop in number order
            self._sequence += 1
            item = NumberedEvent(self.epoch, self._sequence, event)
            self.loop.call_soon_threadsafe(self._fan_out, item)

    @property
    def subscribed(self) -> bool:
        return bool(self._subscribers)

    def publish_pending(
        self, hashes: tuple[int, ...], block_size: int, request_id: str = ""
    ) -> None:
        """On the loop: a request for these prefix blocks arrived."""
        if not hashes and not request_id:
            return
        self._publish(CacheEvent("pending", hashes, None, len(hashes) * block_size, request_id))

    def publish_request(
        self, kind: Literal["request_started", "request_ended"], request_id: str
    ) -> None:
        """On the loop: the request a "pending" event announced was prefilled / ended."""
        self._publish(CacheEvent(kind, (), None, 0, request_id))

    def _publish(self, event: CacheEvent) -> None:
        with self._lock:
            self._sequence += 1
            self.loop.call_soon(self._fan_out, NumberedEvent(self.epoch, self._sequence, event))

    def _fan_out(self, item: NumberedEvent) -> None:  # on the loop
        for q in list(self._subscribers):
            if q.qsize() >= self.max_queue:
                self._subscribers.discard(q)
                q.put_nowait(None)  # too far behind: end its stream
            else:
                q.put_nowait(item)

    def subscribe(self) -> asyncio.Queue[NumberedEvent | None]:
        q: asyncio.Queue[NumberedEvent | None] = asyncio.Queue()
        self._subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[NumberedEvent | None]) -> None:
        self._subscribers.discard(q)

    def close(self) -> None:
        for q in list(self._subscribers):
            q.put_nowait(None)
        self._subscribers.clear()

    async def snapshot(self) -> Snapshot:
        """The cache's contents and the sequence number they reflect, read atomically."""

        sequence, events = await asyncio.to_thread(
            self.engine.cache_snapshot, lambda: self._sequence
        )
        return Snapshot(self.epoch, sequence, events)
