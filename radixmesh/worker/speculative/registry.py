"""The drafters by name: `--speculative ngram|radix|draft|eagle`
(SpeculativeConfig.speculative)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from radixmesh.worker.config import SpeculativeConfig
from radixmesh.worker.kvcache.radix_cache import RadixCache
from radixmesh.worker.request import Request
from radixmesh.worker.speculative.ngram import NgramDrafter
from radixmesh.worker.speculative.radix import RadixDrafter


class Drafter(Protocol):
    def propose(self, req: Request, k: int) -> list[int]:
        """Up to k tokens likely to follow `req.token_ids` (all real ids); [] for none."""
        ...


def propose_all(
    drafter: Drafter, wanted: Sequence[tuple[Request, int]]
) -> dict[Request, list[int]]:
    """Drafts for several requests: in one batch where the drafter can (a draft model),
    else one by one."""
    batched = getattr(drafter, "propose_all", None)
    if batched is not None:
        out: dict[Request, list[int]] = batched(wanted)
        return out
    return {req: drafter.propose(req, k) for req, k in wanted}


def observe(drafter: Drafter, req: Request, start: int, features: torch.Tensor) -> None:
    """The target's final hidden rows [n, H] of positions start .. start + n - 1 of `req`,
    to a drafter that reads them (an EAGLE head); the others ignore them."""
    take = getattr(drafter, "observe", None)
    if take is not None:
        take(req, start, features)


def forget_all(drafter: Drafter) -> None:
    """Drop what a drafter keeps for every request (the others keep nothing)."""
    drop = getattr(drafter, "forget_all", None)
    if drop is not None:
        drop()


def create_drafter(
    config: SpeculativeConfig, cache: RadixCache, draft: Drafter | None = None
) -> Drafter:
    """`draft`: the drafter the worker built around a model (speculative='draft': the
    draft model's worker; 'eagle': the head over the target's features)."""
    if config.speculative in ("draft", "eagle"):
        if draft is None:
            raise ValueError(f"speculative: {config.speculative!r} needs the worker's drafter")
        return draft
    ngram = NgramDrafter(config.speculative_ngram_min, config.speculative_ngram_max)
    if config.speculative == "ngram":
        return ngram
    if config.speculative == "radix":
        return RadixDrafter(cache, ngram)
    raise ValueError(f"speculative: no drafter named {config.speculative!r}")
