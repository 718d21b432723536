"""What the scheduler hands to the model runner, and what comes back."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from radixmesh.worker.request import Request


@dataclass
class ScheduledRequest:
    req: Request
    num_new_tokens: int  # tokens computed this step, starting at req.num_computed_tokens
    # Speculative decoding: tokens drafted after the request's last one, computed with it
    # (num_new_tokens = 1 + len(draft)) and verified (worker/speculative/). An empty
    # tuple by default, not a new list per row per step, each alive as long as its step
    # (so the garbage collector counted and visited them).
    draft: Sequence[int] = ()
    # With a grammar: the allowed tokens at each of the row's 1 + len(draft) positions
    # (`[1 + len(draft), W]` int32, GrammarManager.check_draft).
    draft_mask: torch.Tensor | None = None

    @property
    def start(self) -> int:
        return self.req.num_computed_tokens

    @property
    def samples(self) -> bool:
        """True when this step reaches the end of the sequence: its last logits are sampled
        (a drafting row's are all verified instead)."""
        return not self.draft and self.start + self.num_new_tokens == self.req.num_tokens


@dataclass
class Draft:
    """One request's drafted tokens for a step, and its grammar's masks (see above)."""

    tokens: list[int]
    mask: torch.Tensor | None = None


@dataclass
class Batch:
    items: list[ScheduledRequest]
    # [T] slots of the new tokens, in item order, on the host (the scheduler's): the runner
    # moves them with the step's other inputs (ForwardBatch.build)
    out_cache_loc: torch.Tensor
    # speculative='eagle': whether the step's drafter keeps the target's features. The
    # scheduler clears it for a step too large to draft, or with no request that may
    # draft: the runner then copies none (Speculator.keeps_features).
    keep_features: bool = True

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
class PendingTokens:
    """The ids a step sampled, one per sampled item (`sample_items`, ascending item
    indices): on the device, where the next step's inputs may read them before the host
    has them, and copied to the host behind the forward. Sampled row j also stands in a
    request's token ids as `placeholder(j)` (< 0) until the host has read it."""

    sample_items: list[int]
    ids: torch.Tensor  # [N] on the device
    host: torch.Tensor  # [N] on the host (pinned and filled asynchronously on CUDA)
    event: torch.cuda.Event | None = None  # recorded after the copy; None on the CPU
    base: int = 1  # placeholder(j) = -(base + j)

    def placeholder(self, j: int) -> int:
        return -(self.base + j)

    def token_ids(self) -> list[int]:
        """Waits for this step alone, not for the steps launched after it."""
        if self.event is not None:
            self.event.synchronize()
        return [int(t) for t in self.host.tolist()]


NO_TOKENS = PendingTokens([], torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64))


@dataclass
class Verified:
    """A drafting row's outcome: the tokens it adds (the accepted drafts and the token
    sampled after them), with their logprobs when the request asked."""

    tokens: list[int]
    logprobs: list[float | None]
    top_logprobs: list[list[tuple[int, float]] | None]

    @property
    def accepted(self) -> int:
        return len(self.tokens) - 1


@dataclass
class ForwardOutput:
    """Per item of the batch (same order): the sampled token and logprobs. The tokens are
    pending (`tokens`); logprobs are on the host, computed only for the items that ask
    (which waits for the step)."""

    tokens: PendingTokens
    logprobs: list[float | None]
    top_logprobs: list[list[tuple[int, float]] | None]
    prompt_logprobs: list[PromptLogprobs | None]
    # Embedding requests' rows of this step (None for the others).
    hidden: list[PooledRows | None] = field(default_factory=list)
    # Drafting rows' outcomes (None for the others), on the host once `read_verified`
    # ran: the forward leaves them on the device (`pending_verified` reads them back).
    verified: list[Verified | None] = field(default_factory=list)
    pending_verified: Callable[[], list[tuple[int, Verified]]] | None = None
    # A sampled (not plain greedy) step's draw, not yet run (`draw`): it fills `tokens`'
    # ids and the logprobs. `tokens` already holds the rows' placeholders.
    pending_draw: Callable[[], None] | None = None
    # speculative='eagle': the final hidden rows [n, hidden] of each item that may draft,
    # a copy on the device (empty list when no drafter reads them).
    features: list[torch.Tensor | None] = field(default_factory=list)

    @classmethod
    def empty(cls, num_items: int) -> ForwardOutput:
        none: list[None] = [None] * num_items
        return cls(NO_TOKENS, list(none), list(none), list(none), list(none), list(none))

    def draw(self) -> None:
        """Run the step's deferred draw (ModelRunner._sample), once; nothing if none. On
        CUDA a sampled draw waits for the forward (the sampler reads which rows its top-k
        window decided, and copies per-row parameters from pageable memory), so the
        overlap scheduler runs it as late as it can: after building the next step and
        before launching it (overlap.py)."""
        if self.pending_draw is not None:
            run, self.pending_draw = self.pending_draw, None
            run()

    def read_verified(self) -> None:
        """The drafting rows' outcomes onto `verified` (waits for the step)."""
        if self.pending_verified is not None:
            pending, self.pending_verified = self.pending_verified, None
            for i, v in pending():
                self.verified[i] = v

    def next_token_ids(self) -> list[int | None]:
        """Per item: its sampled token, or None (waits for this step's tokens)."""
        self.draw()
        out: list[int | None] = [None] * len(self.logprobs)
        for i, token in zip(self.tokens.sample_items, self.tokens.token_ids(), strict=True):
            out[i] = token
        return out


@dataclass
class Launched:
    """A step the scheduler launched: its batch, its pending output, and where each sampled
    request's placeholder token stands (so resolving puts the real token there)."""

    batch: Batch
    out: ForwardOutput
    samples: list[bool]  # per item: the step reached the end of the sequence
    positions: list[int]  # per sampled row: the index of its placeholder in req.token_ids
