"""Random operation sequences against the allocator + radix cache: nothing leaks, nothing is
freed twice or while locked, and the event stream always describes the tree exactly."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from radixmesh.prefix import block_hashes
from radixmesh.worker.kvcache.allocator import KVAllocator
from radixmesh.worker.kvcache.events import CacheEvent
from radixmesh.worker.kvcache.radix_cache import RadixCache
from radixmesh.worker.kvcache.tree_node import TreeNode

# A 3-token vocabulary makes prompts share prefixes (and split nodes) all the time.
tokens_st = st.lists(st.integers(0, 2), min_size=0, max_size=12)
index_st = st.integers(0, 7)


@dataclass
class SimRequest:
    tokens: list[int]  # the request's sequence; KV exists for tokens[: len(slots)]
    slots: torch.Tensor
    node: TreeNode  # locked for this request


def _nodes(cache: RadixCache) -> list[tuple[TreeNode, list[int]]]:
    """Every node with the token path ending at it, from the tree's public structure."""
    out: list[tuple[TreeNode, list[int]]] = []
    stack = [(c, list[int]()) for c in cache.root.children.values()]
    while stack:
        node, prefix = stack.pop()
        path = prefix + node.key
        out.append((node, path))
        stack.extend((c, path) for c in node.children.values())
    return out


def _value(node: TreeNode) -> torch.Tensor:
    assert node.value is not None  # no host tier here: every node is on the device
    return node.value


def _path_slots(node: TreeNode) -> list[int]:
    parts: list[list[int]] = []
    while node.parent is not None:
        parts.append(_value(node).tolist())
        node = node.parent
    return [s for part in reversed(parts) for s in part]


