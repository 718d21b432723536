"""The chained block hashes a radix-tree node reports in cache events (events.py).

Each node caches its blocks' hashes (`hashes`) and the hash of the last full block ending
at or before its end (`last_hash`), so a new node hashes only its own tokens plus the
< block_size tokens before it; a split divides the cached list (radix_cache.py). Hashes
are computed lazily, on first emission: no listeners, no hashing.
"""

from __future__ import annotations

from radixmesh.prefix import block_hashes
from radixmesh.worker.kvcache.events import CacheEvent, CacheEventKind
from radixmesh.worker.kvcache.tree_node import TreeNode


def node_event(kind: CacheEventKind, node: TreeNode, block_size: int) -> CacheEvent | None:
    """The event of `kind` for the blocks ending inside `node` (None: it has none)."""
    ensure_hashes(node, block_size)
    assert node.hashes is not None and node.parent is not None
    if not node.hashes:
        return None
    parent_hash = node.parent.last_hash
    return CacheEvent(kind, tuple(node.hashes), parent_hash, len(node.hashes) * block_size)


def split_hashes(upper: TreeNode, lower: TreeNode, parent: TreeNode, block_size: int) -> None:
    """Divide `lower`'s cached hashes at the split that made `upper` its new parent."""
    if lower.hashes is None:
        return
    n_up = upper.end // block_size - upper.start // block_size
    upper.hashes, lower.hashes = lower.hashes[:n_up], lower.hashes[n_up:]
    upper.last_hash = upper.hashes[-1] if upper.hashes else parent.last_hash


def ensure_hashes(node: TreeNode, block_size: int) -> None:
    """Compute missing block hashes on the path root..node, top down."""
    chain: list[TreeNode] = []
    while node.hashes is None:
        chain.append(node)
        node = node.parent  # type: ignore[assignment]  # root.hashes is never None
    for n in reversed(chain):
        _hash_node(n, block_size)


def _hash_node(node: TreeNode, bs: int) -> None:
    """Hash the blocks ending inside `node` (its parent's hashes must be known)."""
    parent = node.parent
    assert parent is not None and parent.hashes is not None
    first, stop = node.start // bs, node.end // bs  # blocks first..stop-1 end in node
    if first == stop:
        node.hashes, node.last_hash = [], parent.last_hash
        return
    lead = _path_tail(parent, node.start - first * bs)
    node.hashes = block_hashes(lead + node.key[: stop * bs - node.start], bs, parent.last_hash)
    node.last_hash = node.hashes[-1]


def _path_tail(node: TreeNode, n: int) -> list[int]:
    """The last `n` tokens of the root path ending at `node`."""
    parts: list[list[int]] = []
    while n > 0:
        take = min(n, len(node.key))
        parts.append(node.key[len(node.key) - take :])
        n -= take
        node = node.parent  # type: ignore[assignment]  # n <= path length
    return [t for part in reversed(parts) for t in part]
