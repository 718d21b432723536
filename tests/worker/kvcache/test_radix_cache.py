from __future__ import annotations

import pytest
import torch

from radixmesh.prefix import block_hashes
from radixmesh.worker.kvcache import node_hashes as node_hashes_module
from radixmesh.worker.kvcache.allocator import KVAllocator
from radixmesh.worker.kvcache.events import CacheEvent, replay
from radixmesh.worker.kvcache.radix_cache import RadixCache


# ---- factories ----------------------------------------------------------------------------
def make(
    num_slots: int = 64, page_size: int = 1, *, block: int = 4, disable: bool = False
) -> tuple[KVAllocator, RadixCache]:
    alloc = KVAllocator(num_slots, page_size)
    return alloc, RadixCache(alloc, page_size, disable=disable, event_block_size=block)


def alloc_n(alloc: KVAllocator, n: int) -> torch.Tensor:
    slots = alloc.alloc(n)
    assert slots is not None
    return slots


def put(cache: RadixCache, key: list[int]) -> torch.Tensor:
    """Insert `key` with fresh slots as a raw caller must: free what the tree did not take."""
    slots = alloc_n(cache.allocator, len(key))
    present = cache.insert(key, slots)
    cache.allocator.free(slots[:present])
    return slots


def is_free(alloc: KVAllocator, *slots: int) -> list[bool]:
    return alloc.free_slot_mask(torch.tensor(slots)).tolist()


def path_block_hashes(cache: RadixCache) -> set[int]:
    """Reference: the block hashes of every root path, hashed from scratch."""
    out: set[int] = set()
    stack = [(c, list[int]()) for c in cache.root.children.values()]
    while stack:
        node, prefix = stack.pop()
        path = prefix + node.key
        out.update(block_hashes(path, cache.event_block_size))
        stack.extend((c, path) for c in node.children.values())
    return out


# ---- match / insert -----------------------------------------------------------------------
def test_match_and_insert_exact_slots_with_splits() -> None:
    alloc, cache = make()
    assert put(cache, [1, 2, 3, 4, 5]).tolist() == [1, 2, 3, 4, 5]
    second = alloc_n(alloc, 5)
    assert second.tolist() == [6, 7, 8, 9, 10]
    assert cache.insert([1, 2, 3, 9, 9], second) == 3
    alloc.free(second[:3])
    assert (cache.num_nodes(), cache.total_size(), cache.evictable_size()) == (3, 7, 7)

    m = cache.match_prefix([1, 2, 3, 4, 5, 6])
    assert m.slots.tolist() == [1, 2, 3, 4, 5] and m.last_node.end == 5
    m = cache.match_prefix([1, 2, 3, 9])  # ends inside [9, 9]: split
    assert m.slots.tolist() == [1, 2, 3, 9] and m.last_node.end == 4
    assert cache.num_nodes() == 4
    m = cache.match_prefix([7, 1])
    assert m.slots.tolist() == [] and m.last_node is cache.root
    m = cache.match_prefix(torch.tensor([1, 2]))  # type: ignore[arg-type]
    assert m.slots.tolist() == [1, 2] and m.last_node.end == 2
    assert (cache.num_nodes(), cache.total_size()) == (5, 7)

    stats = cache.stats()
    assert (stats.queried_tokens_total, stats.matched_tokens_total) == (14, 11)
    assert stats.hit_rate == pytest.approx(11 / 14)
    cache.match_prefix([1, 2, 3], count_stats=False)
    assert cache.stats().queried_tokens_total == 14


def test_insert_of_present_key_returns_its_length_and_takes_nothing() -> None:
    alloc, cache = make()
    put(cache, [1, 2, 3, 4])
    dup = alloc_n(alloc, 2)
    assert cache.insert([1, 2], dup) == 2
    assert cache.total_size() == 4 and cache.num_nodes() == 2  # split at 2, nothing added
    alloc.free(dup)


def test_insert_validates_lengths() -> None:
    alloc, cache = make(page_size=4)
    with pytest.raises(ValueError, match="slots"):
        cache.insert([1, 2, 3, 4], alloc_n(alloc, 8))
    with pytest.raises(ValueError, match="page_size"):
        cache.insert([1, 2, 3, 4, 5, 6], alloc_n(alloc, 6))


