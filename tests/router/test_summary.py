from __future__ import annotations

from radixmesh.prefix import block_hashes
from radixmesh.router.summary import BYTES_PER_BLOCK, PrefixSummary, SummaryIndex


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _hashes(n_blocks: int, first: int = 0, block: int = 4) -> list[int]:
    return block_hashes(list(range(first, first + n_blocks * block)), block)


def test_match_counts_leading_blocks_only() -> None:
    s = PrefixSummary()
    h = _hashes(4)
    s.store(h[:2])
    assert s.match(h) == 2
    s.store(h[3:])  # block 3 without block 2: the run still stops at block 2
    assert s.match(h) == 2
    assert s.match(_hashes(4, first=1)) == 0


def test_store_remove_clear_reset() -> None:
    s = PrefixSummary()
    h = _hashes(3)
    s.store(h)
    s.remove(h[1:])
    assert s.match(h) == 1 and s.num_confirmed == 1
    s.clear()
    assert s.match(h) == 0 and len(s) == 0
    s.reset(epoch=7, sequence=42, hashes=h)
    assert (s.epoch, s.sequence, s.match(h)) == (7, 42, 3)


def test_tentative_entries_expire_unless_confirmed() -> None:
    clock = FakeClock()
    s = PrefixSummary(clock)
    h = _hashes(3)
    s.add_tentative(h, ttl=5.0)
    assert s.match(h) == 3 and s.num_confirmed == 0
    s.store(h[:1])  # the worker's event confirms block 0
    clock.now += 5.0
    assert s.match(h) == 1
    assert len(s) == 1 + 1  # block 0 confirmed; block 2's expiry is found lazily
    s.expire()
    assert len(s) == 1


def test_budget_forgets_oldest_blocks_of_the_fullest_summary() -> None:
    index = SummaryIndex(budget_bytes=5 * BYTES_PER_BLOCK)
    a, b = index.add("a"), index.add("b")
    ha, hb = _hashes(4, first=0), _hashes(2, first=1000)
    a.store(ha)
    b.store(hb)
    assert index.nbytes == 6 * BYTES_PER_BLOCK
    index.enforce_budget()
    assert index.nbytes == 5 * BYTES_PER_BLOCK
    assert index.forgotten_blocks == 1
    # a's oldest block (block 0) went: a's prompt now matches nothing, b is intact.
    assert index.match(ha) == {"a": 0, "b": 0}
    assert index.match(hb) == {"a": 0, "b": 2}
    assert a.match(ha[1:]) == 3


def test_budget_drops_tentative_before_confirmed() -> None:
    index = SummaryIndex(budget_bytes=2 * BYTES_PER_BLOCK)
    a = index.add("a")
    h = _hashes(3)
    a.store(h[:2])
    a.add_tentative(_hashes(1, first=500), ttl=60.0)
    index.enforce_budget()
    assert a.match(h) == 2 and len(a) == 2


def test_pool_applies_events_within_the_budget() -> None:
    import asyncio

    from radixmesh.router.config import RouterConfig
    from radixmesh.router.pool import WorkerPool
    from radixmesh.v1 import worker_pb2

    async def run() -> tuple[int, int, int]:
        config = RouterConfig(workers=("127.0.0.1:1",), summary_budget_bytes=3 * BYTES_PER_BLOCK)
        pool = WorkerPool(config)
        handle = pool.workers["worker-0"]
        h = _hashes(5)
        stored = worker_pb2.CacheEvent(
            epoch=1, sequence=1, kind=worker_pb2.CACHE_EVENT_KIND_STORED, block_hashes=h
        )
        handle.apply(stored)
        removed = worker_pb2.CacheEvent(
            epoch=1, sequence=2, kind=worker_pb2.CACHE_EVENT_KIND_REMOVED, block_hashes=h[4:]
        )
        handle.apply(removed)
        await pool.close()
        return handle.summary.num_confirmed, handle.summary.sequence, handle.summary.match(h[2:])

    # 5 stored, the 2 oldest forgotten for the budget, then the newest removed.
    assert asyncio.run(run()) == (2, 2, 2)


def test_pool_counts_pending_events_as_tentative() -> None:
    import asyncio

    from radixmesh.router.config import RouterConfig
    from radixmesh.router.pool import WorkerPool, snapshot_blocks
    from radixmesh.v1 import worker_pb2

    async def run() -> tuple[int, int, int, set[int]]:
        config = RouterConfig(workers=("127.0.0.1:1",), tentative_ttl=60.0)
        pool = WorkerPool(config)
        handle = pool.workers["worker-0"]
        h = _hashes(4)
        pending = worker_pb2.CacheEvent(
            epoch=1, sequence=1, kind=worker_pb2.CACHE_EVENT_KIND_PENDING, block_hashes=h
        )
        handle.apply(pending)
        await pool.close()
        # A snapshot's pending entries (there are none in a real one) leave its blocks alone.
        stored = worker_pb2.CacheEvent(kind=worker_pb2.CACHE_EVENT_KIND_STORED, block_hashes=h[:1])
        present = snapshot_blocks([stored, pending])
        s = handle.summary
        return s.match(h), s.num_confirmed, s.sequence, present

    # Matched as tentative (another replica routed it there), nothing confirmed yet.
    h = _hashes(4)
    assert asyncio.run(run()) == (4, 0, 1, set(h[:1]))
