"""The drafters by name: `--speculative ngram|radix` (SpeculativeConfig.speculative)."""

from __future__ import annotations

from typing import Protocol

from radixmesh.worker.config import SpeculativeConfig
from radixmesh.worker.kvcache.radix_cache import RadixCache
from radixmesh.worker.request import Request
from radixmesh.worker.speculative.ngram import NgramDrafter
from radixmesh.worker.speculative.radix import RadixDrafter


class Drafter(Protocol):
    def propose(self, req: Request, k: int) -> list[int]:
        """Up to k tokens likely to follow `req.token_ids` (all real ids); [] for none."""
        ...


def create_drafter(config: SpeculativeConfig, cache: RadixCache) -> Drafter:
    ngram = NgramDrafter(config.speculative_ngram_min, config.speculative_ngram_max)
    if config.speculative == "ngram":
        return ngram
    if config.speculative == "radix":
        return RadixDrafter(cache, ngram)
    raise ValueError(f"speculative: no drafter named {config.speculative!r}")
