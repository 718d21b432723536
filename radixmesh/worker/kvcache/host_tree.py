"""The radix tree's host-memory half: what moves nodes between the device and host memory.

Functions of the tree (`TreeCore`; radix_cache.py has the rules and calls them), apart
because they are the second tier's concern: offloading an evicted device leaf
(`evict_node`: host slots taken, its KV copied out, the node kept host-only), the host
pool's own LRU (`evict_host`), a match's continuation in host memory (`walk_host`),
reloads (`load_host`, finished by `poll_loads` on CUDA, where the copy runs beside the
forwards) and inserts over host-only nodes (`adopt`). Without a tier (`tree.tier`
None) none of them runs but `evict_node`'s removal. They keep the tree's counters and
sets, which are theirs as much as its own methods'.

Host slots are guarded by `host_ref`: a node whose host slots an unissued copy-out or an
unfinished reload uses is never dropped from host memory.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

import torch

from radixmesh.worker.kvcache.tree_core import TreeCore
from radixmesh.worker.kvcache.tree_node import MatchResult, TreeNode


def load_host(tree: TreeCore, match: MatchResult) -> MatchResult:
    """Bring a match's host-only nodes to the device; the match extended over them.

    Takes device slots (evicting, which may offload other nodes) and copies the KV
    into them. Returns `match` unchanged when there are no host nodes or no device
    room for them. On the CPU the copy is done on return: the caller locks the
    returned `last_node` before anything else can evict. On CUDA it runs beside the
    forwards (host_tier.py): the returned match is `pending` and the nodes stay locked
    and out of matches (`match_prefix` stops before them) until `poll_loads` sees
    the copy done; the prompt is matched again then.
    """
    nodes = match.host_nodes
    if not nodes or tree.tier is None:
        return match
    if any(n.value is not None or n.host_value is None for n in nodes):
        raise RuntimeError("load_host: the match's host nodes changed since the match")
    n = sum(len(nd.key) for nd in nodes)
    tree.inc_lock_ref(match.last_node)  # eviction below must not take the device part
    for nd in nodes:
        nd.host_ref += 1  # nor may host eviction (from the offloads) take these
    try:
        dev = tree.allocator.alloc(n, on_host=True)
        if dev is None:
            tree.evict(n)
            dev = tree.allocator.alloc(n, on_host=True)
    finally:
        for nd in nodes:
            nd.host_ref -= 1
        tree.dec_lock_ref(match.last_node)
    if dev is None:
        return match
    host = [nd.host_value for nd in nodes if nd.host_value is not None]
    done = tree.tier.load(host[0] if len(host) == 1 else torch.cat(host), dev)
    offset = 0
    for nd in nodes:
        make_resident(tree, nd, dev[offset : offset + len(nd.key)])
        offset += len(nd.key)
    if done is None:
        return MatchResult(torch.cat([match.slots, dev]), nodes[-1])
    for nd in nodes:  # until the copy is done: its source stays, its target is not read
        nd.host_ref += 1
        nd.loading = True
    tree.inc_lock_ref(nodes[-1])
    tree._loads.append((done, list(nodes)))
    return MatchResult(match.slots, match.last_node, pending=True)


def poll_loads(tree: TreeCore, wait: bool = False) -> int:
    """Finish the reloads whose copies are done (all of them, waiting, with `wait`):
    their nodes become ordinary device nodes. Returns how many are still copying."""
    for nodes in _finished(tree, tree._loads, wait):
        for nd in nodes:
            nd.loading = False
        tree.dec_lock_ref(nodes[-1])
    return len(tree._loads)


def poll_writes(tree: TreeCore, wait: bool = False) -> int:
    """Finish the write-throughs whose copies are done (all, waiting, with `wait`)."""
    for nodes in _finished(tree, tree._writes, wait):
        for nd in nodes:
            nd.writing = False
    return len(tree._writes)


def _finished(
    tree: TreeCore, records: deque[tuple[torch.cuda.Event, list[TreeNode]]], wait: bool
) -> Iterator[list[TreeNode]]:
    """The nodes of each copy in `records` (oldest first) that is done, taken out of
    `records` with their hold on their host slots released; stops at the first that is
    not (or waits for each, with `wait`)."""
    tier = tree.tier
    while records:
        assert tier is not None  # only a tier makes copies
        done, nodes = records[0]
        if not tier.finished(done, wait):
            return
        records.popleft()
        for nd in nodes:
            nd.host_ref -= 1
        yield nodes


def _take_host(tree: TreeCore, node: TreeNode, host: torch.Tensor) -> None:
    """`node` holds host slots `host` from now on, held (host_ref) until its copy is done."""
    node.host_value = host
    node.host_ref += 1
    tree._host_nodes.add(node)
    tree._host_size += len(node.key)


def write_through(tree: TreeCore) -> None:
    """Copy the nodes made since the last call to host slots now, beside the forwards
    (`tree.write_through`): when the device evicts them later, nothing is left to copy.
    A node gone or offloaded since is skipped, and so is the rest when host memory has
    no room it may take."""
    nodes, tree._new_nodes = tree._new_nodes, []
    tier = tree.tier
    assert tier is not None
    todo: list[TreeNode] = []
    for node in nodes:
        if node.parent is None or node.value is None or node.host_value is not None:
            continue
        host = host_alloc(tree, len(node.key))
        if host is None:
            break
        _take_host(tree, node, host)  # held: the next alloc must not drop it
        todo.append(node)
    if not todo:
        return
    dev = [n.value for n in todo if n.value is not None]
    host_slots = [n.host_value for n in todo if n.host_value is not None]
    done = tier.write_async(torch.cat(dev), torch.cat(host_slots))
    if done is None:
        for node in todo:
            node.host_ref -= 1
        return
    for node in todo:
        node.writing = True
    tree._writes.append((done, todo))


def pending_cut(tree: TreeCore, node: TreeNode) -> TreeNode | None:
    """The parent of the highest node still loading on the path root..node (None: no
    node on it is loading)."""
    cut = None
    while node is not tree.root:
        if node.loading:
            cut = node.parent
        node = node.parent  # type: ignore[assignment]  # attached: parent is set
    return cut


def adopt(
    tree: TreeCore,
    tokens: list[int],
    limit: int,
    slots: torch.Tensor,
    node: TreeNode,
    pos: int,
) -> tuple[TreeNode, int]:
    """An insert past the device's part over host-only nodes: they take the caller's
    slots for their tokens (its computed KV is theirs). Returns where it stopped."""
    for child, start in _host_path(tree, tokens, limit, node, pos):
        make_resident(tree, child, slots[start : start + len(child.key)].clone())
        node, pos = child, start + len(child.key)
    return node, pos


def walk_host(
    tree: TreeCore, tokens: list[int], limit: int, node: TreeNode, pos: int
) -> tuple[TreeNode, ...]:
    """The host-only nodes that continue a device walk ending at `node` (at `pos`)."""
    return tuple(child for child, _ in _host_path(tree, tokens, limit, node, pos))


def _host_path(
    tree: TreeCore, tokens: list[int], limit: int, node: TreeNode, pos: int
) -> Iterator[tuple[TreeNode, int]]:
    """The host-only nodes below `node` (at `pos`) that tokens[pos:limit] runs through,
    each with the position it starts at; the last is split where the tokens end inside
    it, and each is touched (LRU). Every node below a host-only one is host-only."""
    while pos < limit:
        child = node.children.get(tree._child_key(tokens, pos))
        if child is None:
            return
        common = tree._common_len(child.key, tokens, pos, limit)
        if common == 0:
            return
        if common < len(child.key):
            child = tree._split(child, common)
        child.last_access = tree._clock
        yield child, pos
        node, pos = child, pos + common


def make_resident(tree: TreeCore, node: TreeNode, value: torch.Tensor) -> None:
    """A host-only node (its parent on the device) gets device slots: now on both."""
    parent = node.parent
    assert parent is not None and node.value is None
    node.value = value
    parent.device_children += 1
    tree._leaves.discard(parent)
    if node.device_children == 0:
        tree._leaves.add(node)
    tree._evictable += len(node.key)
    tree._host_only -= len(node.key)
    tree._loaded += len(node.key)
    if tree._listeners.active:
        tree._emit("loaded", node)


def write_copies(tree: TreeCore, copies: list[tuple[TreeNode, torch.Tensor, torch.Tensor]]) -> None:
    """Copy offloaded nodes' KV to their host slots. A node removed since (its parent
    evicted with no host room left) no longer holds those slots and is skipped."""
    assert tree.tier is not None
    if tree._writes:  # host slots a write-through still fills may be among these (freed)
        tree.tier.order_after(tree._writes[-1][0])
    kept = [(dev, host) for node, dev, host in copies if node.host_value is host]
    for node, _, _ in copies:
        node.host_ref -= 1
    if kept:
        tree.tier.write(torch.cat([d for d, _ in kept]), torch.cat([h for _, h in kept]))


def evict_node(
    tree: TreeCore, node: TreeNode, copies: list[tuple[TreeNode, torch.Tensor, torch.Tensor]]
) -> TreeNode:
    """Take an unlocked device leaf off the device: offloaded when it has (or gets)
    host slots, else removed with its host-only subtree. Returns its parent."""
    if tree.tier is not None and node.host_value is None:
        host = host_alloc(tree, len(node.key))
        if host is not None:
            assert node.value is not None
            _take_host(tree, node, host)  # held until `evict` issues its copy
            copies.append((node, node.value, host))
    if node.host_value is None:
        return remove_subtree(tree, node)
    if node.writing:  # its slots are free for the next forward once its copy is done
        assert tree.tier is not None
        tree.tier.order_after(tree._writes[-1][0])  # the stream's last: all before it too
    parent = node.parent
    assert parent is not None
    node.value = None
    parent.device_children -= 1
    tree._evictable -= len(node.key)
    tree._host_only += len(node.key)
    tree._offloaded += len(node.key)
    tree._leaves.discard(node)
    if parent is not tree.root and parent.device_children == 0:
        tree._leaves.add(parent)
    if tree._listeners.active:
        tree._emit("offloaded", node)
    return parent


def host_alloc(tree: TreeCore, n: int) -> torch.Tensor | None:
    """n host slots, evicting host memory's LRU nodes if short; None if it cannot."""
    assert tree.tier is not None
    host = tree.tier.alloc(n)
    if host is None:
        evict_host(tree, n)
        host = tree.tier.alloc(n)
    return host


