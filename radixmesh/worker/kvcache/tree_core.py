"""The radix tree's structure: its nodes, counters and locks, what every part of the cache
shares (radix_cache.py has the rules and the operations over it; host_tree.py the moves
between the device and host memory).

The counters are kept here, by the operations that change them: `_evictable` and
`_protected` (device tokens in unlocked and locked nodes), `_host_size` and `_host_only`
(tokens with a host copy, and with nothing else), `_leaves` (device nodes without a
device child: the device eviction candidates) and `_host_nodes` (nodes with host slots).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque

import torch

from radixmesh.worker.kvcache.allocator import KVAllocator
from radixmesh.worker.kvcache.events import CacheEventKind, CacheEventListeners
from radixmesh.worker.kvcache.host_tier import HostTier
from radixmesh.worker.kvcache.node_hashes import node_event, split_hashes
from radixmesh.worker.kvcache.tree_node import ChildKey, TreeNode


class TreeCore(ABC):
    def __init__(
        self,
        allocator: KVAllocator,
        page_size: int = 1,
        *,
        disable: bool = False,
        event_block_size: int = 16,
        host_tier: HostTier | None = None,
        write_through: bool = False,
    ) -> None:
        if page_size != allocator.page_size:
            raise ValueError(
                f"page_size: {page_size} differs from the allocator's {allocator.page_size}"
            )
        if event_block_size < 1 or event_block_size % page_size:
            raise ValueError(
                f"event_block_size: {event_block_size} is not a multiple of page_size ({page_size})"
            )
        self.allocator = allocator
        self.page_size = page_size
        self.disable = disable
        self.event_block_size = event_block_size
        self.tier = None if disable else host_tier
        # With a tier: copy each new node to host memory at once, beside the forwards
        # (host_tree.write_through), rather than when it is evicted, between them.
        self.write_through = write_through and self.tier is not None
        self._new_nodes: list[TreeNode] = []  # made since the last write-through
        self._listeners = CacheEventListeners()
        # Slots live on the host: comparing and freeing them never waits for the device.
        self._empty = torch.empty(0, dtype=torch.int64)
        self._next_id = 0
        self._queried = self._matched = self._evicted = 0
        self._offloaded = self._loaded = 0
        self._deferred: list[torch.Tensor] | None = None  # see batched_frees
        # Reloads still copying (CUDA): the event that ends each, and its nodes.
        self._loads: deque[tuple[torch.cuda.Event, list[TreeNode]]] = deque()
        # Write-throughs still copying (CUDA), the same way.
        self._writes: deque[tuple[torch.cuda.Event, list[TreeNode]]] = deque()
        self.root = TreeNode([], self._empty, None, 0, self._new_id())
        self.root.lock_ref = 1  # the root is never evicted
        self.root.hashes = []
        self._clear_tree()

    def _clear_tree(self) -> None:
        # The root object survives a reset: requests may still hold it as their lock handle.
        self.root.children = {}
        self.root.device_children = 0
        # Device-resident nodes without a device-resident child, locked or not (the device
        # eviction candidates); the root is never in it.
        self._leaves: set[TreeNode] = set()
        self._host_nodes: set[TreeNode] = set()  # nodes with host slots
        self._clock = 0
        self._evictable = self._protected = self._num_nodes = 0
        self._host_size = self._host_only = 0

    @property
    def disabled(self) -> bool:
        """Same as `disable` (the scheduler reads this name)."""
        return self.disable

    def inc_lock_ref(self, node: TreeNode) -> None:
        """Lock the path node..root against eviction."""
        if node is not self.root and (node.parent is None or node.value is None):
            raise RuntimeError(f"inc_lock_ref: {node} was evicted; lock right after matching")
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]  # attached: parent is set

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Undo one `inc_lock_ref(node)`."""
        while node is not self.root:
            if node.lock_ref <= 0:
                raise RuntimeError(f"dec_lock_ref: {node} is not locked")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._protected -= len(node.key)
                self._evictable += len(node.key)
            node = node.parent  # type: ignore[assignment]

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _child_key(self, tokens: list[int], pos: int) -> ChildKey:
        # Children are told apart by their first page: a page is the unit of sharing.
        if self.page_size == 1:
            return tokens[pos]
        return tuple(tokens[pos : pos + self.page_size])

    def _common_len(self, node_key: list[int], tokens: list[int], pos: int, limit: int) -> int:
        """Page-aligned length of the common prefix of node_key and tokens[pos:limit]."""
        m = min(len(node_key), limit - pos)
        # Whole-slice comparison runs in C; the per-token scan runs once per walk at most.
        if tokens[pos : pos + m] == (node_key if m == len(node_key) else node_key[:m]):
            i = m
        else:
            i = 0
            while node_key[i] == tokens[pos + i]:
                i += 1
        return i - i % self.page_size

    def _split(self, child: TreeNode, at: int) -> TreeNode:
        """Cut `child` after `at` tokens; the new upper node is returned, `child` keeps the
        lower part so lock handles on it stay valid (its end does not move)."""
        parent = child.parent
        assert parent is not None
        value = child.value
        upper = TreeNode(
            child.key[:at],
            None if value is None else value[:at],
            parent,
            child.start + at,
            self._new_id(),
        )
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        split_hashes(upper, child, parent, self.event_block_size)
        parent.children[self._child_key(child.key, 0)] = upper
        child.key, child.parent = child.key[at:], upper
        if value is not None:
            child.value = value[at:]
            upper.device_children = 1
        if child.host_value is not None:
            upper.host_value, child.host_value = child.host_value[:at], child.host_value[at:]
            upper.host_ref = child.host_ref
            self._host_nodes.add(upper)
        if child.loading or child.writing:
            self._split_pending(child, upper)
        upper.children[self._child_key(child.key, 0)] = child
        self._num_nodes += 1
        return upper

    def _add_leaf(self, parent: TreeNode, key: list[int], value: torch.Tensor) -> TreeNode:
        node = TreeNode(key, value, parent, parent.end + len(key), self._new_id())
        node.last_access = self._clock
        parent.children[self._child_key(key, 0)] = node
        parent.device_children += 1
        self._leaves.discard(parent)
        self._leaves.add(node)
        self._evictable += len(key)
        self._num_nodes += 1
        if self._listeners.active:
            self._emit("stored", node)
        if self.write_through:
            self._new_nodes.append(node)
        return node

    def _detach(self, node: TreeNode) -> TreeNode:
        """Take a childless, unlocked node out of the tree (its device slots, if any, are
        the caller's to free; its host slots must be dropped already); returns its parent."""
        if self._listeners.active:
            self._emit("removed", node)
        parent = node.parent
        assert parent is not None and not node.children and node.host_value is None
        del parent.children[self._child_key(node.key, 0)]
        if node.value is not None:
            self._leaves.discard(node)
            parent.device_children -= 1
            self._evictable -= len(node.key)
            if parent is not self.root and parent.device_children == 0:
                self._leaves.add(parent)
        self._num_nodes -= 1
        node.parent = None
        return parent

    def _iter_nodes(self, under: TreeNode | None = None) -> list[TreeNode]:
        """Every node below `under` (default: the root), parents before children."""
        out: list[TreeNode] = []
        stack = list((under or self.root).children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def _emit(self, kind: CacheEventKind, node: TreeNode) -> None:
        event = node_event(kind, node, self.event_block_size)
        if event is not None:
            self._listeners.emit(event)

    def _split_pending(self, lower: TreeNode, upper: TreeNode) -> None:
        """A node still being copied (a reload, a write-through) was split: its upper part
        joins the copy's nodes (a reload's lock stays on its deepest node, whose end a
        split does not move)."""
        upper.loading, upper.writing = lower.loading, lower.writing
        for records in (self._loads, self._writes):
            for _, nodes in records:
                if lower in nodes:
                    nodes.insert(nodes.index(lower), upper)
                    break

    @abstractmethod
    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` device slots (radix_cache.py)."""
