"""The radix tree's node and what a prefix match returns (radix_cache.py has the rules:
the tree owns every node's slots, and a caller holds a node only as a lock handle)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

ChildKey = int | tuple[int, ...]


class TreeNode:
    """One edge of the tree. Owned by RadixCache; callers hold nodes only as lock handles."""

    __slots__ = (
        "children",
        "end",
        "hashes",
        "id",
        "key",
        "last_access",
        "last_hash",
        "lock_ref",
        "parent",
        "value",
    )

    def __init__(
        self, key: list[int], value: torch.Tensor, parent: TreeNode | None, end: int, node_id: int
    ) -> None:
        self.children: dict[ChildKey, TreeNode] = {}
        self.parent = parent  # None for the root and for evicted nodes
        self.key = key
        self.value = value  # [len(key)] int64 slots
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
    slots: torch.Tensor  # [len(matched prefix)] int64
    last_node: TreeNode  # ends exactly at len(slots); lock it before using `slots`
