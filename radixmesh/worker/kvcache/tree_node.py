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
        "device_children",
        "end",
        "hashes",
        "host_ref",
        "host_value",
        "id",
        "key",
        "last_access",
        "last_hash",
        "lock_ref",
        "parent",
        "value",
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

    @property
    def host_tokens(self) -> int:
        return sum(len(n.key) for n in self.host_nodes)
