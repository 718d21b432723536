"""Random operation sequences against the radix tree over two tiers (a small device pool,
a smaller host pool): every device and host slot is accounted for, device nodes stay a
root-connected subtree, the event stream describes both tiers exactly, and the KV bytes
each node's slots hold (on the device or in host memory) are those of its token path."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from radixmesh.prefix import block_hashes
from radixmesh.worker.kvcache.allocator import KVAllocator
from radixmesh.worker.kvcache.events import CacheEvent, replay_tiers
from radixmesh.worker.kvcache.host_tier import HostTier
from radixmesh.worker.kvcache.pool import KVPool
from radixmesh.worker.kvcache.radix_cache import RadixCache
from radixmesh.worker.kvcache.tree_node import TreeNode
from tests.worker.kvcache.test_host_tier import DeferredTier

tokens_st = st.lists(st.integers(0, 1), min_size=0, max_size=8)
index_st = st.integers(0, 7)


def value_of(path: list[int]) -> float:
    """The stand-in KV of a path's last token: a function of the whole path."""
    v = 1.0
    for t in path:
        v = (v * 3.0 + t + 1.0) % 9973.0
    return v


@dataclass
class SimRequest:
    tokens: list[int]
    slots: torch.Tensor  # KV of tokens[: len(slots)]
    node: TreeNode


def _nodes(cache: RadixCache) -> list[tuple[TreeNode, list[int]]]:
    out: list[tuple[TreeNode, list[int]]] = []
    stack = [(c, list[int]()) for c in cache.root.children.values()]
    while stack:
        node, prefix = stack.pop()
        path = prefix + node.key
        out.append((node, path))
        stack.extend((c, path) for c in node.children.values())
    return out


