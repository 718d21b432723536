"""Scheduling policies: the order in which waiting requests are admitted.

- `lpm` (longest prefix match first): the paper's cache-aware scheduling. Requests whose
  prompts share the most with the radix cache go first, so cached prefixes are reused
  before eviction pushes them out.
- `dfs-weight`: orders requests by a depth-first walk of the radix tree in which heavier
  subtrees (more waiting requests) are visited first, so requests sharing a prefix run
  back to back (the paper's DFS-order argument).
- `fcfs`: arrival order.

Matching every waiting prompt against the tree costs time linear in the queue; past
`fallback_queue_len` waiting requests the cache-aware policies fall back to fcfs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from radixmesh.worker.kvcache.radix_cache import RadixCache
from radixmesh.worker.kvcache.tree_node import TreeNode
from radixmesh.worker.request import Request


class Policy(ABC):
    def __init__(self, cache: RadixCache, fallback_queue_len: int) -> None:
        self.cache = cache
        self.fallback_queue_len = fallback_queue_len

    def order(self, waiting: list[Request]) -> list[Request]:
        """The waiting requests in admission order (a new list; `waiting` is untouched)."""
        if len(waiting) > self.fallback_queue_len or self.cache.disabled:
            return list(waiting)
        return self._order(waiting)

    @abstractmethod
    def _order(self, waiting: list[Request]) -> list[Request]: ...


class FCFSPolicy(Policy):
    def _order(self, waiting: list[Request]) -> list[Request]:
        return list(waiting)


class LPMPolicy(Policy):
    def _order(self, waiting: list[Request]) -> list[Request]:
        for req in waiting:
            match = self.cache.match_prefix(
                req.token_ids, end=req.max_prefix_match(), count_stats=False
            )
            req.prefix_hint = len(match.slots)
        # sorted() is stable: equal matches keep arrival order.
        return sorted(waiting, key=lambda r: -r.prefix_hint)


class DFSWeightPolicy(Policy):
    def _order(self, waiting: list[Request]) -> list[Request]:
        at_node: dict[int, list[Request]] = {}
        weight: dict[int, int] = {}
        first: dict[int, int] = {}  # earliest arrival in the subtree: breaks weight ties
        for arrival, req in enumerate(waiting):
            node: TreeNode | None = self.cache.match_prefix(
                req.token_ids, end=req.max_prefix_match(), count_stats=False
            ).last_node
            at_node.setdefault(id(node), []).append(req)
            while node is not None:  # every ancestor's subtree gains one request
                weight[id(node)] = weight.get(id(node), 0) + 1
                first.setdefault(id(node), arrival)
                node = node.parent
        ordered: list[Request] = []
        stack = [self.cache.root]
        while stack:
            node = stack.pop()
            ordered.extend(at_node.get(id(node), []))
            children = [c for c in node.children.values() if id(c) in weight]
            # Push the lightest (then latest) first so the heaviest is visited next.
            children.sort(key=lambda c: (weight[id(c)], -first[id(c)]))
            stack.extend(children)
        return ordered


_POLICIES: dict[str, Callable[[RadixCache, int], Policy]] = {
    "fcfs": FCFSPolicy,
    "lpm": LPMPolicy,
    "dfs-weight": DFSWeightPolicy,
}


def create_policy(name: str, cache: RadixCache, fallback_queue_len: int) -> Policy:
    if name not in _POLICIES:
        raise ValueError(f"policy: unknown {name!r}; choose one of {sorted(_POLICIES)}")
    return _POLICIES[name](cache, fallback_queue_len)