def test_page4_alignment() -> None:
    alloc, cache = make(page_size=4)
    assert put(cache, [1, 2, 3, 4, 5, 6, 7, 8]).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    m = cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 99, 100])  # diverges inside page 2
    assert m.slots.tolist() == [4, 5, 6, 7] and m.last_node.end == 4
    assert cache.num_nodes() == 2
    assert cache.match_prefix([1, 2, 3]).slots.tolist() == []  # less than a page

    second = alloc_n(alloc, 8)
    assert second.tolist() == list(range(12, 20))
    assert cache.insert([1, 2, 3, 4, 9, 9, 9, 9], second) == 4
    alloc.free(second[:4])
    m = cache.match_prefix([1, 2, 3, 4, 9, 9, 9, 9, 9])
    assert m.slots.tolist() == [4, 5, 6, 7, 16, 17, 18, 19]
    assert cache.num_nodes() == 3
    assert all(len(n.key) % 4 == 0 for n in cache._iter_nodes())


def test_page4_mismatch_in_first_page_matches_nothing() -> None:
    _, cache = make(page_size=4)
    put(cache, [1, 2, 3, 4])
    m = cache.match_prefix([1, 2, 3, 5])
    assert m.slots.tolist() == [] and m.last_node is cache.root
    assert cache.num_nodes() == 1


# ---- locking ------------------------------------------------------------------------------
def test_lock_accounting() -> None:
    _, cache = make()
    put(cache, [1, 2, 3, 4, 5])
    put(cache, [1, 2, 3, 9, 9])
    m1 = cache.match_prefix([1, 2, 3, 4, 5])
    cache.inc_lock_ref(m1.last_node)
    assert (cache.protected_size(), cache.evictable_size()) == (5, 2)
    m2 = cache.match_prefix([1, 2, 3, 9, 9])
    cache.inc_lock_ref(m2.last_node)
    assert (cache.protected_size(), cache.evictable_size()) == (7, 0)
    cache.dec_lock_ref(m1.last_node)
    assert (cache.protected_size(), cache.evictable_size()) == (5, 2)
    cache.dec_lock_ref(m2.last_node)
    assert (cache.protected_size(), cache.evictable_size()) == (0, 7)
    with pytest.raises(RuntimeError, match="not locked"):
        cache.dec_lock_ref(m2.last_node)


def test_split_under_a_lock_keeps_accounting_exact() -> None:
    _, cache = make()
    put(cache, [1, 2, 3, 4, 5])
    m = cache.match_prefix([1, 2, 3, 4, 5])
    cache.inc_lock_ref(m.last_node)
    assert cache.match_prefix([1, 2, 3]).last_node.end == 3  # splits the locked node
    assert (cache.protected_size(), cache.evictable_size(), cache.num_nodes()) == (5, 0, 2)
    cache.dec_lock_ref(m.last_node)  # the handle still ends at 5 and unlocks both parts
    assert (cache.protected_size(), cache.evictable_size()) == (0, 5)
    assert m.last_node.end == 5


# ---- eviction -----------------------------------------------------------------------------
def test_lru_eviction_order_and_freed_slots() -> None:
    alloc, cache = make()
    assert put(cache, [1, 1, 1]).tolist() == [1, 2, 3]  # A
    assert put(cache, [2, 2]).tolist() == [4, 5]  # B
    assert put(cache, [3, 3, 3, 3]).tolist() == [6, 7, 8, 9]  # C
    assert put(cache, [1, 1, 2, 2]).tolist() == [10, 11, 12, 13]  # D: [1,1] shared with A
    cache.match_prefix([2, 2])  # touch B
    # Leaves, oldest first: A's tail [1] (slot 3), C, D's tail [2, 2], B.
    assert cache.evict(1) == 1
    assert is_free(alloc, 3, 1, 2) == [True, False, False]
    assert cache.evict(3) == 4  # C is one node: all 4 go
    assert is_free(alloc, 6, 7, 8, 9) == [True] * 4
    assert cache.evict(2) == 2  # D's tail; its parent [1, 1] becomes a leaf
    assert is_free(alloc, 12, 13, 1) == [True, True, False]
    assert cache.evict(1) == 2  # [1, 1] (touched by D's insert) is older than B
    assert is_free(alloc, 1, 2, 4, 5) == [True, True, False, False]
    assert cache.match_prefix([2, 2]).slots.tolist() == [4, 5]
    assert (cache.total_size(), cache.num_nodes()) == (2, 1)
    assert cache.stats().evicted_tokens_total == 9
    assert alloc.num_free_slots == alloc.num_usable_slots - 2


