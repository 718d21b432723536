"""RadixCache: a radix tree over token ids whose nodes own KV slots (RadixAttention).

Each node is one edge of the tree: `key` (token ids) and `value` (the int64 KV slots of
those tokens, same length). A root path spells a token prefix whose KV is cached.

Ownership and locking rules (callers must keep them):

- The tree owns the slots of every node. `insert` takes ownership of the slots of the
  NEW part of the key only; the caller keeps (and must free or keep using) the rest.
  `cache_finished` / `cache_unfinished` do that bookkeeping for a request, so callers
  normally never free slots of a cached prefix themselves.
- The slots `match_prefix` returns may be used only while their `last_node` is locked:
  call `inc_lock_ref(last_node)` before anything can evict (i.e. before the next
  `evict`, `insert` or allocation that may evict), and `dec_lock_ref` exactly once later.
  Locked nodes (and their ancestors) are never evicted; `reset` refuses while any is.
- With `page_size` > 1 only whole pages are matched and stored: every node's key length
  is a multiple of page_size, and splits happen at page boundaries.
- LRU: a logical clock ticks on each match/insert; every node on the walked path gets
  the tick. `evict` frees unlocked leaves oldest first.

Cache events (see `events.py`): with listeners attached, node creation and eviction emit
the chained block hashes (`radixmesh.prefix.block_hashes`, block `event_block_size`) of
the blocks that end inside the node (node_hashes.py computes and caches them).

Host-memory tier (`host_tier`; host_tree.py does the moving): a node's KV is on the
device (`value`), in host memory (`host_value`), or both. Device eviction offloads an LRU
leaf to host slots and keeps it host-only; device nodes stay a root-connected subtree
with host-only ones below. A match reports the host-only nodes that continue it
(`MatchResult.host_nodes`) and `load_host` brings them back; an insert over them adopts
the caller's slots; the host pool evicts its own LRU nodes. Locks are device notions.

Not thread-safe: the scheduler thread is the only caller.
"""

from __future__ import annotations

import contextlib
import heapq
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from radixmesh.worker.kvcache import host_tree
from radixmesh.worker.kvcache.events import (
    CacheEvent,
    CacheEventKind,
    CacheListener,
)
from radixmesh.worker.kvcache.node_hashes import node_event
from radixmesh.worker.kvcache.tree_core import TreeCore
from radixmesh.worker.kvcache.tree_node import MatchResult, RadixCacheStats, TreeNode


