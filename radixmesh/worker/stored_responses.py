"""Stored responses of OpenAI's Responses API, kept by the worker that generated them.

Why here and not in the router: router replicas (`launch --routers N`, Ray actors on
other nodes) each have their own memory, but every replica reaches every worker. The
router names a response after the worker that served it (its id carries the worker's
event epoch, router/http/openai/responses_api/worker_store.py), puts the entry there, and
any replica finds it again from the id alone. A worker restart loses its entries with
its KV cache; the new process has a new epoch, so the old ids read as unknown (404).

The worker keeps entries as opaque bytes (the router's JSON), per caller (a digest of
the client's key): another caller's entry reads as unknown. Bounds, whatever the routers
ask, so that no client can grow a worker's memory without end:
- `max_entries` entries and `max_bytes` bytes for all of them (each accounted as its
  bytes plus `ENTRY_OVERHEAD` for the key and the dict around it); past either, the
  oldest entries are dropped; an entry alone over `max_bytes` is refused;
- each entry expires after the ttl its put asked for, capped at `max_ttl`. An expired
  entry reads as unknown at once; its memory is freed when it reaches the front of the
  order of insertion, or sooner by the bounds.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from radixmesh.errors import InvalidArgument

ENTRY_OVERHEAD = 256  # bytes accounted per entry beyond its value (key, dict slot)


@dataclass(frozen=True)
class StoredResponseLimits:
    """The worker's own bounds (module docstring). The defaults hold a router's default
    store (65,536 entries, 64 MiB, an hour) on each worker."""

    max_entries: int = 65536
    max_bytes: int = 64 * 1024 * 1024
    max_ttl: float = 24 * 3600.0

    def __post_init__(self) -> None:
        for name in ("max_entries", "max_bytes"):
            if getattr(self, name) < 0:
                raise InvalidArgument(name, f"must be >= 0, got {getattr(self, name)}")
        if not self.max_ttl > 0:
            raise InvalidArgument("max_ttl", f"must be > 0, got {self.max_ttl}")


@dataclass(frozen=True)
class _Entry:
    value: bytes
    size: int
    expires: float


class StoredResponses:
    """Entries by (caller, response id), bounded and expiring. Every method runs to its
    end without awaiting: calls from the server's event loop never interleave."""

    def __init__(
        self,
        limits: StoredResponseLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits or StoredResponseLimits()
        self.clock = clock
        self.bytes = 0
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, caller: str, response_id: str, value: bytes, ttl: float) -> bool:
        """Keep `value` for `ttl` seconds (at most max_ttl); False when refused."""
        if not response_id:
            raise InvalidArgument("response_id", "must not be empty")
        if math.isnan(ttl) or ttl <= 0:
            raise InvalidArgument("ttl_seconds", f"must be > 0, got {ttl}")
        self._drop_expired()
        size = len(value) + len(caller) + len(response_id) + ENTRY_OVERHEAD
        lim = self.limits
        if size > lim.max_bytes or lim.max_entries == 0:
            return False
        key = (caller, response_id)
        if key in self._entries:  # a put again replaces (and renews) the entry
            self._remove(key)
        while self._entries and (
            self.bytes + size > lim.max_bytes or len(self._entries) >= lim.max_entries
        ):
            self._remove(next(iter(self._entries)))
        self._entries[key] = _Entry(value, size, self.clock() + min(ttl, lim.max_ttl))
        self.bytes += size
        return True

    def get(self, caller: str, response_id: str) -> bytes | None:
        """The value, or None when unknown, expired, dropped or another caller's."""
        self._drop_expired()
        key = (caller, response_id)
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires <= self.clock():
            self._remove(key)
            return None
        return entry.value

    def delete(self, caller: str, response_id: str) -> bool:
        """Forget the entry; False when it was not there (or had expired)."""
        found = self.get(caller, response_id) is not None
        if found:
            self._remove((caller, response_id))
        return found

    def _drop_expired(self) -> None:
        now = self.clock()
        while self._entries and next(iter(self._entries.values())).expires <= now:
            self._remove(next(iter(self._entries)))

    def _remove(self, key: tuple[str, str]) -> None:
        self.bytes -= self._entries.pop(key).size