def test_locked_nodes_and_their_ancestors_are_not_evicted() -> None:
    alloc, cache = make()
    put(cache, [1, 2, 3, 4, 5])
    put(cache, [1, 2, 3, 9, 9])
    put(cache, [7, 7])
    m = cache.match_prefix([1, 2, 3, 4, 5])
    cache.inc_lock_ref(m.last_node)
    assert cache.evict(100) == 4  # [9, 9] and [7, 7]; [1,2,3] is a locked ancestor
    assert (cache.total_size(), cache.protected_size(), cache.evictable_size()) == (5, 5, 0)
    assert is_free(alloc, 1, 2, 3, 4, 5) == [False] * 5
    cache.dec_lock_ref(m.last_node)
    assert cache.evict(100) == 5
    assert alloc.num_free_slots == alloc.num_usable_slots


def test_evicted_node_cannot_be_locked() -> None:
    _, cache = make()
    put(cache, [1, 2])
    node = cache.match_prefix([1, 2]).last_node
    cache.evict(2)
    with pytest.raises(RuntimeError, match="evicted"):
        cache.inc_lock_ref(node)


# ---- request-level ownership --------------------------------------------------------------
def test_cache_finished_frees_duplicates_only() -> None:
    alloc, cache = make()
    put(cache, [1, 2])
    m2 = cache.match_prefix([1, 2, 3, 4, 5, 6])  # request R2 shares [1, 2]
    cache.inc_lock_ref(m2.last_node)
    r2 = torch.cat([m2.slots, alloc_n(alloc, 4)])
    assert r2.tolist() == [1, 2, 3, 4, 5, 6]
    m3 = cache.match_prefix([1, 2, 3, 4])  # R3 computes [3, 4] too, and finishes first
    cache.inc_lock_ref(m3.last_node)
    r3 = torch.cat([m3.slots, alloc_n(alloc, 2)])
    assert r3.tolist() == [1, 2, 7, 8]
    free_before = alloc.num_free_slots
    cache.cache_finished([1, 2, 3, 4], r3, m3.last_node)
    assert alloc.num_free_slots == free_before  # all kept: [1, 2] shared, [7, 8] new
    # R2's key is one longer than its slots: the last sampled token has no KV yet.
    cache.cache_finished([1, 2, 3, 4, 5, 6, 7], r2, m2.last_node)
    assert alloc.num_free_slots == free_before + 2  # slots 3, 4 duplicated the tree's 7, 8
    assert is_free(alloc, 3, 4, 5, 6) == [True, True, False, False]
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]).slots.tolist() == [1, 2, 7, 8, 5, 6]
    assert (cache.total_size(), cache.protected_size()) == (6, 0)


def test_cache_finished_inserts_below_the_locked_node() -> None:
    alloc, cache = make()
    put(cache, [1, 2, 3])
    put(cache, [5, 6])
    m = cache.match_prefix([1, 2, 3, 4])  # a request on [1, 2, 3] computes 4, then 9
    cache.inc_lock_ref(m.last_node)
    put(cache, [5, 6, 7])  # [5, 6] is now used later than [1, 2, 3]
    r = torch.cat([m.slots, alloc_n(alloc, 2)])
    cache.cache_finished([1, 2, 3, 4, 9], r, m.last_node)
    assert cache.match_prefix([1, 2, 3, 4, 9]).slots.tolist() == r.tolist()
    # The insert started at the locked [1, 2, 3] node: [4, 9] is its child, the newest
    # leaf, so eviction takes the [5, 6, 7] branch first.
    assert cache.evict(3) == 3
    assert cache.match_prefix([5, 6, 7]).slots.numel() == 0
    assert cache.match_prefix([1, 2, 3, 4, 9]).slots.numel() == 5
    assert (cache.total_size(), cache.protected_size()) == (5, 0)


def test_cache_finished_page4_frees_the_unaligned_tail() -> None:
    alloc, cache = make(page_size=4)
    slots = alloc_n(alloc, 6)
    assert slots.tolist() == [4, 5, 6, 7, 8, 9]
    cache.cache_finished([1, 2, 3, 4, 5, 6], slots, cache.root)
    assert alloc.num_free_pages == 14 and cache.total_size() == 4
    assert is_free(alloc, 8, 4) == [True, False]


