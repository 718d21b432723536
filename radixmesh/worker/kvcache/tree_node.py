"""The radix tree's node, what a prefix match returns and the tree's counters
(radix_cache.py has the rules: the tree owns every node's slots, and a caller holds a
node only as a lock handle)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

ChildKey = int | tuple[int, ...]


class TreeNode:
    """One edge of the tree. Owned by RadixCache; callers hold nodes only as lock handles."""

    __slots__ = (
        "children",
        "device_children",
        "end",
        "hashes",
        "host_ref",
        "host_value",
        "id",
        "key",
        "last_access",
        "last_hash",
        "loading",
        "lock_ref",
        "parent",
        "value",
        "writing",
    )

    def __init__(
        self,
        key: list[int],
        value: torch.Tensor | None,
        parent: TreeNode | None,
        end: int,
        node_id: int,
    ) -> None:
        self.children: dict[ChildKey, TreeNode] = {}
        self.parent = parent  # None for the root and for evicted nodes
        self.key = key
        # [len(key)] int64 device slots; None while the KV is only in host memory
        self.value: torch.Tensor | None = value
        self.host_value: torch.Tensor | None = None  # [len(key)] int64 host slots, if any
        self.device_children = 0  # children whose value is not None
        self.host_ref = 0  # > 0: its host slots must stay (a load or a copy uses them)
        self.loading = False  # its device slots are being filled from host memory
        self.writing = False  # its KV is being copied to its host slots (write-through)
        self.end = end  # path length from the root to the end of this node
        self.id = node_id  # creation order: the LRU tie-break
        self.lock_ref = 0
        self.last_access = 0
        self.hashes: list[int] | None = None  # hashes of blocks ending in this node
        self.last_hash: int | None = None  # valid once `hashes` is not None

    @property
    def start(self) -> int:
        return self.end - len(self.key)

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, span=[{self.start}, {self.end}), lock={self.lock_ref})"


@dataclass(frozen=True)
class MatchResult:
    slots: torch.Tensor  # [len(matched prefix)] int64 device slots
    last_node: TreeNode  # ends exactly at len(slots); lock it before using `slots`
    # With a host tier: the nodes below last_node, in path order, that continue the match
    # in host memory only (`RadixCache.load_host` brings them to the device).
    host_nodes: tuple[TreeNode, ...] = ()
    # The device match stopped before a node whose reload from host memory is still
    # being copied: the prompt finds more once it lands (admission waits for it).
    pending: bool = False

    @property
    def host_tokens(self) -> int:
        return sum(len(n.key) for n in self.host_nodes)


@dataclass(frozen=True)
class RadixCacheStats:
    total_size: int
    evictable_size: int
    protected_size: int
    num_nodes: int
    queried_tokens_total: int
    matched_tokens_total: int
    evicted_tokens_total: int
    host_size: int = 0  # tokens with a copy in host memory (host-only or both)
    host_only_size: int = 0  # tokens in host memory only
    offloaded_tokens_total: int = 0  # device evictions kept in host memory
    loaded_tokens_total: int = 0  # host-only tokens brought back (loads and adoptions)

    @property
    def hit_rate(self) -> float:
        return self.matched_tokens_total / max(1, self.queried_tokens_total)
