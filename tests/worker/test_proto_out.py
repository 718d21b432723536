"""The worker's cache events on the wire: every kind it emits has its protobuf value."""

from __future__ import annotations

from typing import get_args

from radixmesh.v1 import worker_pb2
from radixmesh.worker.kvcache.events import CacheEvent, CacheEventKind
from radixmesh.worker.proto_out import event_to_proto


def test_every_cache_event_kind_maps_to_its_namesake() -> None:
    for kind in get_args(CacheEventKind):
        msg = event_to_proto(1, 2, CacheEvent(kind, (), None, 0))
        assert worker_pb2.CacheEventKind.Name(msg.kind) == f"CACHE_EVENT_KIND_{kind.upper()}"


def test_offloaded_and_loaded_events_on_the_wire() -> None:
    offloaded = event_to_proto(3, 7, CacheEvent("offloaded", (11, 12), 10, 32))
    assert (offloaded.kind, offloaded.epoch, offloaded.sequence) == (5, 3, 7)
    assert (list(offloaded.block_hashes), offloaded.parent_hash, offloaded.num_tokens) == (
        [11, 12],
        10,
        32,
    )
    loaded = event_to_proto(3, 8, CacheEvent("loaded", (11,), None, 16))
    assert loaded.kind == worker_pb2.CACHE_EVENT_KIND_LOADED == 6
    assert not loaded.HasField("parent_hash")