def test_batched_frees_return_every_request_s_frees_at_the_end() -> None:
    alloc, cache = make(num_slots=32, page_size=4)
    a, b = alloc_n(alloc, 6), alloc_n(alloc, 5)  # pages 1-2 and 3-4: tails 8-9 and 16
    assert alloc.num_free_pages == 3
    with cache.batched_frees():
        cache.cache_finished([1, 2, 3, 4, 5, 6], a, cache.root)
        with cache.batched_frees():  # nested: joins the outer batch
            cache.cache_finished([7, 8, 9, 10, 11], b, cache.root)
        a[4:] = 0  # the caller's row is reused: what was deferred is a copy
        assert alloc.num_free_pages == 3 and is_free(alloc, 8, 16) == [False, False]
    assert alloc.num_free_pages == 5 and is_free(alloc, 8, 16, 4, 12) == [True, True, False, False]
    assert cache.total_size() == 8
    # A double free still raises, at the batch's end.
    with pytest.raises(RuntimeError, match="double free"), cache.batched_frees():
        cache.allocator.free(torch.tensor([20]))
        cache.cache_finished([1, 2, 3, 4, 5], torch.tensor([4, 5, 6, 7, 20]), cache.root)


def test_cache_unfinished_swaps_duplicates_and_moves_the_lock() -> None:
    alloc, cache = make()
    put(cache, [1, 2])
    m = cache.match_prefix([1, 2, 3, 4, 5])
    cache.inc_lock_ref(m.last_node)
    r = torch.cat([m.slots, alloc_n(alloc, 3)])
    assert r.tolist() == [1, 2, 3, 4, 5]
    other = cache.match_prefix([1, 2, 3, 4])
    cache.inc_lock_ref(other.last_node)
    cache.cache_finished([1, 2, 3, 4], torch.cat([other.slots, alloc_n(alloc, 2)]), other.last_node)
    assert (cache.protected_size(), cache.evictable_size()) == (2, 2)

    free_before = alloc.num_free_slots
    new_slots, node = cache.cache_unfinished([1, 2, 3, 4, 5], r, m.last_node)
    assert new_slots.tolist() == [1, 2, 6, 7, 5]
    assert node.end == 5
    assert alloc.num_free_slots == free_before + 2
    assert (cache.protected_size(), cache.evictable_size()) == (5, 0)
    cache.cache_finished([1, 2, 3, 4, 5], new_slots, node)
    assert alloc.num_free_slots == free_before + 2
    assert (cache.protected_size(), cache.evictable_size()) == (0, 5)


def test_cache_unfinished_page4_keeps_the_tail() -> None:
    alloc, cache = make(page_size=4)
    slots = alloc_n(alloc, 6)
    new_slots, node = cache.cache_unfinished([1, 2, 3, 4, 5, 6], slots, cache.root)
    assert new_slots.tolist() == [4, 5, 6, 7, 8, 9] and node.end == 4
    assert (cache.protected_size(), alloc.num_free_pages) == (4, 13)
    more = alloc.alloc(2, last_slot=9, num_existing=6)
    assert more is not None and more.tolist() == [10, 11]
    cache.cache_finished(list(range(1, 9)), torch.cat([new_slots, more]), node)
    assert (cache.total_size(), cache.protected_size(), alloc.num_free_pages) == (8, 0, 13)


@pytest.mark.parametrize("page_size", [1, 2])
@pytest.mark.parametrize("end", [None, 0, 1, 3, 4, 5, 6, 99])
def test_match_prefix_up_to_end_is_the_match_of_the_slice(page_size: int, end: int | None) -> None:
    key = [1, 2, 3, 4, 9, 9]
    got, want = make(page_size=page_size)[1], make(page_size=page_size)[1]
    for cache in (got, want):
        put(cache, [1, 2, 3, 4, 5, 6])
    a = got.match_prefix(key, end=end)
    b = want.match_prefix(key[:end])
    assert (a.slots.tolist(), a.last_node.end) == (b.slots.tolist(), b.last_node.end)
    assert got.stats() == want.stats()  # the same tokens queried and matched


