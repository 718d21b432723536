"""The compiled grammars' keys as the worker's cache-event subscribers know them: each
change is one event, and a snapshot is the whole set in one event."""

from __future__ import annotations

from radixmesh.worker.constrained.announced import AnnouncedGrammars
from radixmesh.worker.kvcache.events import CacheEvent


def test_changes_are_events_and_the_snapshot_is_the_set() -> None:
    announced = AnnouncedGrammars()
    assert announced.snapshot() == []
    heard: list[CacheEvent] = []
    announced.add_listener(heard.append)
    announced.change("grammar_compiled", 9)
    announced.change("grammar_compiled", 3)
    announced.change("grammar_evicted", 9)
    announced.change("grammar_compiled", 5)
    assert [(e.kind, e.grammar_keys, e.block_hashes) for e in heard] == [
        ("grammar_compiled", (9,), ()),
        ("grammar_compiled", (3,), ()),
        ("grammar_evicted", (9,), ()),
        ("grammar_compiled", (5,), ()),
    ]
    assert announced.snapshot() == [
        CacheEvent("grammar_compiled", (), None, 0, grammar_keys=(3, 5))
    ]
