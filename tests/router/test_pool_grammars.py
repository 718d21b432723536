"""The grammars a worker announced, as its handle keeps them: events add and drop keys, a
snapshot replaces the set; the control plane sends a request where its grammar is."""

from __future__ import annotations

import asyncio
from typing import Any

from radixmesh.router import pool as pool_module
from radixmesh.router.config import RouterConfig
from radixmesh.router.control import ControlPlane
from radixmesh.router.metrics import RouterMetrics
from radixmesh.router.pool import WorkerPool
from radixmesh.v1 import worker_pb2

COMPILED = worker_pb2.CACHE_EVENT_KIND_GRAMMAR_COMPILED
EVICTED = worker_pb2.CACHE_EVENT_KIND_GRAMMAR_EVICTED


def _event(seq: int, kind: worker_pb2.CacheEventKind, keys: list[int]) -> worker_pb2.CacheEvent:
    return worker_pb2.CacheEvent(epoch=7, sequence=seq, kind=kind, grammar_keys=keys)


class _Snapshots:
    """A worker stub whose GetCacheSnapshot answers a fixed snapshot."""

    def __init__(self, snap: worker_pb2.GetCacheSnapshotResponse) -> None:
        self.snap = snap

    async def GetCacheSnapshot(self, *args: Any, **kwargs: Any) -> Any:
        return self.snap


def test_events_add_and_drop_keys_and_a_snapshot_replaces_them() -> None:
    async def run() -> list[set[int]]:
        handle = WorkerPool(RouterConfig(workers=("127.0.0.1:1",))).workers["worker-0"]
        seen = []

        def look() -> None:
            seen.append(set(handle.grammars))

        handle.apply(_event(1, COMPILED, [5]))
        handle.apply(_event(2, COMPILED, [6, 2**64 - 1]))
        look()
        handle.apply(_event(3, EVICTED, [5]))
        look()
        snap = worker_pb2.GetCacheSnapshotResponse(
            epoch=8,
            sequence=40,
            block_size=16,
            events=[
                worker_pb2.CacheEvent(kind=worker_pb2.CACHE_EVENT_KIND_STORED, block_hashes=[1]),
                worker_pb2.CacheEvent(kind=COMPILED, grammar_keys=[5, 9]),
            ],
        )
        handle.stub = _Snapshots(snap)  # type: ignore[assignment]
        await handle.resync()
        look()
        await handle.close()
        return seen

    assert asyncio.run(run()) == [{5, 6, 2**64 - 1}, {6, 2**64 - 1}, {5, 9}]


def test_a_worker_is_kept_to_max_grammars(monkeypatch: Any) -> None:
    monkeypatch.setattr(pool_module, "MAX_GRAMMARS", 3)

    async def run() -> set[int]:
        handle = WorkerPool(RouterConfig(workers=("127.0.0.1:1",))).workers["worker-0"]
        handle.apply(_event(1, COMPILED, [1, 2]))
        handle.apply(_event(2, COMPILED, [3, 4]))
        await handle.close()
        return handle.grammars

    assert asyncio.run(run()) == {1, 2, 3}


def test_pick_sends_a_cold_prompt_where_its_grammar_is() -> None:
    async def run(affinity: int) -> list[str]:
        config = RouterConfig(
            workers=("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"),
            seed=0,
            grammar_affinity_tokens=affinity,
        )
        pool = WorkerPool(config)
        for w in pool.workers.values():
            w.reachable = True  # as after a health answer
            w.block_size = 4  # as after its snapshot
        pool.workers["worker-2"].grammars.add(77)
        control = ControlPlane(config, pool, RouterMetrics(pool))
        # Each prompt cold on every worker (and tentative only where it went).
        chosen = [control.pick([i] * 8, set(), grammar=77).worker.worker_id for i in range(6)]
        await pool.close()
        return chosen

    assert asyncio.run(run(32)) == ["worker-2"] * 6
    assert len(set(asyncio.run(run(0)))) > 1  # off: drawn among the tied workers
