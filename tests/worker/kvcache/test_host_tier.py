"""The radix tree over two tiers: offload on device eviction, matches that continue in host
memory, reloads with the same bytes, adoption on insert, host-memory LRU, accounting."""

from __future__ import annotations

import pytest
import torch

from radixmesh.worker.kvcache.allocator import KVAllocator
from radixmesh.worker.kvcache.events import CacheEvent, replay_tiers
from radixmesh.worker.kvcache.fp8_kv import FP8
from radixmesh.worker.kvcache.host_copy import copy_kv
from radixmesh.worker.kvcache.host_copy_kernel import copy_rows
from radixmesh.worker.kvcache.host_pool import HostKVPool
from radixmesh.worker.kvcache.host_tier import HostTier
from radixmesh.worker.kvcache.pool import KVPool
from radixmesh.worker.kvcache.radix_cache import RadixCache

LAYERS, HEADS, DIM = 2, 2, 4


def make(
    device_slots: int = 17, host_slots: int = 33, dtype: torch.dtype = torch.float32
) -> tuple[KVPool, RadixCache, list[CacheEvent]]:
    pool = KVPool(
        num_slots=device_slots,
        num_layers=LAYERS,
        num_kv_heads=HEADS,
        head_dim=DIM,
        dtype=dtype,
        device="cpu",
    )
    tier = HostTier(pool, host_slots, page_size=1)
    cache = RadixCache(KVAllocator(device_slots), 1, event_block_size=1, host_tier=tier)
    events: list[CacheEvent] = []
    cache.add_listener(events.append)
    return pool, cache, events


def kv_of(tokens: list[int]) -> torch.Tensor:
    """A token's stand-in KV [layers, 2, heads, dim]: a function of its whole prefix."""
    seed = hash(tuple(tokens)) % (1 << 20)
    return torch.arange(LAYERS * 2 * HEADS * DIM, dtype=torch.float32).view(
        LAYERS, 2, HEADS, DIM
    ) + float(seed)


def compute(pool: KVPool, cache: RadixCache, tokens: list[int]) -> None:
    """A request that prefilled `tokens` from scratch and finished: its KV into the tree."""
    slots = cache.allocator.alloc(len(tokens))
    if slots is None:
        cache.evict(len(tokens))
        slots = cache.allocator.alloc(len(tokens))
    assert slots is not None
    write(pool, tokens, slots)
    cache.cache_finished(tokens, slots, cache.root)


def write(pool: KVPool, tokens: list[int], slots: torch.Tensor) -> None:
    for i, s in enumerate(slots.tolist()):
        kv = kv_of(tokens[: i + 1])
        for layer in range(LAYERS):
            pool.k_buffers[layer][s] = kv[layer, 0]
            pool.v_buffers[layer][s] = kv[layer, 1]


def assert_kv(pool: KVPool, tokens: list[int], slots: torch.Tensor) -> None:
    for i, s in enumerate(slots.tolist()):
        kv = kv_of(tokens[: i + 1])
        for layer in range(LAYERS):
            assert torch.equal(pool.k_buffers[layer][s], kv[layer, 0]), (i, layer)
            assert torch.equal(pool.v_buffers[layer][s], kv[layer, 1]), (i, layer)


class Copying:
    """A reload's stand-in for a CUDA event: done when the test says so."""

    def __init__(self) -> None:
        self.done = False


