"""Drafts from the radix tree: the tokens that followed the request's whole sequence in
an earlier request (a finished one's output stays in the tree with its prompt), else the
n-gram drafter's. No other system drafts from its prefix cache; programs that run the
same prompt again (a retried call, `fork` branches, a batch over one template with
repeated inputs) get the earlier output as a draft that costs nothing.
"""

from __future__ import annotations

from radixmesh.worker.kvcache.radix_cache import RadixCache
from radixmesh.worker.request import Request
from radixmesh.worker.speculative.ngram import NgramDrafter


class RadixDrafter:
    def __init__(self, cache: RadixCache, fallback: NgramDrafter) -> None:
        self.cache = cache
        self.fallback = fallback

    def propose(self, req: Request, k: int) -> list[int]:
        # The request's locked node spells its first tokens: the walk starts there.
        start = req.last_node if req.last_node is not None and req.last_node.parent else None
        draft = self.cache.continuation(req.token_ids, k, start)
        return draft if draft else self.fallback.propose(req, k)
