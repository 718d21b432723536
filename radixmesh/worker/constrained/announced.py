"""The compiled grammars' keys as the worker's cache-event subscribers know them.

The compile cache hears a grammar compile or leave on its own threads; its announcements
(compile_cache.py's `announce`) reach the scheduler thread as commands, in order, and are
applied here. The scheduler thread is where the radix cache fires its events and where a
snapshot is taken, so an event stamp covers the grammar set exactly as it covers the
blocks: a subscriber that pulls a snapshot and then applies the events numbered after it
holds the worker's set, never a grammar announced twice or lost between the two.
"""

from __future__ import annotations

from radixmesh.worker.constrained.compile_cache import GrammarEventKind
from radixmesh.worker.kvcache.events import CacheEvent, CacheEventListeners, CacheListener


class AnnouncedGrammars:
    """Owned by the scheduler thread (every method runs there)."""

    def __init__(self) -> None:
        self.keys: set[int] = set()
        self._listeners = CacheEventListeners()

    def add_listener(self, fn: CacheListener) -> None:
        self._listeners.add(fn)

    def change(self, kind: GrammarEventKind, key: int) -> None:
        """A grammar entered (grammar_compiled) or left (grammar_evicted) the compiled
        cache: update the set and tell the listeners."""
        if kind == "grammar_compiled":
            self.keys.add(key)
        else:
            self.keys.discard(key)
        if self._listeners.active:
            self._listeners.emit(CacheEvent(kind, (), None, 0, grammar_keys=(key,)))

    def snapshot(self) -> list[CacheEvent]:
        """The whole set as one "grammar_compiled" event (none when it is empty)."""
        if not self.keys:
            return []
        return [CacheEvent("grammar_compiled", (), None, 0, grammar_keys=tuple(sorted(self.keys)))]
