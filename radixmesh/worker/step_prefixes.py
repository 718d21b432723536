"""The prefixes one scheduling step is about to compute, for deferring the waiting requests
that would compute them again.

When a waiting request's uncached part starts with tokens that a request admitted in the
same step is about to compute, admitting both computes that prefix twice. Deferring the
second one a step turns its prefill into a cache hit (a burst of requests on one new
prefix otherwise all prefill it side by side). The rule: a waiting request C is deferred
when a request A admitted in this step was matched to the same tree node (C's cached
prefix is A's) and A's next `threshold` tokens after it equal C's.

What a check costs decides how long a step takes with a long queue. On the shared-prefix
benchmark (1,024 waiting requests in 16 groups of 64 on a 1,536-token prefix) a step
that admits the first request of a new group defers the other 63, and the scan before
this module compared every waiting request token by token with every admitted one in
Python (22.8 ms of the first step's 22.8 ms on the 2-core CPU; bench/schedule_overhead.py).
Two indexes make a check O(1):

- `by_node`: (node, the next `threshold` tokens) of every admitted request. A deferral
  then costs the candidate's own prefix match (a walk of the tree) and one set lookup,
  not a comparison with every admitted request.
- `heads`: the first `head_len` tokens of admitted requests whose cached part ends
  within their first `head_len - max(threshold, page_size)` tokens (a new prefix: the
  common case). A candidate with the same first `head_len` tokens walks the tree the
  same way to the same node and has the same next tokens, so it is deferred by the rule
  above without its prefix match: a tuple hash of 64 tokens instead of a walk of 1,600.
  Both requests must be allowed to match at least `head_len` tokens from the cache (a
  request asking prompt logprobs may not be), or their walks could stop elsewhere.
"""

from __future__ import annotations

from radixmesh.worker.kvcache.tree_node import TreeNode
from radixmesh.worker.request import Request


class StepPrefixes:
    """The requests admitted so far in one step, indexed for `defers`."""

    def __init__(self, threshold: int, page_size: int) -> None:
        self.threshold = threshold
        # Long enough that an admitted request with a cached part of up to `threshold`
        # tokens has its whole deciding window (and the page its walk stopped at) inside.
        self.head_len = threshold + max(threshold, page_size)
        self._by_node: set[tuple[int, tuple[int, ...]]] = set()
        self._heads: set[tuple[int, ...]] = set()

    def defers_without_match(self, req: Request) -> bool:
        """Whether `req` shares its first `head_len` tokens with an admitted new prefix."""
        if not self._heads or req.max_prefix_match() < self.head_len:
            return False
        return tuple(req.token_ids[: self.head_len]) in self._heads

    def defers(self, req: Request, node: TreeNode) -> bool:
        """Whether `req`, matched to `node`, starts its uncached part with the tokens an
        admitted request matched to the same node computes next."""
        if not self._by_node:
            return False
        return self._key(req, node) in self._by_node

    def add(self, req: Request, node: TreeNode) -> None:
        """`req` was admitted, matched to `node`."""
        key = self._key(req, node)
        if len(key[1]) == self.threshold:  # a shorter window defers nobody
            self._by_node.add(key)
        window = self.head_len - self.threshold  # max(threshold, page_size)
        if node.end + window <= self.head_len and req.max_prefix_match() >= self.head_len:
            self._heads.add(tuple(req.token_ids[: self.head_len]))

    def _key(self, req: Request, node: TreeNode) -> tuple[int, tuple[int, ...]]:
        start = node.end
        return id(node), tuple(req.token_ids[start : start + self.threshold])
