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


# ---- the host-memory tier ----------------------------------------------------------------


def test_offload_load_remove_move_blocks_between_tiers() -> None:
    s = PrefixSummary()
    h = _hashes(5)
    s.store(h)
    s.offload(h[3:])  # the worker's two deepest blocks left the device for host memory
    assert (s.match(h), s.match_tiers(h)) == (3, (3, 2))
    assert (s.num_confirmed, s.num_host, len(s)) == (3, 2, 5)
    s.offload(h[1:3])
    assert s.match_tiers(h) == (1, 4)
    s.load(h[1:2])  # a prompt over block 1 reloaded it
    assert s.match_tiers(h) == (2, 3) and s.num_host == 3
    s.remove(h[4:])  # gone from every tier
    assert s.match_tiers(h) == (2, 2) and len(s) == 4
    s.store(h[2:3])  # prefilled again: on the device, no longer host-only
    assert s.match_tiers(h) == (3, 1) and (s.num_confirmed, s.num_host) == (3, 1)
    s.clear()
    assert s.match_tiers(h) == (0, 0) and len(s) == 0


def test_match_tiers_counts_host_blocks_only_right_after_the_device_ones() -> None:
    s = PrefixSummary()
    h = _hashes(6)
    s.store(h[:2])
    s.offload(h[3:5])  # block 2 is missing: blocks 3-4 do not continue the prompt
    assert s.match_tiers(h) == (2, 0)
    assert s.match_tiers(h[3:]) == (0, 2)  # a prompt starting in host memory
    assert s.match_tiers([]) == (0, 0)
    assert s.match_tiers(_hashes(2, first=1)) == (0, 0)


def test_tentative_entries_count_as_device_before_host_blocks() -> None:
    clock = FakeClock()
    s = PrefixSummary(clock)
    h = _hashes(4)
    s.store(h[:1])
    s.offload(h[2:])
    s.add_tentative(h[:2], ttl=5.0)  # routed: block 1 is on its way to the device
    assert s.match_tiers(h) == (2, 2)
    clock.now += 5.0  # expired: block 1 is a miss and the host blocks after it do not count
    assert s.match_tiers(h) == (1, 0)


def test_reset_takes_a_snapshots_tiers() -> None:
    s = PrefixSummary()
    h = _hashes(4)
    s.store(_hashes(2, first=900))
    s.offload(_hashes(2, first=900))
    s.reset(epoch=3, sequence=9, hashes=h[:2], host=h[2:])
    assert (s.epoch, s.sequence, s.match_tiers(h), s.num_host) == (3, 9, (2, 2), 2)
    s.reset(epoch=4, sequence=1, hashes=())
    assert s.match_tiers(h) == (0, 0) and len(s) == 0


def test_budget_counts_host_blocks_and_forgets_them_before_device_ones() -> None:
    index = SummaryIndex(budget_bytes=4 * BYTES_PER_BLOCK)
    a, b = index.add("a"), index.add("b")
    ha, hb = _hashes(4, first=0), _hashes(2, first=1000)
    a.store(ha)
    a.offload(ha[2:])
    b.store(hb)
    b.offload(hb[1:])
    assert index.nbytes == 6 * BYTES_PER_BLOCK
    index.enforce_budget()
    # a, the fullest by two blocks, drops two: its host-only ones, its device ones kept.
    assert index.nbytes == 4 * BYTES_PER_BLOCK and index.forgotten_blocks == 2
    assert index.match_tiers(ha) == {"a": (2, 0), "b": (0, 0)}
    assert index.match_tiers(hb) == {"a": (0, 0), "b": (1, 1)}
    assert (a.num_confirmed, a.num_host) == (2, 0)
    # b grows to 3 blocks: it drops its oldest host-only block (its prompt's block 1).
    b.offload(_hashes(1, first=2000))
    index.enforce_budget()
    assert index.forgotten_blocks == 3
    assert (b.num_confirmed, b.num_host, b.match_tiers(hb)) == (1, 1, (1, 0))
    assert a.match_tiers(ha) == (2, 0)


def test_index_match_tiers_per_worker() -> None:
    index = SummaryIndex(budget_bytes=1 << 20)
    a, b, c = index.add("a"), index.add("b"), index.add("c")
    h = _hashes(4)
    a.store(h)
    b.store(h)
    b.offload(h[1:])
    c.store(h)
    c.offload(h)  # c holds the whole prompt in host memory only
    assert index.match_tiers(h) == {"a": (4, 0), "b": (1, 3), "c": (0, 4)}
    assert index.match(h) == {"a": 4, "b": 1, "c": 0}
    assert index.match_tiers([]) == {"a": (0, 0), "b": (0, 0), "c": (0, 0)}


def test_pool_applies_offloaded_and_loaded_events_and_reads_tiered_snapshots() -> None:
    import asyncio

    from radixmesh.router.config import RouterConfig
    from radixmesh.router.pool import WorkerPool, snapshot_blocks, snapshot_tiers
    from radixmesh.v1 import worker_pb2

    h = _hashes(5)

    def event(
        seq: int, kind: worker_pb2.CacheEventKind, hashes: list[int]
    ) -> worker_pb2.CacheEvent:
        return worker_pb2.CacheEvent(epoch=1, sequence=seq, kind=kind, block_hashes=hashes)

    async def run() -> list[tuple[int, int]]:
        pool = WorkerPool(RouterConfig(workers=("127.0.0.1:1",)))
        s = pool.workers["worker-0"].summary
        apply = pool.workers["worker-0"].apply
        seen = []
        apply(event(1, worker_pb2.CACHE_EVENT_KIND_STORED, h))
        apply(event(2, worker_pb2.CACHE_EVENT_KIND_OFFLOADED, h[2:]))
        seen.append(s.match_tiers(h))
        apply(event(3, worker_pb2.CACHE_EVENT_KIND_LOADED, h[2:3]))
        seen.append(s.match_tiers(h))
        apply(event(4, worker_pb2.CACHE_EVENT_KIND_REMOVED, h[4:]))
        seen.append(s.match_tiers(h))
        apply(event(5, worker_pb2.CACHE_EVENT_KIND_CLEARED, []))
        seen.append(s.match_tiers(h))
        seen.append((s.sequence, len(s)))
        await pool.close()
        return seen

    assert asyncio.run(run()) == [(2, 3), (3, 2), (3, 1), (0, 0), (5, 0)]
    # A snapshot: device nodes as stored events, host-only ones as offloaded (parents first).
    snap = [
        event(0, worker_pb2.CACHE_EVENT_KIND_STORED, h[:2]),
        event(0, worker_pb2.CACHE_EVENT_KIND_OFFLOADED, h[2:4]),
        event(0, worker_pb2.CACHE_EVENT_KIND_OFFLOADED, _hashes(1, first=900)),
    ]
    assert snapshot_tiers(snap) == (set(h[:2]), {*h[2:4], *_hashes(1, first=900)})
    assert snapshot_blocks(snap) == set(h[:2])
    # Replayed as a stream instead, loaded and removed events move and drop blocks.
    later = [
        event(0, worker_pb2.CACHE_EVENT_KIND_LOADED, h[2:3]),
        event(0, worker_pb2.CACHE_EVENT_KIND_REMOVED, h[3:4]),
    ]
    assert snapshot_tiers(snap + later) == (set(h[:3]), set(_hashes(1, first=900)))