class DeferredTier(HostTier):
    """The CUDA path's timing on the CPU: a reload's (or a write-through's) bytes land at
    once, but the tree hears it is done only when the test says so (or someone waits)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.copying: list[Copying] = []

    def load(self, host_slots: torch.Tensor, device_slots: torch.Tensor) -> Copying:  # type: ignore[override]
        self._copy(device_slots, host_slots, to_host=False)
        self.copying.append(Copying())
        return self.copying[-1]

    def write_async(self, device_slots: torch.Tensor, host_slots: torch.Tensor) -> Copying:  # type: ignore[override]
        self._copy(device_slots, host_slots, to_host=True)
        self.copying.append(Copying())
        return self.copying[-1]

    def order_after(self, done: Copying) -> None:  # type: ignore[override]
        pass  # the bytes landed already

    def finished(self, done: Copying, wait: bool = False) -> bool:  # type: ignore[override]
        if wait:
            done.done = True
        return done.done


A = [1, 2, 3, 4, 5, 6, 7, 8]
B = [9, 10, 11, 12, 13, 14, 15, 16]


def test_eviction_offloads_and_a_match_continues_in_host_memory() -> None:
    pool, cache, events = make()
    compute(pool, cache, A)
    compute(pool, cache, B)  # 16 slots: the device pool is full
    assert cache.evict(8) == 8  # A is the least recently used
    st = cache.stats()
    assert (st.total_size, st.host_size, st.host_only_size, st.offloaded_tokens_total) == (
        8,
        8,
        8,
        8,
    )
    assert [e.kind for e in events][-1] == "offloaded"
    m = cache.match_prefix([*A, 99])
    assert m.slots.numel() == 0 and m.last_node is cache.root
    assert m.host_tokens == 8 and [n.key for n in m.host_nodes] == [A]
    assert cache.tier is not None and cache.tier.stats().tokens_written == 8


def test_load_host_brings_back_the_same_kv() -> None:
    pool, cache, events = make()
    compute(pool, cache, A)
    compute(pool, cache, B)
    cache.evict(16)  # both offloaded
    for layer in range(LAYERS):  # the device pool forgets everything
        pool.k_buffers[layer].zero_()
        pool.v_buffers[layer].zero_()
    m = cache.match_prefix(A[:5])  # ends inside A's node: split there
    assert m.host_tokens == 5
    loaded = cache.load_host(m)
    assert loaded.host_nodes == () and loaded.slots.numel() == 5
    assert_kv(pool, A, loaded.slots)
    assert events[-1].kind == "loaded" and events[-1].num_tokens == 5
    st = cache.stats()
    assert (st.total_size, st.host_size, st.host_only_size, st.loaded_tokens_total) == (
        5,
        16,
        11,
        5,
    )
    # The rest of A is still in host memory, below the loaded part.
    m2 = cache.match_prefix(A)
    assert m2.slots.tolist() == loaded.slots.tolist() and m2.host_tokens == 3


def test_reloaded_node_evicts_again_without_a_copy() -> None:
    pool, cache, _ = make()
    compute(pool, cache, A)
    cache.evict(8)
    cache.load_host(cache.match_prefix(A))
    assert cache.tier is not None
    written = cache.tier.stats().tokens_written
    cache.evict(8)  # it still has its host copy
    assert cache.tier.stats().tokens_written == written
    assert cache.stats().host_only_size == 8


def test_insert_adopts_the_callers_slots_for_host_only_nodes() -> None:
    pool, cache, events = make()
    compute(pool, cache, A)
    cache.evict(8)
    # A request that computed A again (it did not reload) finishes: its slots become A's.
    slots = cache.allocator.alloc(10)
    assert slots is not None
    write(pool, [*A, 20, 21], slots)
    cache.cache_finished([*A, 20, 21], slots, cache.root)
    m = cache.match_prefix([*A, 20, 21])
    assert m.slots.tolist() == slots.tolist() and m.host_nodes == ()
    assert cache.allocator.num_free_slots == cache.allocator.num_usable_slots - 10
    assert "loaded" in [e.kind for e in events]
    st = cache.stats()
    assert (st.total_size, st.host_size, st.host_only_size) == (10, 8, 0)


def test_host_pool_full_drops_least_recently_used() -> None:
    pool, cache, _ = make(device_slots=17, host_slots=17)  # 16 usable host slots
    C = [30, 31, 32, 33, 34, 35, 36, 37]
    compute(pool, cache, A)
    compute(pool, cache, B)
    cache.evict(16)  # A and B to the host pool: full
    compute(pool, cache, C)
    cache.match_prefix(B)  # B used more recently than A
    cache.evict(8)  # C needs host room: A goes
    assert cache.match_prefix(A).host_tokens == 0
    assert cache.match_prefix(B).host_tokens == 8
    assert cache.match_prefix(C).host_tokens == 8
    assert cache.tier is not None and cache.tier.allocator.num_free_slots == 0


def test_host_lru_then_removal_when_a_node_cannot_fit() -> None:
    pool, cache, events = make(device_slots=17, host_slots=5)  # 4 usable host slots
    compute(pool, cache, A)
    compute(pool, cache, [*A[:6], 50, 51])  # [1..6] with children [7, 8] and [50, 51]
    cache.evict(2)  # [7, 8] (older) -> host
    cache.evict(2)  # [50, 51] -> host: full
    assert cache.stats().host_only_size == 4
    # [1..6] needs 6 host slots: host LRU drops both tails, 4 slots are still too few, so
    # it leaves the tree as it would without a tier.
    cache.evict(6)
    st = cache.stats()
    assert (st.total_size, st.host_size, st.num_nodes) == (0, 0, 0)
    assert cache.allocator.num_free_slots == cache.allocator.num_usable_slots
    assert cache.tier is not None and cache.tier.allocator.num_free_slots == 4
    assert replay_tiers(events, set(), set()) == (set(), set())
    assert events[-1].kind == "removed"


def test_reset_frees_both_tiers_and_snapshot_names_tiers() -> None:
    pool, cache, _ = make()
    compute(pool, cache, A)
    compute(pool, cache, B)
    cache.evict(8)
    kinds = sorted(e.kind for e in cache.snapshot())
    assert kinds == ["offloaded", "stored"]
    cache.reset()
    assert cache.allocator.num_free_slots == cache.allocator.num_usable_slots
    assert cache.tier is not None
    assert cache.tier.allocator.num_free_slots == cache.tier.allocator.num_usable_slots
    assert cache.stats().host_size == 0


def test_locked_path_is_not_offloaded_and_a_lock_on_host_node_is_refused() -> None:
    pool, cache, _ = make()
    compute(pool, cache, A)
    m = cache.match_prefix(A)
    cache.inc_lock_ref(m.last_node)
    assert cache.evict(8) == 0
    cache.dec_lock_ref(m.last_node)
    cache.evict(8)
    with pytest.raises(RuntimeError, match="evicted"):
        cache.inc_lock_ref(m.last_node)


def test_fp8_pool_keeps_fp8_bytes_and_scales_in_host_memory() -> None:
    pool = KVPool(num_slots=9, num_layers=2, num_kv_heads=2, head_dim=4, dtype=FP8, device="cpu")
    gen = torch.Generator().manual_seed(0)
    for layer in range(2):
        pool.set_kv(
            layer,
            torch.arange(1, 9),
            torch.randn(8, 2, 4, generator=gen) * 50,
            torch.randn(8, 2, 4, generator=gen),
        )
    host = HostKVPool(pool, 9, pin=False)
    assert host.data.dtype == FP8 and host.scales is not None
    copy_kv(pool, host, torch.arange(1, 9), torch.arange(8, 0, -1), to_host=True)
    back = KVPool(num_slots=9, num_layers=2, num_kv_heads=2, head_dim=4, dtype=FP8, device="cpu")
    copy_kv(back, host, torch.arange(1, 9), torch.arange(8, 0, -1), to_host=False)
    for layer in range(2):
        for a, b in ((pool.k_buffers, back.k_buffers), (pool.v_buffers, back.v_buffers)):
            assert torch.equal(a[layer].view(torch.uint8), b[layer].view(torch.uint8))
        assert torch.equal(pool.k_scales[layer], back.k_scales[layer])
        assert torch.equal(pool.v_scales[layer], back.v_scales[layer])


@pytest.mark.parametrize(("dtype", "programs"), [(torch.bfloat16, 0), (torch.float32, 5)])
def test_copy_kernel_matches_torch_copy(dtype: torch.dtype, programs: int) -> None:
    """The CUDA path's kernel (through TRITON_INTERPRET=1 on the CPU) against torch indexing."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    pool = KVPool(
        num_slots=32, num_layers=3, num_kv_heads=2, head_dim=8, dtype=dtype, device=device
    )
    gen = torch.Generator().manual_seed(1)
    for b in (*pool.k_buffers, *pool.v_buffers):
        b.copy_(torch.randn(b.shape, generator=gen).to(dtype))
    dev, hs = torch.tensor([5, 9, 2, 31]), torch.tensor([3, 1, 7, 15])
    want = HostKVPool(pool, 16, pin=False)
    want.data.zero_()
    copy_kv(pool, want, dev, hs, to_host=True)  # the torch path (not pinned)
    got = HostKVPool(pool, 16, pin=torch.cuda.is_available())
    got.data.zero_()
    ptrs = [t.data_ptr() for pair in zip(pool.k_buffers, pool.v_buffers, strict=True) for t in pair]
    as_int = {2: torch.int16, 4: torch.int32}[got.data.element_size()]
    table = torch.tensor(ptrs, device=device)
    copy_rows(
        table, got.data.view(as_int), dev.to(device), hs.to(device), 6, 16, True, as_int, programs
    )
    if device == "cuda":
        torch.cuda.synchronize()
    assert torch.equal(got.data.view(as_int), want.data.view(as_int))
    back = KVPool(
        num_slots=32, num_layers=3, num_kv_heads=2, head_dim=8, dtype=dtype, device=device
    )
    ptrs = [t.data_ptr() for pair in zip(back.k_buffers, back.v_buffers, strict=True) for t in pair]
    table = torch.tensor(ptrs, device=device)
    copy_rows(
        table, got.data.view(as_int), dev.to(device), hs.to(device), 6, 16, False, as_int, programs
    )
    for layer in range(3):
        assert torch.equal(
            back.k_buffers[layer][dev.to(device)], pool.k_buffers[layer][dev.to(device)]
        )
        assert torch.equal(
            back.v_buffers[layer][dev.to(device)], pool.v_buffers[layer][dev.to(device)]
        )


