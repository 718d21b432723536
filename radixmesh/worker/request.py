"""A request's state inside the worker: token ids and counters, no modes.

`token_ids` holds the prompt followed by every generated token. `num_computed_tokens`
of them have KV in the cache (their slots are row `row` of the req->token table). Each
step the scheduler computes some of the remaining `num_tokens - num_computed_tokens`:
the whole uncached prompt (possibly in chunks), then one token per step. When a step
computes up to `num_tokens`, its last logits are sampled and the sequence grows by one.
Prefill and decode are the same thing at different lengths.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from radixmesh.sampling_params import SamplingParams
from radixmesh.worker.request_output import (
    Delivery,
    PromptTokenLogprob,
    RequestOutput,
    TokenLogprob,
)

if TYPE_CHECKING:
    from radixmesh.worker.constrained.request_grammar import RequestGrammar
    from radixmesh.worker.detokenizer import IncrementalDetokenizer
    from radixmesh.worker.kvcache.tree_node import TreeNode


class Pooling(enum.StrEnum):
    MEAN = "mean"  # the mean of every prompt position's final hidden state
    LAST = "last"  # the last prompt position's


@dataclass
class HiddenPool:
    """An embedding request's pooled final hidden states, filled chunk by chunk.

    Mean pooling sums positions 0, 1, ... in order; rows of positions already counted
    (recomputed after a retraction) are left out, so each position counts once."""

    pooling: Pooling
    total: torch.Tensor | None = None  # [hidden] float32: the sum, or the last row
    count: int = 0  # positions pooled so far (mean)

    def wanted(self, start: int, num_new: int, num_tokens: int) -> tuple[int, int]:
        """Which of a step's rows (positions start.. start + num_new) to pool, as a range
        of row offsets within the step's rows for this request."""
        if self.pooling is Pooling.LAST:
            end = start + num_new
            return (num_new - 1, num_new) if end == num_tokens else (0, 0)
        return max(self.count - start, 0), num_new

    def add(self, first: int, count: int, value: torch.Tensor) -> None:
        if self.pooling is Pooling.LAST:
            self.total = value
        elif first == self.count:
            self.total = value if self.total is None else self.total + value
            self.count += count

    def vector(self) -> list[float]:
        assert self.total is not None
        v = self.total / self.count if self.pooling is Pooling.MEAN else self.total
        return [float(x) for x in v.cpu().tolist()]


class FinishReason(enum.StrEnum):
    STOP = "stop"  # eos, a stop token id or a stop string
    LENGTH = "length"  # max_new_tokens or the context length
    ABORT = "abort"  # aborted by the client, a disconnect, or an error


Sink = Callable[[RequestOutput], None]


@dataclass(eq=False)
class Request:
    rid: str
    prompt_ids: Sequence[int]  # a tuple from the engine (engine_inputs.normalize_inputs)
    params: SamplingParams
    sink: Sink | None = None
    stop_ids: frozenset[int] = frozenset()
    arrival_time: float = field(default_factory=time.monotonic)
    delivery: Delivery = Delivery.STEPS  # which outputs the sink gets
    outputs_sent: int = 0  # outputs handed to the sink so far

    token_ids: list[int] = field(init=False)
    num_prompt_tokens: int = field(init=False)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the radix cache (first admission)
    num_host_cached_tokens: int = 0  # of those, the ones reloaded from host memory
    reloaded_tokens: int = 0  # prompt tokens its admission copied back from host memory
    row: int | None = None  # row in the req->token table while running
    last_node: TreeNode | None = None  # the radix node locked for its shared prefix
    num_shared_tokens: int = 0  # leading tokens whose slots belong to the tree (locked)
    generator: torch.Generator | None = None
    detokenizer: IncrementalDetokenizer | None = None
    grammar: RequestGrammar | None = None  # when params set a constraint (attached on add)
    finish_reason: FinishReason | None = None
    matched_stop: str | int | None = None
    error: str | None = None
    num_retractions: int = 0
    admitted: bool = False
    admit_time: float | None = None  # when first admitted (a retraction keeps it)
    first_token_time: float | None = None
    # Logprobs accumulated for the final meta_info.
    output_token_logprobs: list[TokenLogprob] = field(default_factory=list)
    output_top_logprobs: list[list[TokenLogprob]] = field(default_factory=list)
    input_token_logprobs: list[PromptTokenLogprob] = field(default_factory=list)
    input_top_logprobs: list[list[TokenLogprob]] = field(default_factory=list)
    # Set by the policy (lpm/dfs-weight) when it ordered the queue this step.
    prefix_hint: int = 0
    # Embedding requests (max_new_tokens 0): their pooled final hidden states.
    hidden_pool: HiddenPool | None = None
    # Speculative decoding (worker/speculative/): steps that verified drafts, and tokens.
    spec_verify_steps: int = 0
    spec_drafted_tokens: int = 0
    spec_accepted_tokens: int = 0

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_ids)
        self.num_prompt_tokens = len(self.prompt_ids)
        if self.params.seed is not None:
            self.generator = torch.Generator().manual_seed(self.params.seed)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def remaining_new_tokens(self) -> int:
        return self.params.max_new_tokens - self.num_output_tokens

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.params.return_logprob and self.params.logprob_start_len is not None

    def max_prefix_match(self) -> int:
        """How many leading tokens may come from the cache.

        At least one token is always computed, so the step that reaches the end has
        logits to sample from; prompt logprobs need their positions computed.
        """
        limit = self.num_tokens - 1
        if self.hidden_pool is not None and self.hidden_pool.pooling is Pooling.MEAN:
            return 0  # every position's hidden state is needed: none from the cache
        if self.wants_prompt_logprobs and self.params.logprob_start_len is not None:
            # Token i's logprob comes from position i-1's logits: compute from start-1.
            limit = min(limit, self.params.logprob_start_len - 1)
        return max(limit, 0)

    def finish(self, reason: FinishReason, matched: str | int | None = None) -> None:
        self.finish_reason = reason
        self.matched_stop = matched
