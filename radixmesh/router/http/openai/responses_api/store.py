"""Stored responses: what `previous_response_id`, retrieve, delete and `input_items` read.

`ResponseStore` is the interface. The router's default is worker_store.py's: the entries
live on the workers, so that every router replica finds them (that module says why).
`MemoryResponseStore` keeps them in one process's memory, where a response is found only
through the replica that served it. A store that reaches the network is why the methods
are coroutines and the entries plain JSON values; a store names the ids (`new_id`), so
that an id can say where its entry is.

An entry (`StoredResponse`) is the response as answered and the items it was generated
from (items.py: its conversation before it, then its input), so the next request
continues `conversation()`, as they are (OpenAI's semantics: `instructions` are not
carried over). Items are shared between the entries of one conversation (the same
objects), and never changed once stored.

The in-memory store's bounds, so that no client can grow the router's memory without end:
- `ttl` seconds per entry (from when it was stored; expired entries are dropped as the
  store is used, oldest first);
- `max_entries` entries;
- `max_bytes` for all entries together, each accounted as its text bytes
  (limits.text_bytes of its response and items) plus 512 per item and 2048 per entry
  (Python's dicts around the text: measured, an entry's allocations stay under its
  account, docs/reliability.md), as if it held its whole conversation alone, which
  over-counts the items entries share.
Past a bound the oldest entries are dropped; an entry alone over a bound is not stored.
"""

from __future__ import annotations

import time
import uuid
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from radixmesh.router.http.event_ids import derived_id
from radixmesh.router.limits import text_bytes

Json = dict[str, Any]

_ITEM_OVERHEAD = 512  # bytes accounted per item, beyond its text
_ENTRY_OVERHEAD = 2048  # and per entry (the response object's own dicts)


@dataclass(frozen=True)
class StoredResponse:
    response: Json  # the `response` object as the client got it (status completed / incomplete)
    input_items: tuple[Json, ...]  # what it was generated from, in items.py's layout

    @property
    def id(self) -> str:
        return str(self.response["id"])

    def conversation(self) -> tuple[Json, ...]:
        """What a request naming it in `previous_response_id` continues: its input items,
        then its output items."""
        return (*self.input_items, *self.response["output"])


class ResponseStore(ABC):
    """Finished responses, per caller (auth.caller_of its key).

    The rules every store keeps:
    - another caller's response reads as unknown (None, False), never as someone else's;
    - `put` may decline an entry (False: the response was answered all the same, and is
      not found later); an entry may vanish any time after `put` (its expiry, the
      bounds): it then reads as unknown, as an id never stored;
    - values go in and come out as the plain JSON they are (a shared store serializes
      them); callers do not change them;
    - the methods run on the event loop: a store that reaches the network awaits it.
    """

    def new_id(self, worker_id: str) -> str:
        """The id of a new response that worker `worker_id` generates."""
        return "resp_" + uuid.uuid4().hex

    def stream_response_id(self, stream_id: str) -> str:
        """The id of a resumable stream's response, the same on every replica (a resume
        goes on under the id the client has): it names the worker by the epoch the
        stream id starts with, as `new_id` does on the workers' store."""
        token = stream_id.partition("/")[0]
        return f"resp_{token}{derived_id(stream_id, 'response')}"

    @abstractmethod
    async def put(self, caller: str, entry: StoredResponse) -> bool:
        """Keep `entry` under its response's id; False when it is not kept."""

    @abstractmethod
    async def get(self, caller: str, response_id: str) -> StoredResponse | None:
        """The entry of `caller`'s response; None when unknown, expired or dropped."""

    @abstractmethod
    async def delete(self, caller: str, response_id: str) -> bool:
        """Forget `caller`'s response; False when it was not there."""


@dataclass(frozen=True)
class _Entry:
    value: StoredResponse
    size: int
    expires: float


class MemoryResponseStore(ResponseStore):
    """The store in the router's memory. Every method runs to its end without awaiting,
    so calls from the event loop's tasks never interleave (no lock)."""

    def __init__(
        self,
        max_entries: int,
        max_bytes: int,
        ttl: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl = ttl
        self.clock = clock
        self.bytes = 0
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    async def put(self, caller: str, entry: StoredResponse) -> bool:
        self._expire()
        items = entry.conversation()
        size = text_bytes([entry.response, *entry.input_items], self.max_bytes)
        size += _ITEM_OVERHEAD * len(items) + _ENTRY_OVERHEAD
        if size > self.max_bytes or self.max_entries == 0:
            return False
        key = (caller, entry.id)
        if key in self._entries:  # ids are new per response: only a replayed put
            self._remove(key)
        while self._entries and (
            self.bytes + size > self.max_bytes or len(self._entries) >= self.max_entries
        ):
            self._remove(next(iter(self._entries)))
        self._entries[key] = _Entry(entry, size, self.clock() + self.ttl)
        self.bytes += size
        return True

    async def get(self, caller: str, response_id: str) -> StoredResponse | None:
        self._expire()
        entry = self._entries.get((caller, response_id))
        return None if entry is None else entry.value

    async def delete(self, caller: str, response_id: str) -> bool:
        self._expire()
        key = (caller, response_id)
        if key not in self._entries:
            return False
        self._remove(key)
        return True

    def _expire(self) -> None:
        # One ttl for all: the order of insertion is the order of expiry.
        now = self.clock()
        while self._entries and next(iter(self._entries.values())).expires <= now:
            self._remove(next(iter(self._entries)))

    def _remove(self, key: tuple[str, str]) -> None:
        self.bytes -= self._entries.pop(key).size