class TierMachine(RuleBasedStateMachine):
    page_size = 1
    block = 2
    num_slots = 14
    host_slots = 11
    deferred = False
    write_through = False

    def __init__(self) -> None:
        super().__init__()
        self.pool = KVPool(
            num_slots=self.num_slots,
            num_layers=1,
            num_kv_heads=1,
            head_dim=1,
            dtype=torch.float32,
            device="cpu",
        )
        tier_cls = DeferredTier if self.deferred else HostTier
        self.tier = tier_cls(self.pool, self.host_slots, self.page_size)
        self.alloc = KVAllocator(self.num_slots, self.page_size)
        self.cache = RadixCache(
            self.alloc,
            self.page_size,
            event_block_size=self.block,
            host_tier=self.tier,
            write_through=self.write_through,
        )
        self.events: list[CacheEvent] = []
        self.cache.add_listener(self.events.append)
        self.reqs: list[SimRequest] = []

    def _write(self, tokens: list[int], start: int, slots: torch.Tensor) -> None:
        for i, s in enumerate(slots.tolist()):
            v = value_of(tokens[: start + i + 1])
            self.pool.k_buffers[0][s] = v
            self.pool.v_buffers[0][s] = -v

    def _alloc(self, n: int, last: int | None, existing: int) -> torch.Tensor | None:
        new = self.alloc.alloc(n, last_slot=last, num_existing=existing)
        if new is None:
            self.cache.evict(n + self.page_size)
            new = self.alloc.alloc(n, last_slot=last, num_existing=existing)
        return new

    @rule(prompt=st.lists(st.integers(0, 1), min_size=1, max_size=10), load=st.booleans())
    def start(self, prompt: list[int], load: bool) -> None:
        if len(self.reqs) >= 2:
            return
        m = self.cache.match_prefix(prompt)
        if load:
            m = self.cache.load_host(m)
        if m.pending:  # the scheduler leaves it waiting until its prefix has landed
            assert m.last_node.loading is False and not m.host_nodes
            return
        self.cache.inc_lock_ref(m.last_node)
        self.reqs.append(SimRequest(list(prompt), m.slots.clone(), m.last_node))

    @rule(i=index_st, n=st.integers(1, 5), generated=tokens_st)
    def compute(self, i: int, n: int, generated: list[int]) -> None:
        if not self.reqs:
            return
        r = self.reqs[i % len(self.reqs)]
        r.tokens += generated
        n = min(n, len(r.tokens) - len(r.slots))
        if n == 0:
            return
        last = int(r.slots[-1]) if len(r.slots) else None
        new = self._alloc(n, last, len(r.slots))
        if new is not None:
            self._write(r.tokens, len(r.slots), new)
            r.slots = torch.cat([r.slots, new])

    @rule(i=index_st)
    def share(self, i: int) -> None:
        if self.reqs:
            r = self.reqs[i % len(self.reqs)]
            r.slots, r.node = self.cache.cache_unfinished(r.tokens, r.slots, r.node)

    @rule(i=index_st)
    def finish(self, i: int) -> None:
        if self.reqs:
            r = self.reqs.pop(i % len(self.reqs))
            self.cache.cache_finished(r.tokens, r.slots, r.node)

    @rule(prompt=st.lists(st.integers(0, 1), min_size=1, max_size=8))
    def round_trip(self, prompt: list[int]) -> None:
        """A whole request, then everything unlocked off the device: later prompts that
        share its tokens find them in host memory."""
        if len(self.reqs) >= 2:
            return
        self.start(prompt, True)
        self.compute(len(self.reqs) - 1, len(prompt), [])
        self.finish(len(self.reqs) - 1)
        self.evict(self.cache.evictable_size())

    @rule(n=st.integers(0, 2))
    def land(self, n: int) -> None:
        """Reloads finish copying (the oldest n), and the tree hears of it."""
        if isinstance(self.tier, DeferredTier):
            for c in self.tier.copying[:n]:
                c.done = True
            self.tier.copying = self.tier.copying[n:]
        self.cache.poll_loads()

    @rule(n=st.integers(0, 25))
    def evict(self, n: int) -> None:
        before = self.cache.evictable_size()
        freed = self.cache.evict(n)
        assert self.cache.evictable_size() == before - freed

    # ---- invariants --------------------------------------------------------------------
    @invariant()
    def device_slots_accounted(self) -> None:
        ps = self.page_size
        nodes = _nodes(self.cache)
        tree = [s for n, _ in nodes if n.value is not None for s in n.value.tolist()]
        assert len(set(tree)) == len(tree) == self.cache.total_size()
        pages = {s // ps for s in tree}
        own: list[int] = []
        for r in self.reqs:
            own.extend({s // ps for s in r.slots.tolist()} - pages)
        assert len(set(own)) == len(own)
        held = (len(pages) + len(own)) * ps
        assert self.alloc.num_free_slots + held == self.alloc.num_usable_slots

    @invariant()
    def host_slots_accounted(self) -> None:
        nodes = _nodes(self.cache)
        host = [s for n, _ in nodes if n.host_value is not None for s in n.host_value.tolist()]
        assert len(set(host)) == len(host) == self.cache.host_size()
        only = sum(len(n.key) for n, _ in nodes if n.value is None)
        assert only == self.cache.stats().host_only_size
        a = self.tier.allocator
        assert a.num_free_slots + len(host) == a.num_usable_slots
        if host:
            assert not a.free_slot_mask(torch.tensor(host)).any()

    @invariant()
    def tiers_are_layered(self) -> None:
        for node, _ in _nodes(self.cache):
            assert node.value is not None or node.host_value is not None
            # A reload reads its host slots, a write-through fills them.
            assert node.host_ref == int(node.loading) + int(node.writing)
            if node.loading:
                assert node.value is not None and node.lock_ref > 0
            device_kids = [c for c in node.children.values() if c.value is not None]
            assert node.device_children == len(device_kids)
            if node.value is None:
                assert not device_kids and node.lock_ref == 0
        assert self.cache.root.device_children == sum(
            c.value is not None for c in self.cache.root.children.values()
        )

    @invariant()
    def bytes_follow_their_paths(self) -> None:
        data = self.tier.host.data
        for node, path in _nodes(self.cache):
            for i in range(len(node.key)):
                want = value_of(path[: node.start + i + 1])
                if node.value is not None:
                    s = int(node.value[i])
                    assert float(self.pool.k_buffers[0][s]) == want
                    assert float(self.pool.v_buffers[0][s]) == -want
                if node.host_value is not None:
                    h = int(node.host_value[i])
                    assert float(data[h, 0, 0, 0]) == want and float(data[h, 0, 1, 0]) == -want

    @invariant()
    def events_describe_both_tiers(self) -> None:
        device, host = replay_tiers(self.events, set(), set())
        on_device = {
            h
            for n, path in _nodes(self.cache)
            if n.value is not None
            for h in block_hashes(path, self.block)
        }
        anywhere = {h for _, path in _nodes(self.cache) for h in block_hashes(path, self.block)}
        assert device == on_device
        assert host == anywhere - on_device

    def teardown(self) -> None:
        while self.reqs:
            self.finish(0)
        self.cache.reset()
        assert self.alloc.num_free_slots == self.alloc.num_usable_slots
        assert self.tier.allocator.num_free_slots == self.tier.allocator.num_usable_slots
        assert replay_tiers(self.events, set(), set()) == (set(), set())


class TierPage2Machine(TierMachine):
    page_size = 2
    block = 4
    num_slots = 26
    host_slots = 16


class DeferredTierMachine(TierMachine):
    deferred = True


class WriteThroughMachine(TierMachine):
    write_through = True


class DeferredWriteThroughMachine(TierMachine):
    deferred = True
    write_through = True


_fast = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestTiers = TierMachine.TestCase
TestTiers.settings = _fast
TestTiersPage2 = TierPage2Machine.TestCase
TestTiersPage2.settings = _fast
TestDeferredReloads = DeferredTierMachine.TestCase
TestDeferredReloads.settings = _fast
TestWriteThrough = WriteThroughMachine.TestCase
TestWriteThrough.settings = _fast
TestDeferredWriteThrough = DeferredWriteThroughMachine.TestCase
TestDeferredWriteThrough.settings = _fast
