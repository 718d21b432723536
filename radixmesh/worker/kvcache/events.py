"""Cache events: what a worker's radix cache tells the router about its contents.

The router keeps, per worker, the set of prefix-block hashes the worker's cache holds
(hashes from `radixmesh.prefix.block_hashes`, block size `CacheConfig.event_block_size`).
Block k of a root path (its tokens [kB, (k+1)B)) is present iff the tree holds a path
covering at least (k+1)B tokens. Events keep that set exact:

- "stored": a new tree node covering path tokens [a, b) makes the blocks whose end lies
  in (a, b] present. `parent_hash` is the hash of the block before the first one (None
  at the root), so a consumer that keeps a tree instead of a set can attach them.
- "removed": an evicted node takes away the same blocks it stored.
- "cleared": the cache was flushed (`RadixCache.reset`); drop every hash. One event
  instead of one removal per node, because a flush should not cost a full re-hash.
- "offloaded": with a host-memory tier (`host_tier.py`), the node's blocks left the
  device but stay in host memory: a prompt over them reloads instead of recomputing.
  "removed" always means gone from every tier.
- "loaded": host-memory blocks are on the device again (and still in host memory).

A worker's device blocks form a root-connected set and its host-only blocks hang below
them: a prompt's blocks are device blocks, then host blocks, then misses.

Node splits change no path, so they emit nothing. Listeners are called synchronously on
the scheduler thread after the tree is consistent again; they must be cheap (append to
a queue) and must not call back into the cache.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

# Appended only: pipe.py sends a kind as its index here.
# "request_started" / "request_ended": a request announced by "pending" was prefilled /
# ended (the server publishes them, with its request id, for the routers' shared view of
# the worker's load). "grammar_compiled" / "grammar_evicted": grammars entered / left the
# worker's compiled-grammar cache (their keys in `grammar_keys`; the routers' grammar
# affinity). Neither kind says anything about the radix cache's blocks.
CacheEventKind = Literal[
    "stored",
    "removed",
    "cleared",
    "pending",
    "offloaded",
    "loaded",
    "request_started",
    "request_ended",
    "grammar_compiled",
    "grammar_evicted",
]


@dataclass(frozen=True)
class CacheEvent:
    kind: CacheEventKind
    block_hashes: tuple[int, ...]  # chained hashes, in path order
    parent_hash: int | None  # hash of the block before block_hashes[0]; None: root
    num_tokens: int  # tokens the blocks cover: len(block_hashes) * block size
    request_id: str = ""  # pending / started / ended: the request's id
    grammar_keys: tuple[int, ...] = ()  # grammar_*: the grammars' keys (radixmesh.grammar_key)


CacheListener = Callable[[CacheEvent], None]


class CacheEventListeners:
    """The listeners of one cache. `active` lets the cache skip hashing when there are none."""

    def __init__(self) -> None:
        self._fns: list[CacheListener] = []

    @property
    def active(self) -> bool:
        return bool(self._fns)

    def add(self, fn: CacheListener) -> None:
        self._fns.append(fn)

    def remove(self, fn: CacheListener) -> None:
        """Remove `fn`; raises ValueError if it was never added."""
        self._fns.remove(fn)

    def emit(self, event: CacheEvent) -> None:
        for fn in self._fns:
            fn(event)


def replay(events: Iterable[CacheEvent], into: set[int]) -> set[int]:
    """Apply `events` to a set of block hashes on the device (the reference reading of
    the stream; `replay_tiers` keeps the host-memory ones too)."""
    for ev in events:
        if ev.kind in ("stored", "loaded"):
            into.update(ev.block_hashes)
        elif ev.kind in ("removed", "offloaded"):
            into.difference_update(ev.block_hashes)
        elif ev.kind == "cleared":
            into.clear()  # ("pending" is a hint about requests, not the cache's contents)
    return into


def replay_tiers(
    events: Iterable[CacheEvent], device: set[int], host: set[int]
) -> tuple[set[int], set[int]]:
    """Apply `events` to the blocks on the device and those only in host memory."""
    for ev in events:
        hashes = ev.block_hashes
        if ev.kind in ("stored", "loaded"):
            device.update(hashes)
            host.difference_update(hashes)
        elif ev.kind == "offloaded":
            device.difference_update(hashes)
            host.update(hashes)
        elif ev.kind == "removed":
            device.difference_update(hashes)
            host.difference_update(hashes)
        elif ev.kind == "cleared":
            device.clear()
            host.clear()
    return device, host