def test_copy_checks_lengths() -> None:
    pool, _, _ = make()
    host = HostKVPool(pool, 4, pin=False)
    with pytest.raises(ValueError, match="host_slots"):
        copy_kv(pool, host, torch.tensor([1, 2]), torch.tensor([1]), to_host=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, FP8])
def test_cuda_tier_round_trip_through_pinned_memory(dtype: torch.dtype) -> None:
    """On CUDA the tier's copies run the kernel over pinned host rows (scales included):
    a node offloaded, the device pool wiped, reloaded to other slots: the same bytes."""
    pool = KVPool(
        num_slots=64, num_layers=2, num_kv_heads=2, head_dim=64, dtype=dtype, device="cuda"
    )
    gen = torch.Generator(device="cuda").manual_seed(0)
    src = torch.arange(1, 41, device="cuda")
    for layer in range(2):
        pool.set_kv(
            layer,
            src,
            torch.randn(40, 2, 64, device="cuda", generator=gen) * 30,
            torch.randn(40, 2, 64, device="cuda", generator=gen),
        )
    tier = HostTier(pool, 65, page_size=1)
    assert tier.host.pinned and tier.host.data.is_pinned()
    host = tier.alloc(40)
    assert host is not None
    tier.write(src, host)
    want = [(pool.k_buffers[i][src].clone(), pool.v_buffers[i][src].clone()) for i in range(2)]
    scales = [s[src].clone() for s in (*pool.k_scales, *pool.v_scales)]
    for b in (*pool.k_buffers, *pool.v_buffers):
        b.view(torch.uint8).zero_()
    for s in (*pool.k_scales, *pool.v_scales):
        s.zero_()
    dst = torch.arange(63, 23, -1, device="cuda")
    tier.load(host, dst)
    torch.cuda.synchronize()
    for i in range(2):
        assert torch.equal(pool.k_buffers[i][dst].view(torch.uint8), want[i][0].view(torch.uint8))
        assert torch.equal(pool.v_buffers[i][dst].view(torch.uint8), want[i][1].view(torch.uint8))
    got = [s[dst] for s in (*pool.k_scales, *pool.v_scales)]
    assert all(torch.equal(a, b) for a, b in zip(got, scales, strict=True))
    st = tier.stats()
    assert st.tokens_written == st.tokens_loaded == 40
    assert st.load_seconds > 0 and st.bytes_timed_loaded == 40 * tier.bytes_per_token


