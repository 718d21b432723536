"""Drafts from a smaller model with the target's tokenizer, run beside the target as a
worker of its own (weights, KV pool, radix cache, scheduler) on the same device.

Each step, every drafting request becomes a greedy request of the draft worker for its k
tokens, whose prompt is the target request's whole sequence; the draft worker runs them
together to the end. Its radix cache keeps what it computed for the request last step
(the sequence and the drafts, as far as the target kept them), so a step computes only
the tokens added since, then k decode steps, batched over the drafting requests. What
the draft model proposes only decides how many tokens a step keeps, never which
(verification is the target's: speculative/verify.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from radixmesh.sampling_params import SamplingParams
from radixmesh.worker.request import FinishReason, Request


class _Steps(Protocol):  # the draft worker's Scheduler
    def add_request(self, req: Request) -> None: ...
    def has_work(self) -> bool: ...
    def step(self) -> list[Request]: ...


class DraftModelDrafter:
    def __init__(self, scheduler: _Steps, context_len: int) -> None:
        self.scheduler = scheduler
        self.context_len = context_len  # the draft model's

    def propose(self, req: Request, k: int) -> list[int]:
        return self.propose_all([(req, k)]).get(req, [])

    def propose_all(self, wanted: Sequence[tuple[Request, int]]) -> dict[Request, list[int]]:
        """Each request's draft of up to k tokens, one draft-model run for all of them."""
        shadows: dict[Request, Request] = {}
        for req, k in wanted:
            k = min(k, self.context_len - len(req.token_ids) - 1)
            if k < 1:
                continue  # longer than the draft model's context
            params = SamplingParams(temperature=0.0, max_new_tokens=k, ignore_eos=True)
            shadow = Request(rid=f"draft-{req.rid}", prompt_ids=list(req.token_ids), params=params)
            self.scheduler.add_request(shadow)
            shadows[req] = shadow
        while self.scheduler.has_work():
            self.scheduler.step()
        return {
            req: s.output_ids
            for req, s in shadows.items()
            if s.finish_reason is FinishReason.LENGTH
        }
