"""What `previous_response_id` refers to: stored responses, in the router's memory.

Each stored response keeps its conversation: the items it continued (its own previous
response's), its input items, and its output items as input items, so the next request
prepends them as they are (OpenAI's semantics: `instructions` are not carried over).
Items are shared between the entries of one conversation (a tuple of the same objects).

Bounds, so that no client can grow the router's memory without end:
- `ttl` seconds per entry (from when it was stored; expired entries are dropped as the
  store is used, oldest first);
- `max_bytes` for all entries together, each accounted as its conversation's text bytes
  (limits.text_bytes) plus 64 per item, as if it held its whole conversation alone,
  which over-counts the items entries share: the real memory stays under the budget.
  Past it the oldest entries are dropped; an entry larger than the budget is not stored.

Entries are per caller (auth.caller_of its key): another caller's id reads as unknown.
The store is per router process: with several router replicas behind one address, a
`previous_response_id` is found only on the replica that served it (docs/router-http.md).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from radixmesh.router.http.openai.responses_api.requests import Item
from radixmesh.router.limits import text_bytes

_ITEM_OVERHEAD = 64  # bytes accounted per item, beyond its text


@dataclass(frozen=True)
class _Entry:
    items: tuple[Item, ...]
    size: int
    expires: float


class ResponseStore:
    def __init__(
        self, max_bytes: int, ttl: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_bytes = max_bytes
        self.ttl = ttl
        self.clock = clock
        self.bytes = 0
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, caller: str, response_id: str, items: tuple[Item, ...]) -> bool:
        """Store a response's conversation; False when it alone is over the budget."""
        self._expire()
        size = text_bytes([i.model_dump() for i in items], self.max_bytes)
        size += _ITEM_OVERHEAD * len(items)
        if size > self.max_bytes:
            return False
        while self._entries and self.bytes + size > self.max_bytes:
            self._drop_oldest()
        self._entries[(caller, response_id)] = _Entry(items, size, self.clock() + self.ttl)
        self.bytes += size
        return True

    def get(self, caller: str, response_id: str) -> tuple[Item, ...] | None:
        """The conversation of a stored response of `caller`; None when unknown or expired."""
        self._expire()
        entry = self._entries.get((caller, response_id))
        return None if entry is None else entry.items

    def _expire(self) -> None:
        now = self.clock()
        while self._entries and next(iter(self._entries.values())).expires <= now:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        _, entry = self._entries.popitem(last=False)
        self.bytes -= entry.size