def test_cache_unfinished_hands_back_the_callers_slots_when_the_tree_took_them_all() -> None:
    alloc, cache = make()
    m = cache.match_prefix([1, 2, 3])
    slots = alloc_n(alloc, 3)
    same, node = cache.cache_unfinished([1, 2, 3], slots, m.last_node)
    assert same is slots and same.tolist() == [1, 2, 3] and node.end == 3
    # Past a locked prefix: the request's own tokens were new, its slots are the tree's.
    cache.inc_lock_ref(node)
    more = torch.cat([slots, alloc_n(alloc, 2)])
    again, longer = cache.cache_unfinished([1, 2, 3, 4, 5, 9], more, node)
    assert again is more and longer.end == 5
    # Some of them cached meanwhile (an equal prompt shared first): a new tensor, the
    # tree's slots in it, the request's duplicates freed.
    put(cache, [7, 8, 9])
    own = alloc_n(alloc, 4)
    shared, _ = cache.cache_unfinished([7, 8, 9, 10, -1], own, cache.root)  # a longer key
    assert shared is not own and shared.tolist() == [6, 7, 8, own.tolist()[3]]
    assert is_free(alloc, *own.tolist()[:3]) == [True] * 3


# ---- disabled, reset ----------------------------------------------------------------------
def test_disabled_cache_shares_nothing_and_frees_everything() -> None:
    alloc, cache = make(num_slots=16, disable=True)
    assert cache.disabled
    m = cache.match_prefix([1, 2, 3])
    assert m.slots.tolist() == [] and m.last_node is cache.root
    cache.inc_lock_ref(m.last_node)
    slots = alloc_n(alloc, 3)
    same, node = cache.cache_unfinished([1, 2, 3], slots, m.last_node)
    assert same is slots and node is cache.root
    cache.cache_finished([1, 2, 3], slots, node)
    assert alloc.num_free_slots == 15 and cache.total_size() == 0
    with pytest.raises(RuntimeError, match="disabled"):
        cache.insert([1], alloc_n(alloc, 1))
    assert cache.evict(5) == 0


def test_reset_frees_everything_and_refuses_while_locked() -> None:
    alloc, cache = make()
    events: list[CacheEvent] = []
    cache.add_listener(events.append)
    put(cache, [1, 2, 3, 4, 5])
    put(cache, [1, 2, 7, 7])
    m = cache.match_prefix([1, 2, 7, 7])
    cache.inc_lock_ref(m.last_node)
    with pytest.raises(RuntimeError, match="locked"):
        cache.reset()
    cache.dec_lock_ref(m.last_node)
    at_root = cache.match_prefix([9])  # a request that matched nothing holds the root
    cache.inc_lock_ref(at_root.last_node)
    cache.reset()
    cache.dec_lock_ref(at_root.last_node)  # still the root: a no-op
    assert alloc.num_free_slots == alloc.num_usable_slots
    assert (cache.total_size(), cache.num_nodes(), cache.evictable_size()) == (0, 0, 0)
    assert cache.match_prefix([1, 2]).slots.tolist() == []
    assert events[-1] == CacheEvent("cleared", (), None, 7)
    assert replay(events, set()) == set()
    put(cache, [1, 2, 3, 4])  # usable again, and emits again
    assert events[-1].block_hashes == tuple(block_hashes([1, 2, 3, 4], 4))


# ---- cache events -------------------------------------------------------------------------
def test_events_for_inserts_splits_and_evictions() -> None:
    _, cache = make(block=4)
    events: list[CacheEvent] = []
    cache.add_listener(events.append)
    k1 = list(range(1, 11))
    k2 = [1, 2, 3, 4, 5, 6, 20, 21, 22, 23]
    k3 = [1, 2, 3, 4, 5, 6, 30]
    k4 = [1, 2, 40, 41, 42, 43, 44, 45]
    h1, h2, h4 = block_hashes(k1, 4), block_hashes(k2, 4), block_hashes(k4, 4)
    put(cache, k1)
    assert events == [CacheEvent("stored", (h1[0], h1[1]), None, 8)]
    put(cache, k2)  # split at 6 is silent; the new node [6, 10) holds block 1 (ends at 8)
    assert events[1:] == [CacheEvent("stored", (h2[1],), h2[0], 4)]
    assert h2[0] == h1[0]
    put(cache, k3)  # [6, 7) ends no block
    assert len(events) == 2
    put(cache, k4)  # split at 2 is silent; [2, 8) holds blocks 0 and 1
    assert events[2:] == [CacheEvent("stored", (h4[0], h4[1]), None, 8)]

    # Leaves by age: [6,10) of k1, [6,10) of k2, [6,7) of k3, [2,8) of k4.
    assert cache.evict(1) == 4
    assert events[3:] == [CacheEvent("removed", (h1[1],), h1[0], 4)]
    assert replay(events, set()) == path_block_hashes(cache)
    assert cache.evict(100) == 17  # 21 tokens in all, 4 gone
    assert events[4:] == [
        CacheEvent("removed", (h2[1],), h2[0], 4),
        # k3's leaf emits nothing; then [2, 6) (touched by k3) goes before k4's leaf
        CacheEvent("removed", (h1[0],), None, 4),
        CacheEvent("removed", (h4[0], h4[1]), None, 8),
    ]
    assert replay(events, set()) == set() == path_block_hashes(cache)