class RadixCache(TreeCore):
    """`RadixCache(allocator, page_size, *, disable, event_block_size, host_tier)`: the
    constructor and the tree's structure are `TreeCore`'s (tree_core.py)."""

    # ---- sizes and stats -----------------------------------------------------------------
    def total_size(self) -> int:
        return self._evictable + self._protected

    def evictable_size(self) -> int:
        """Tokens in unlocked nodes (root excluded)."""
        return self._evictable

    def protected_size(self) -> int:
        """Tokens in locked nodes (root excluded)."""
        return self._protected

    def num_nodes(self) -> int:
        return self._num_nodes

    def host_size(self) -> int:
        """Tokens with a copy in host memory."""
        return self._host_size

    def stats(self) -> RadixCacheStats:
        return RadixCacheStats(
            self.total_size(),
            self._evictable,
            self._protected,
            self._num_nodes,
            self._queried,
            self._matched,
            self._evicted,
            self._host_size,
            self._host_only,
            self._offloaded,
            self._loaded,
        )

    # ---- listeners -----------------------------------------------------------------------
    def add_listener(self, fn: CacheListener) -> None:
        """Call `fn` with each CacheEvent from now on (see events.py; `snapshot` for the past)."""
        self._listeners.add(fn)

    def remove_listener(self, fn: CacheListener) -> None:
        self._listeners.remove(fn)

    def snapshot(self) -> list[CacheEvent]:
        """The events that rebuild the current contents, parents before children: "stored"
        for what is on the device, "offloaded" for what is in host memory only."""
        out: list[CacheEvent] = []
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            kind: CacheEventKind = "stored" if node.value is not None else "offloaded"
            event = node_event(kind, node, self.event_block_size)
            if event is not None:
                out.append(event)
            stack.extend(node.children.values())
        return out

    # ---- match / insert ------------------------------------------------------------------
    def match_prefix(
        self, key: Sequence[int], *, end: int | None = None, count_stats: bool = True
    ) -> MatchResult:
        """The longest page-aligned prefix of `key[:end]` (`end` None: all of `key`)
        cached on the device, the node ending exactly there and (with a host tier) the
        host-only nodes that continue it. `end` spares a caller the slice's copy (a
        request's tokens less the last: 1,600 ids an admission on the shared-prefix
        workload).

        Splits a node when the match ends inside it. `count_stats=False` keeps the hit-rate
        counters untouched (for priority probes that are not real lookups).
        """
        if self.disable:
            return MatchResult(self._empty, self.root)
        tokens = _as_tokens(key)
        n = len(tokens) if end is None else max(0, min(end, len(tokens)))
        limit = n - n % self.page_size
        node, matched, values = self._walk(tokens, limit)
        if self._loads:
            cut = host_tree.pending_cut(self, node)
            if cut is not None:  # the path runs into a reload still copying
                slots = _cat(values, self._empty)[: cut.end]
                return MatchResult(slots, cut, pending=True)
        if count_stats:
            self._queried += n
            self._matched += matched
        host: tuple[TreeNode, ...] = ()
        if self._host_only and node.device_children < len(node.children):
            host = host_tree.walk_host(self, tokens, limit, node, matched)
        return MatchResult(_cat(values, self._empty), node, host)

    def continuation(
        self, tokens: Sequence[int], k: int, start: TreeNode | None = None
    ) -> list[int]:
        """Up to k tokens that follow `tokens` in the tree (in host-only nodes too: only
        the ids are read), taking the most recently used branch where it forks; [] when
        the tree does not hold all of `tokens`. Read-only: no split, no LRU touch (a
        speculative drafter's lookup is not a use of the KV). From `start` (a node whose
        root path spells tokens[:start.end]) the walk skips what the caller knows."""
        if self.disable or k < 1:
            return []
        ids = list(tokens)
        node, pos = (start, start.end) if start is not None else (self.root, 0)
        end = len(ids)
        key: list[int] = []
        offset = 0
        while pos < end:  # follow `tokens` to where they end
            if end - pos < self.page_size:
                return []  # children are told apart by a whole page
            child = node.children.get(self._child_key(ids, pos))
            if child is None:
                return []
            key = child.key
            n = min(len(key), end - pos)
            if ids[pos : pos + n] != key[:n]:
                return []
            node, pos, offset = child, pos + n, n
        out = key[offset : offset + k] if offset < len(key) else []
        while len(out) < k and node.children:  # then the most recent branch
            node = max(node.children.values(), key=lambda c: c.last_access)
            out.extend(node.key[: k - len(out)])
        return out

    def load_host(self, match: MatchResult) -> MatchResult:
        """Bring a match's host-only nodes back to the device (host_tree.load_host)."""
        return host_tree.load_host(self, match)

    def poll_loads(self, wait: bool = False) -> int:
        """Finish the reloads and write-throughs that are done (host_tree.poll_loads,
        poll_writes); how many reloads are not."""
        if self._writes:
            host_tree.poll_writes(self, wait)
        return host_tree.poll_loads(self, wait)

    def _write_new(self) -> None:
        """Write-through: the nodes made since the last call to host memory."""
        if self._new_nodes and self._deferred is None:
            host_tree.write_through(self)

    def insert(self, key: Sequence[int], slots: torch.Tensor) -> int:
        """Insert `key` with its `slots`; returns how long a prefix was already present.

        The tree takes ownership of `slots[returned:]` only. `len(key)` must equal
        `len(slots)` and be a multiple of page_size.
        """
        if self.disable:
            raise RuntimeError("insert: the radix cache is disabled")
        tokens = _as_tokens(key)
        if len(tokens) != slots.numel():
            raise ValueError(f"slots: length {slots.numel()} != len(key) {len(tokens)}")
        if len(tokens) % self.page_size:
            raise ValueError(
                f"key: length {len(tokens)} is not a multiple of page_size {self.page_size}"
            )
        present, _, _ = self._insert(tokens, len(tokens), slots)
        self._write_new()
        return present  # host-only nodes it covered took their slots from `slots` too

    # ---- request-level ownership ---------------------------------------------------------
    def cache_finished(
        self, key: Sequence[int], slots: torch.Tensor, locked_node: TreeNode
    ) -> None:
        """A request is done: keep its page-aligned KV in the tree, free the rest, unlock.

        `slots[i]` holds the KV of `key[i]` (key may be longer: the last sampled token has
        no KV yet, and a caller may pass a request's whole token list: only the tokens
        with slots are read). Where the tree already had a token under a different slot, the
        request's slot is a duplicate and is freed; a slot equal to the tree's was shared
        from it. The unaligned tail is freed. Then `dec_lock_ref(locked_node)`.

        `locked_node` is the node the request's prefix was matched (or last shared) to:
        its first `locked_node.end` tokens and slots are the tree's own, so the insert
        starts there rather than at the root. A request of a shared-prefix group then
        pays for its own tokens only, not for comparing the whole shared prefix again
        (1,536 of 1,600 tokens a request on the shared-prefix benchmark).
        """
        if self.disable:
            self._free(slots)
            return
        tokens, aligned = self._request_span(key, slots)
        start = self._start_of(locked_node, aligned)
        present, _, tree_slots = self._insert(tokens, aligned, slots, start)
        if present > start.end:
            self._free_duplicates(slots[start.end : present], tree_slots)
        if aligned < len(slots):
            self._free(slots[aligned:])
        self.dec_lock_ref(locked_node)
        self._write_new()

    @contextlib.contextmanager
    def batched_frees(self) -> Iterator[None]:
        """Within: the slots `cache_finished` and `cache_unfinished` free (duplicates of
        the tree's, unaligned tails) go back to the allocator in one `free` at the end,
        not one per request. The scheduler finishes up to a batch of requests in one
        step's output; their frees then cost one pass over the pages. Eviction still frees
        at once (its caller wants the room now). Nested use joins the outer batch."""
        if self._deferred is not None:
            yield
            return
        self._deferred = []
        try:
            yield
        finally:
            pending, self._deferred = self._deferred, None
            if pending:
                self.allocator.free(pending[0] if len(pending) == 1 else torch.cat(pending))
            self._write_new()

    def _free(self, slots: torch.Tensor) -> None:
        if self._deferred is None:
            self.allocator.free(slots)
        elif slots.numel():
            # A copy: `slots` may view a request's table row, reused before the batch ends.
            self._deferred.append(slots.clone())

    def cache_unfinished(
        self, key: Sequence[int], slots: torch.Tensor, locked_node: TreeNode
    ) -> tuple[torch.Tensor, TreeNode]:
        """A running request shares its computed page-aligned prefix with the tree.

        Same insertion and duplicate freeing as `cache_finished` (`key` may be longer
        than `slots` there too). Returns the slots the request must use from now on (same
        length as `slots`: the tree's slots for the aligned prefix, the request's own
        unaligned tail unchanged) and the node ending at the aligned prefix, now locked in
        place of `locked_node`. Like `cache_finished`, the insert starts at `locked_node`.
        The slots returned are `slots` itself when the tree took the request's own for
        every token past `locked_node` (nothing there was cached yet: the common case), so
        a caller whose table row holds `slots` has nothing to write back; else a new
        tensor.
        """
        if self.disable:
            return slots, self.root
        tokens, aligned = self._request_span(key, slots)
        start = self._start_of(locked_node, aligned)
        present, node, tree_slots = self._insert(tokens, aligned, slots, start)
        new_slots = slots
        if present > start.end:
            self._free_duplicates(slots[start.end : present], tree_slots)
            new_slots = slots.clone()
            new_slots[start.end : present] = tree_slots
        self.inc_lock_ref(node)
        self.dec_lock_ref(locked_node)
        self._write_new()
        return new_slots, node

    def _request_span(self, key: Sequence[int], slots: torch.Tensor) -> tuple[list[int], int]:
        tokens = _as_tokens(key)
        n = slots.numel()
        if len(tokens) < n:
            raise ValueError(f"key: {len(tokens)} tokens but {n} slots")
        return tokens, n - n % self.page_size

    def _start_of(self, locked_node: TreeNode, aligned: int) -> TreeNode:
        """Where a request's insert starts: its locked node, while that lies within the
        span being inserted (else the root: a caller's odd lock costs a full walk only)."""
        if locked_node.end <= aligned and (
            locked_node.parent is not None or locked_node is self.root
        ):
            return locked_node
        return self.root

    def _free_duplicates(self, req_slots: torch.Tensor, tree_slots: torch.Tensor) -> None:
        dup = req_slots != tree_slots
        if bool(dup.any()):
            self._free(req_slots[dup])

    # ---- eviction and reset --------------------------------------------------------------
    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` device slots from unlocked leaves, least recently
        used first (into host memory, with a tier and room there).

        Parents left without device children and unlocked become candidates. Returns the
        slots freed (may be fewer than asked when everything left is locked).
        """
        heap = [(n.last_access, n.id, n) for n in self._leaves if n.lock_ref == 0]
        heapq.heapify(heap)
        freed: list[torch.Tensor] = []
        # Offloaded here: (node, its device slots, its new host slots), copied at the end.
        copies: list[tuple[TreeNode, torch.Tensor, torch.Tensor]] = []
        num_freed = 0
        try:
            while num_freed < num_tokens and heap:
                node = heapq.heappop(heap)[2]
                value = node.value
                assert value is not None
                freed.append(value)
                num_freed += len(node.key)
                parent = host_tree.evict_node(self, node, copies)
                if parent is not self.root and parent in self._leaves and parent.lock_ref == 0:
                    heapq.heappush(heap, (parent.last_access, parent.id, parent))
        finally:
            if copies:  # one copy for all, before the slots can be written again
                host_tree.write_copies(self, copies)
            if freed:
                self.allocator.free(torch.cat(freed))
        self._evicted += num_freed
        return num_freed

    def reset(self) -> None:
        """Flush: free every slot in the tree and emit one "cleared" event.

        Raises RuntimeError if any node is locked (a running request still uses it).
        """
        self.poll_loads(wait=True)
        if self._protected:
            raise RuntimeError(f"reset: {self._protected} tokens are locked by running requests")
        nodes = self._iter_nodes()
        values = [n.value for n in nodes if n.value is not None]
        if values:
            self.allocator.free(torch.cat(values))
        host = [n.host_value for n in nodes if n.host_value is not None]
        if host and self.tier is not None:
            self.tier.free(torch.cat(host))
        freed = self.total_size() + self._host_only
        self._clear_tree()
        if self._listeners.active:
            self._listeners.emit(CacheEvent("cleared", (), None, freed))

    # ---- debugging -----------------------------------------------------------------------
    def pretty(self, max_tokens: int = 8) -> str:
        """The tree as indented lines: span, lock count, last access, first tokens."""
        lines = [
            f"root (nodes={self._num_nodes}, evictable={self._evictable}, "
            f"protected={self._protected})"
        ]
        stack = [(c, 1) for c in reversed(list(self.root.children.values()))]
        while stack:
            node, depth = stack.pop()
            more = "..." if len(node.key) > max_tokens else ""
            where = ""
            if self.tier is not None:  # d: on the device, h: in host memory
                d, h = node.value is not None, node.host_value is not None
                where = ("d" if d else "") + ("h" if h else "") + " "
            lines.append(
                f"{'  ' * depth}[{node.start},{node.end}) {where}lock={node.lock_ref} "
                f"t={node.last_access} {node.key[:max_tokens]}{more}"
            )
            stack.extend((c, depth + 1) for c in reversed(list(node.children.values())))
        return "\n".join(lines)

    # ---- tree internals ------------------------------------------------------------------
    def _walk(
        self, tokens: list[int], limit: int, start: TreeNode | None = None
    ) -> tuple[TreeNode, int, list[torch.Tensor]]:
        """Follow tokens[:limit] down the tree, splitting where the match ends mid-node.

        Returns the last node (ending exactly at the matched length), that length, and the
        values of the nodes on the path. Touches every node on the path (LRU). From a
        `start` node (whose root path the caller knows spells tokens[:start.end]), the
        values are those below it; its ancestors are touched without comparing tokens.
        """
        self._clock += 1
        node, pos = self.root, 0
        values: list[torch.Tensor] = []
        if start is not None and start is not self.root:
            node, pos = start, start.end
            up: TreeNode | None = start
            while up is not None and up is not self.root:
                up.last_access = self._clock
                up = up.parent
        while pos < limit:
            child = node.children.get(self._child_key(tokens, pos))
            if child is None or child.value is None:  # host-only: past the device's part
                break
            common = self._common_len(child.key, tokens, pos, limit)
            if common < len(child.key):
                child = self._split(child, common)
            child.last_access = self._clock
            values.append(child.value)  # type: ignore[arg-type]  # on the device: checked above
            node, pos = child, pos + common
        return node, pos, values

    def _insert(
        self, tokens: list[int], limit: int, slots: torch.Tensor, start: TreeNode | None = None
    ) -> tuple[int, TreeNode, torch.Tensor]:
        """Insert tokens[:limit] -> slots[:limit]; returns (length already present on the
        device, node ending at `limit`, the tree's slots of that part below `start`).
        Host-only nodes past the device's part take their slots from `slots` (adopted:
        the caller's computed KV is the same as theirs)."""
        node, present, values = self._walk(tokens, limit, start)
        tree_slots = _cat(values, self._empty)
        pos = present
        if pos < limit and node.device_children < len(node.children):
            node, pos = host_tree.adopt(self, tokens, limit, slots, node, pos)
        if pos < limit:
            # Clone: `slots` is often a view of the request table, whose row gets reused.
            node = self._add_leaf(node, tokens[pos:limit], slots[pos:limit].clone())
        return present, node, tree_slots


def _as_tokens(key: Sequence[int]) -> list[int]:
    if isinstance(key, list):
        return key
    if isinstance(key, torch.Tensor | np.ndarray):
        tokens: list[int] = key.tolist()
        return tokens
    return [int(t) for t in key]


def _cat(values: list[torch.Tensor], empty: torch.Tensor) -> torch.Tensor:
    """The path's slots. One node's value is returned as is, not copied: on the
    shared-prefix benchmark most matches end at one node (the group's prefix), and the
    copy of its 1,536 slots was a quarter of an admission's cost. Callers only read it
    (node values are never written in place: a split slices them)."""
    if not values:
        return empty
    if len(values) == 1:
        return values[0]
    return torch.cat(values)
