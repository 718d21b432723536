"""What the scheduler hands to the model runner, and what comes back."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from radixmesh.worker.request import Request


@dataclass
class ScheduledRequest:
    req: Request
    num_new_tokens: int  # tokens computed this step, starting at req.num_computed_tokens

    @property
    def start(self) -> int:
        return self.req.num_computed_tokens

    @property
    def samples(self) -> bool:
        """True when this step reaches the end of the sequence: its last logits are sampled."""
        return self.start + self.num_new_tokens == self.req.num_tokens


@dataclass
class Batch:
    items: list[ScheduledRequest]
    out_cache_loc: torch.Tensor  # [T] slots of the new tokens, in item order

    @property
    def num_tokens(self) -> int:
        return sum(item.num_new_tokens for item in self.items)


@dataclass
class PromptLogprobs:
    """Logprobs of prompt tokens covered by one step: token at position `first + i`."""

    first: int
    logprobs: list[float]
    top: list[list[tuple[int, float]]] = field(default_factory=list)


@dataclass
class PooledRows:
    """Final hidden states of one item's prompt positions `first`, ..., `first + count - 1`,
    pooled on the device: their float32 sum (mean pooling) or the last one's (last)."""

    first: int
    count: int
    value: torch.Tensor  # [hidden] float32


@dataclass
class ForwardOutput:
    """Per item of the batch (same order): the sampled token and logprobs."""

    next_token_ids: list[int | None]
    logprobs: list[float | None]
    top_logprobs: list[list[tuple[int, float]] | None]
    prompt_logprobs: list[PromptLogprobs | None]
    # Embedding requests' rows of this step (None for the others).
    hidden: list[PooledRows | None] = field(default_factory=list)