def test_deferred_reload_stays_locked_and_unmatched_until_it_lands() -> None:
    """CUDA's timing: a reload copies beside the forwards; until it is done its nodes are
    locked, and matches stop before them (pending), then they are ordinary device nodes."""
    pool, _, _ = make()
    tier = DeferredTier(pool, 33, page_size=1)
    cache = RadixCache(KVAllocator(17), 1, event_block_size=1, host_tier=tier)
    compute(pool, cache, A)
    cache.evict(8)
    m = cache.load_host(cache.match_prefix(A))
    assert m.pending and m.slots.numel() == 0 and m.last_node is cache.root
    assert cache.protected_size() == 8 and cache.evict(8) == 0
    later = cache.match_prefix([*A[:3], 40])  # splits the loading node: its top joins the load
    assert later.pending and later.last_node is cache.root
    assert cache.poll_loads() == 1
    tier.copying[0].done = True
    assert cache.poll_loads() == 0
    hit = cache.match_prefix(A)
    assert not hit.pending and hit.slots.numel() == 8 and cache.protected_size() == 0
    assert_kv(pool, A, hit.slots)
    assert all(n.host_ref == 0 and not n.loading for n in cache._iter_nodes())


def test_host_pool_drops_copies_of_device_nodes_before_host_only_ones() -> None:
    """A host copy of a node still on the device goes first, however recent: dropping it
    loses nothing, dropping a host-only node loses its KV."""
    pool, cache, _ = make(device_slots=25, host_slots=17)  # 16 usable host slots
    C = [30, 31, 32, 33, 34, 35, 36, 37]
    compute(pool, cache, A)
    cache.evict(8)  # A: host-only, the oldest
    compute(pool, cache, B)
    cache.load_host(cache.match_prefix(A))  # A back on the device (both); B device-only
    cache.evict(8)  # B (older than A's reload) -> host: full (A's copy + B)
    assert cache.match_prefix(B).host_tokens == 8
    compute(pool, cache, C)
    cache.match_prefix(A)  # A used last: C is the device's LRU leaf
    cache.evict(8)  # C -> host: A's copy is dropped (A is on the device), not B
    assert cache.match_prefix(B).host_tokens == 8 and cache.match_prefix(C).host_tokens == 8
    a = cache.match_prefix(A)
    assert a.slots.numel() == 8 and a.last_node.host_value is None
