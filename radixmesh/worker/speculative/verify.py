"""Verifying drafts: which of a row's drafted tokens the model keeps, and what follows.

A drafting row computes its last token and k drafts after it, so it has k + 1 positions'
logits. Each position is sampled under the request's own rules, as if the drafts before
it were already its output (penalties and min_new_tokens count them; a seeded request
draws in position order from its generator), and the drafts are kept while each equals
the draw at the position before it; the row adds the kept drafts and the draw after them.

Why this is exact: for a drafter that proposes one token per position (a point mass q),
speculative sampling accepts draft d with probability min(1, p(d) / q(d)) = p(d) and,
on rejection, draws from the residual max(0, p - q) normalized, which is p without d.
Drawing t ~ p and accepting d when t == d does both at once: d comes out with
probability p(d), and any other token t with probability p(t), which is p's residual.
So sampled output keeps the target distribution, and greedy rows keep the argmax.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from radixmesh.worker.batch import Verified
from radixmesh.worker.constrained.bitmask import TokenBitmask
from radixmesh.worker.sampler import (
    Draw,
    Sampler,
    SamplingRow,
    TopLogprobs,
    all_plain_greedy,
    reads_output_ids,
)


def verify_drafts(
    sampler: Sampler,
    logits: torch.Tensor,
    rows: Sequence[SamplingRow],
    drafts: Sequence[Sequence[int]],
    masks: Sequence[torch.Tensor | None] | None = None,
) -> list[Verified]:
    """`logits`: [sum(len(d) + 1)] rows, each drafting row's positions in order; `rows`:
    each drafting request's sampling row (its own output so far); `masks`: a constrained
    row's allowed tokens at each of its positions (GrammarManager.check_draft), else
    None. Returns each row's outcome, the tokens read back on the host (this waits for
    the device)."""
    return draw_drafts(sampler, logits, rows, drafts, masks).outcomes()


@dataclass
class DrawnDrafts:
    """Each drafting row's positions drawn on the device, not yet read back."""

    drafts: Sequence[Sequence[int]]
    draws: Draw

    def outcomes(self) -> list[Verified]:
        """Each row's outcome (reads the draws back: waits for the device)."""
        drawn = self.draws.token_ids.tolist()
        lps, tops = self.draws.logprobs, self.draws.top_logprobs
        out: list[Verified] = []
        at = 0
        for draft in self.drafts:
            n = len(draft)
            accepted = 0
            while accepted < n and drawn[at + accepted] == draft[accepted]:
                accepted += 1
            end = at + accepted + 1  # the kept drafts and the draw after them
            kept_lps: list[float | None] = lps[at:end] if lps is not None else [None] * (end - at)
            kept_tops: list[TopLogprobs | None] = (
                [*tops[at:end]] if tops is not None else [None] * (end - at)
            )
            out.append(Verified(drawn[at:end], kept_lps, kept_tops))
            at += n + 1
        return out


def draw_drafts(
    sampler: Sampler,
    logits: torch.Tensor,
    rows: Sequence[SamplingRow],
    drafts: Sequence[Sequence[int]],
    masks: Sequence[torch.Tensor | None] | None = None,
) -> DrawnDrafts:
    """`verify_drafts` up to the draws, which stay on the device: the caller does other
    host work before `outcomes` waits for them. Rows that are all plain greedy with no
    grammar mask (every position then is too: `all_plain_greedy`) take every position's
    argmax at once, without a sampling row per position."""
    if (masks is None or all(m is None for m in masks)) and all_plain_greedy(rows):
        if logits.shape[0] != sum(len(d) + 1 for d in drafts):
            raise ValueError(f"logits: one row per drafting position, got {logits.shape[0]}")
        return DrawnDrafts(drafts, sampler.argmax(logits))
    positions: list[SamplingRow] = []
    mask_rows: list[int] = []
    mask_bits: list[torch.Tensor] = []
    for i, (base, draft) in enumerate(zip(rows, drafts, strict=True)):
        mask = masks[i] if masks is not None else None
        if mask is not None:
            mask_rows.extend(range(len(positions), len(positions) + len(draft) + 1))
            mask_bits.append(mask)
        counts = reads_output_ids(base.params)
        for j in range(len(draft) + 1):
            output = [*base.output_ids, *draft[:j]] if counts and j else base.output_ids
            positions.append(
                SamplingRow(base.params, base.prompt_ids, output, base.stop_ids, base.generator)
            )
    allowed = TokenBitmask(torch.cat(mask_bits), mask_rows) if mask_bits else None
    return DrawnDrafts(drafts, sampler.draw(logits, positions, allowed=allowed))