def test_no_listener_no_hashing_then_snapshot_for_a_late_listener(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, cache = make(block=4)

    def boom(*args: object, **kwargs: object) -> list[int]:
        raise AssertionError("hashed without a listener")

    with monkeypatch.context() as mp:
        mp.setattr(node_hashes_module, "block_hashes", boom)
        for key in ([1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 9, 9, 9], [1, 2, 7]):
            put(cache, key)
        cache.match_prefix([1, 2, 3])
        cache.evict(3)

    events: list[CacheEvent] = []
    cache.add_listener(events.append)
    summary = replay(cache.snapshot(), set())
    # Left: [1..5, 9, 9, 9] (2 blocks) and [1, 2, 7] (none); [6..9] was evicted.
    assert summary == path_block_hashes(cache) and len(summary) == 2
    put(cache, [1, 2, 3, 4, 5, 9, 9, 9, 8, 8, 8, 8])
    assert replay(events, summary) == path_block_hashes(cache)
    cache.evict(100)
    assert replay(events[1:], summary) == set()
    cache.remove_listener(events.append)
    put(cache, [5, 5, 5, 5])
    # One store, removals of the 3 nodes holding a block ([3,5), [5,8), [8,12)), then nothing.
    assert [e.kind for e in events] == ["stored", "removed", "removed", "removed"]


def test_event_block_size_must_be_a_multiple_of_page_size() -> None:
    alloc = KVAllocator(64, 4)
    with pytest.raises(ValueError, match="event_block_size"):
        RadixCache(alloc, 4, event_block_size=6)
    with pytest.raises(ValueError, match="page_size"):
        RadixCache(alloc, 2)


def test_pretty_lists_every_node() -> None:
    _, cache = make()
    put(cache, [1, 2, 3])
    put(cache, [1, 2, 4])
    text = cache.pretty()
    assert text.splitlines()[0].startswith("root (nodes=3")
    assert "[0,2) lock=0" in text and "[2,3) lock=0" in text


# ---- continuation (speculative decoding's radix drafter) -------------------------------------
def _shape(cache: RadixCache) -> list[tuple[int, int, int]]:
    """Every node's (start, end, last_access), in a fixed order."""
    out = []
    stack = [cache.root]
    while stack:
        node = stack.pop()
        out.append((node.start, node.end, node.last_access))
        stack.extend(node.children[k] for k in sorted(node.children, key=str))
    return out


def test_continuation_follows_the_tree_without_touching_it() -> None:
    _, cache = make()
    put(cache, [1, 2, 3, 4, 5, 6])
    put(cache, [1, 2, 3, 9, 9])  # splits at 3: [1 2 3] -> [4 5 6] | [9 9]
    cache.match_prefix([1, 2, 3, 4])  # [4 5 6] used last (and split at 4)
    before = _shape(cache)
    assert cache.continuation([1, 2], 3) == [3, 4, 5]  # mid-node, then the used branch
    assert cache.continuation([1, 2, 3], 2) == [4, 5]
    assert cache.continuation([1, 2, 3, 9], 4) == [9]  # the path ends: what there is
    assert cache.continuation([1, 2, 3, 4, 5, 6], 2) == []
    assert cache.continuation([1, 7], 2) == []  # not in the tree
    assert cache.continuation([1, 2, 3, 9, 9, 9], 2) == []
    assert cache.continuation([], 2) == [1, 2]
    assert _shape(cache) == before  # no split, no LRU touch
    cache.match_prefix([1, 2, 3, 9])
    assert cache.continuation([1, 2, 3], 3) == [9, 9]  # now the most recent branch


def test_continuation_from_a_start_node() -> None:
    _, cache = make()
    put(cache, [1, 2, 3, 4, 5, 6, 7])
    node = cache.match_prefix([1, 2, 3]).last_node  # ends at 3
    assert node.end == 3
    assert cache.continuation([1, 2, 3, 4], 2, node) == [5, 6]
    assert cache.continuation([8, 8, 8, 4], 2, node) == [5, 6]  # the start's path is trusted
    _, off = make(disable=True)
    assert off.continuation([1], 2) == []
