"""Which requests draft in a step, how many tokens, and when a request stops drafting.

A step drafts only while at most `speculative_max_batch_size` requests run (a large batch
is bound by compute, where rejected drafts cost what accepted ones save). A request
drafts when it decodes (its next token is its last one, read back on the host), did not
opt out (`SamplingParams.speculative`), and is not resting: a request whose drafts are accepted at
less than `speculative_min_accept_rate` (a moving average over its verify steps) rests
for a number of output tokens that doubles each time (8, 16, ... 256), then tries again.
Drafts never run past max_new_tokens or the context. A constrained request's draft is
cut where its grammar stops allowing it, and carries the grammar's masks at each position
for verification (text the grammar forces is not drafted: jump-forward appends it).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from radixmesh.worker.batch import Draft
from radixmesh.worker.config import SpeculativeConfig
from radixmesh.worker.constrained.manager import GrammarManager
from radixmesh.worker.request import Request
from radixmesh.worker.speculative.registry import (
    Drafter,
    forget_all,
    observe,
    propose_all,
)

_EMA = 0.3  # weight of the latest verify step in a request's acceptance average
_FIRST_REST = 8  # output tokens a request rests the first time its drafts fail
_MAX_REST = 256


@dataclass
class _State:
    accept_rate: float = 1.0  # moving average of accepted / drafted tokens
    rest: int = _FIRST_REST  # the next rest's length
    resume_at: int = 0  # no drafts before this many output tokens


@dataclass
class SpecStats:
    verify_steps: int = 0  # request-steps that verified drafts
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    accept_lengths: list[int] = field(default_factory=list)  # [k + 1]: steps by accepted


class Speculator:
    def __init__(
        self,
        config: SpeculativeConfig,
        drafter: Drafter,
        context_len: int,
        grammars: GrammarManager | None = None,
    ) -> None:
        self.config = config
        self.drafter = drafter
        self.context_len = context_len
        self.grammars = grammars
        self.stats = SpecStats(accept_lengths=[0] * (config.speculative_tokens + 1))
        self._states: weakref.WeakKeyDictionary[Request, _State] = weakref.WeakKeyDictionary()
        self._observing = True  # the last schedule's batch may draft: drafters keep features

    def may_draft(self, running: list[Request]) -> bool:
        """Whether the next step may draft for one of `running` (the overlap scheduler
        then steps synchronously: drafts read the last token on the host)."""
        if not running or len(running) > self.config.speculative_max_batch_size:
            return False
        return any(self._allowed(r) for r in running)

    def keeps_features(self, reqs: Iterable[Request]) -> bool:
        """Whether the step the last `drafts` call scheduled, over `reqs`, keeps the
        target's features: it may draft, and one of them may. Otherwise the runner makes
        no copy (a large batch's would be a gather over it all, for nothing)."""
        return self._observing and any(_may_speculate(r) for r in reqs)

    def drafts(self, running: list[Request]) -> dict[Request, Draft]:
        """Each drafting request's draft (non-empty) for the next step."""
        out: dict[Request, Draft] = {}
        self._observing = len(running) <= self.config.speculative_max_batch_size
        if not self._observing:
            # The runner hands back no features for this step, so nothing reaches
            # `observe` to drop a request's state: drop it all here (a retracted
            # request's too), keeping the drafter's memory bounded by the small batches.
            forget_all(self.drafter)
            return out
        wanted: list[tuple[Request, int]] = []
        for req in running:
            ids = req.token_ids
            if req.num_computed_tokens != len(ids) - 1 or ids[-1] < 0 or not self._allowed(req):
                continue
            k = min(
                self.config.speculative_tokens,
                req.remaining_new_tokens - 1,  # the step samples one more after them
                self.context_len - len(ids) - 1,
            )
            if k >= 1:
                wanted.append((req, k))
        if not wanted:
            return out
        proposed = propose_all(self.drafter, wanted)
        for req, k in wanted:
            draft = proposed.get(req, [])[:k]
            mask = None
            if draft and req.grammar is not None:
                if self.grammars is None or req.grammar.matcher is None:
                    continue
                draft, mask = self.grammars.check_draft(req, draft)
            if draft:
                out[req] = Draft(draft, mask)
        return out

    def observe(self, req: Request, start: int, features: torch.Tensor) -> None:
        """The target's final hidden rows [n, H] the request kept, from position `start`
        (for a drafter that reads them: eagle). While the batch is too large to draft,
        the drafter keeps nothing: that step's `drafts` call dropped every request's state
        (bounded memory outside the KV pool), and features are not taken."""
        if self._observing:
            observe(self.drafter, req, start, features)

    def record(self, req: Request, drafted: int, accepted: int) -> None:
        """A verify step's outcome for `req`: counters, and its rest when it fails."""
        s = self.stats
        s.verify_steps += 1
        s.drafted_tokens += drafted
        s.accepted_tokens += accepted
        if accepted >= len(s.accept_lengths):
            s.accept_lengths.extend([0] * (accepted + 1 - len(s.accept_lengths)))
        s.accept_lengths[accepted] += 1
        req.spec_verify_steps += 1
        req.spec_drafted_tokens += drafted
        req.spec_accepted_tokens += accepted
        state = self._state(req)
        state.accept_rate += _EMA * (accepted / drafted - state.accept_rate)
        if state.accept_rate < self.config.speculative_min_accept_rate:
            state.resume_at = req.num_output_tokens + state.rest
            state.rest = min(2 * state.rest, _MAX_REST)
            state.accept_rate = 1.0  # a fresh start after the rest

    def _allowed(self, req: Request) -> bool:
        if not _may_speculate(req):
            return False
        state = self._states.get(req)
        return state is None or req.num_output_tokens >= state.resume_at

    def _state(self, req: Request) -> _State:
        state = self._states.get(req)
        if state is None:
            state = self._states[req] = _State()
        return state


def _may_speculate(req: Request) -> bool:
    """Opted in (the default) and generating: an embedding request never drafts."""
    return req.params.speculative and req.hidden_pool is None