def evict_host(tree: TreeCore, num_tokens: int) -> int:
    """Free host slots: first the copies of nodes also on the device (dropping one loses
    nothing: the device still has it), then host-only leaves, which leave the tree (and
    may make their parents candidates); least recently used first within each."""
    assert tree.tier is not None
    heap = [
        (n.value is None, n.last_access, n.id, n)
        for n in tree._host_nodes
        if n.host_ref == 0 and (n.value is not None or not n.children)
    ]
    heapq.heapify(heap)
    freed: list[torch.Tensor] = []
    num_freed = 0
    while num_freed < num_tokens and heap:
        node = heapq.heappop(heap)[3]
        num_freed += len(node.key)
        freed.append(drop_host(tree, node))
        if node.value is None:
            parent = tree._detach(node)
            if (
                parent is not tree.root
                and parent.value is None
                and not parent.children
                and parent.host_ref == 0
            ):
                heapq.heappush(heap, (True, parent.last_access, parent.id, parent))
    if freed:
        tree.tier.free(torch.cat(freed))
    return num_freed


def drop_host(tree: TreeCore, node: TreeNode) -> torch.Tensor:
    """Forget a node's host slots (returned: the caller frees them)."""
    host = node.host_value
    assert host is not None
    node.host_value = None
    tree._host_nodes.discard(node)
    tree._host_size -= len(node.key)
    if node.value is None:
        tree._host_only -= len(node.key)
    return host


def remove_subtree(tree: TreeCore, node: TreeNode) -> TreeNode:
    """Remove an unlocked device leaf and the host-only nodes below it; returns its parent."""
    below = tree._iter_nodes(node)
    host = [drop_host(tree, n) for n in (*below, node) if n.host_value is not None]
    for n in reversed(below):  # leaves first
        tree._detach(n)
    if host:
        assert tree.tier is not None
        tree.tier.free(torch.cat(host))
    return tree._detach(node)