class CacheMachine(RuleBasedStateMachine):
    page_size = 1
    block = 2
    num_slots = 26
    disable = False
    max_requests = 4

    def __init__(self) -> None:
        super().__init__()
        self.alloc = KVAllocator(self.num_slots, self.page_size)
        self.cache = RadixCache(
            self.alloc, self.page_size, disable=self.disable, event_block_size=self.block
        )
        self.summary: set[int] = set()
        self.cache.add_listener(self._on_event)
        self.reqs: list[SimRequest] = []

    def _on_event(self, ev: CacheEvent) -> None:
        # Each block is stored at most once at a time, and only present blocks are removed.
        if ev.kind == "stored":
            assert self.summary.isdisjoint(ev.block_hashes)
            self.summary.update(ev.block_hashes)
        elif ev.kind == "removed":
            assert self.summary.issuperset(ev.block_hashes)
            self.summary.difference_update(ev.block_hashes)
        else:
            self.summary.clear()
        assert ev.num_tokens == len(ev.block_hashes) * self.block or ev.kind == "cleared"

    def _alloc(self, n: int, last_slot: int | None, num_existing: int) -> torch.Tensor | None:
        new = self.alloc.alloc(n, last_slot=last_slot, num_existing=num_existing)
        if new is None:
            self.cache.evict(n + self.page_size)
            new = self.alloc.alloc(n, last_slot=last_slot, num_existing=num_existing)
        return new

    # ---- simulated requests ------------------------------------------------------------
    # Rules that do not apply return early instead of using preconditions: hypothesis would
    # otherwise spend most draws retrying rules that are disabled.
    @rule(prompt=st.lists(st.integers(0, 2), min_size=1, max_size=12))
    def start(self, prompt: list[int]) -> None:
        if len(self.reqs) >= self.max_requests:
            return
        m = self.cache.match_prefix(prompt)
        self.cache.inc_lock_ref(m.last_node)
        self.reqs.append(SimRequest(list(prompt), m.slots.clone(), m.last_node))

    @rule(i=index_st, n=st.integers(1, 6), generated=tokens_st)
    def compute(self, i: int, n: int, generated: list[int]) -> None:
        """Prefill a chunk or decode: KV for the next n tokens (growing the sequence)."""
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
            r.slots = torch.cat([r.slots, new])

    @rule(i=index_st)
    def share(self, i: int) -> None:
        if not self.reqs:
            return
        r = self.reqs[i % len(self.reqs)]
        r.slots, r.node = self.cache.cache_unfinished(r.tokens, r.slots, r.node)

    @rule(i=index_st)
    def finish(self, i: int) -> None:
        if not self.reqs:
            return
        r = self.reqs.pop(i % len(self.reqs))
        self.cache.cache_finished(r.tokens, r.slots, r.node)

    # ---- raw tree operations -----------------------------------------------------------
    @rule(n=st.integers(0, 30))
    def evict(self, n: int) -> None:
        before = self.cache.evictable_size()
        freed = self.cache.evict(n)
        assert freed >= min(n, before) or freed == before
        assert self.cache.evictable_size() == before - freed

    @rule(key=tokens_st)
    def insert(self, key: list[int]) -> None:
        if self.disable:
            return
        key = key[: len(key) - len(key) % self.page_size]
        slots = self._alloc(len(key), None, 0)
        if slots is None:
            return
        present = self.cache.insert(key, slots)
        self.alloc.free(slots[:present])  # the tree took only the new part

    # ---- invariants --------------------------------------------------------------------
    @invariant()
    def nothing_leaks(self) -> None:
        ps = self.page_size
        tree_slots = [s for node, _ in _nodes(self.cache) for s in _value(node).tolist()]
        assert len(set(tree_slots)) == len(tree_slots) == self.cache.total_size()
        tree_pages = {s // ps for s in tree_slots}
        own: list[int] = []  # pages held only by requests
        for r in self.reqs:
            own.extend({s // ps for s in r.slots.tolist()} - tree_pages)
        assert len(set(own)) == len(own), "a page owned by two requests"
        held = len(tree_pages) * ps + len(own) * ps
        assert self.alloc.num_free_slots + held == self.alloc.num_usable_slots
        assert len(tree_pages) * ps == self.cache.total_size()  # the tree holds whole pages

    @invariant()
    def used_slots_are_not_free(self) -> None:
        used = [_value(node) for node, _ in _nodes(self.cache)] + [r.slots for r in self.reqs]
        if used:
            assert not self.alloc.free_slot_mask(torch.cat(used)).any()

    @invariant()
    def locks_match_requests(self) -> None:
        expected: dict[int, int] = {}
        for r in self.reqs:
            node: TreeNode | None = r.node
            while node is not None and node is not self.cache.root:
                expected[id(node)] = expected.get(id(node), 0) + 1
                node = node.parent
            # A request uses the tree's slots for its locked prefix.
            assert r.slots[: r.node.end].tolist() == _path_slots(r.node)
        protected = 0
        for node, _ in _nodes(self.cache):
            assert node.lock_ref == expected.get(id(node), 0)
            assert len(node.key) % self.page_size == 0 and node.key
            protected += len(node.key) if node.lock_ref else 0
        assert self.cache.protected_size() == protected

    @invariant()
    def events_describe_the_tree(self) -> None:
        paths = {h for _, path in _nodes(self.cache) for h in block_hashes(path, self.block)}
        assert self.summary == paths

    def teardown(self) -> None:
        while self.reqs:
            self.finish(0)
        self.cache.reset()
        assert self.alloc.num_free_slots == self.alloc.num_usable_slots
        assert self.summary == set() and self.cache.total_size() == 0


class CachePage2Machine(CacheMachine):
    page_size = 2
    block = 4
    num_slots = 29  # 14 pages, 13 usable; slot 28 is the unused leftover


class DisabledCacheMachine(CacheMachine):
    disable = True


_fast = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestCacheProperties = CacheMachine.TestCase
TestCacheProperties.settings = _fast
TestCachePage2Properties = CachePage2Machine.TestCase
TestCachePage2Properties.settings = _fast
TestDisabledCacheProperties = DisabledCacheMachine.TestCase
TestDisabledCacheProperties.settings = settings(
    max_examples=30, stateful_step_count=30, deadline=None
)
