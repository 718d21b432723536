"""Verification keeps the target distribution: the emitted tokens' joint distribution,
measured over many seeded draws, against the exact one (a biased acceptance rule, e.g.
accepting a draft whenever it is likely enough, moves it far past the bound); greedy rows
keep the argmax; penalties see the drafts before each position."""

from __future__ import annotations

import itertools
import math

import torch

from radixmesh.sampling_params import SamplingParams
from radixmesh.worker.sampler import Sampler, SamplingRow
from radixmesh.worker.speculative.verify import draw_drafts, verify_drafts

V = 5
PROBS = torch.tensor(
    [
        [0.40, 0.30, 0.15, 0.10, 0.05],  # position 0 (after the last token)
        [0.10, 0.20, 0.50, 0.15, 0.05],  # after draft 1
        [0.25, 0.25, 0.25, 0.15, 0.10],  # after draft 2
    ]
)
DRAFT = [1, 2]


def _exact() -> dict[tuple[int, ...], float]:
    """P(emitted tokens) when drafts are kept while they equal the target's draws."""
    out: dict[tuple[int, ...], float] = {}
    for t0 in range(V):
        p0 = float(PROBS[0, t0])
        if t0 != DRAFT[0]:
            out[(t0,)] = p0
            continue
        for t1 in range(V):
            p1 = p0 * float(PROBS[1, t1])
            if t1 != DRAFT[1]:
                out[(t0, t1)] = p1
                continue
            for t2 in range(V):
                out[(t0, t1, t2)] = p1 * float(PROBS[2, t2])
    return out


def test_sampled_output_keeps_the_target_distribution() -> None:
    sampler = Sampler(V)
    gen = torch.Generator().manual_seed(1234)
    row = SamplingRow(SamplingParams(temperature=1.0), [0], [], generator=gen)
    logits = PROBS.log()
    n = 20_000
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(n):
        (v,) = verify_drafts(sampler, logits, [row], [DRAFT])
        key = tuple(v.tokens)
        counts[key] = counts.get(key, 0) + 1
    exact = _exact()
    assert set(counts) <= set(exact)
    chi2 = sum((counts.get(k, 0) - n * p) ** 2 / (n * p) for k, p in exact.items())
    # 24 outcomes, 23 degrees of freedom: P(chi2 > 60) < 1e-4 for an exact sampler; a
    # rule that accepted draft 1 at its probability 0.3 plus anything is off by hundreds.
    assert chi2 < 60.0, chi2
    tv = 0.5 * sum(abs(counts.get(k, 0) / n - p) for k, p in exact.items())
    assert tv < 0.03, tv
    # The draft was kept at the rate its target probability says (0.3 and 0.3 x 0.5).
    kept1 = sum(c for k, c in counts.items() if len(k) >= 2) / n
    kept2 = sum(c for k, c in counts.items() if len(k) == 3) / n
    assert math.isclose(kept1, 0.30, abs_tol=0.015) and math.isclose(kept2, 0.15, abs_tol=0.015)


def test_seeded_rows_repeat() -> None:
    sampler = Sampler(V)
    logits = PROBS.log()

    def run(seed: int) -> list[list[int]]:
        gen = torch.Generator().manual_seed(seed)
        row = SamplingRow(SamplingParams(temperature=1.0, seed=seed), [0], [], generator=gen)
        return [verify_drafts(sampler, logits, [row], [DRAFT])[0].tokens for _ in range(50)]

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_greedy_keeps_drafts_while_they_are_the_argmax() -> None:
    sampler = Sampler(V)
    logits = PROBS.log()  # argmax per position: 0, 2, 0 (ties broken by the lower id)
    greedy = SamplingRow(SamplingParams(temperature=0.0), [0], [])
    cases = {(0, 2): [0, 2, 0], (0, 1): [0, 2], (3, 2): [0], (0,): [0, 2]}
    for draft, want in cases.items():
        rows = logits[: len(draft) + 1]
        (v,) = verify_drafts(sampler, rows, [greedy], [list(draft)])
        assert v.tokens == want, draft
        assert v.accepted == len(want) - 1


def test_several_rows_and_logprobs() -> None:
    sampler = Sampler(V)
    logits = torch.cat([PROBS.log(), PROBS[:2].log()])  # row a: 2 drafts, row b: 1 draft
    a = SamplingRow(
        SamplingParams(temperature=0.0, return_logprob=True, top_logprobs_num=1), [0], []
    )
    b = SamplingRow(SamplingParams(temperature=0.0), [0], [])
    va, vb = verify_drafts(sampler, logits, [a, b], [[0, 2], [4]])
    assert va.tokens == [0, 2, 0] and vb.tokens == [0]
    assert [round(float(x), 6) for x in va.logprobs] == [  # type: ignore[arg-type]
        round(math.log(0.40), 6),
        round(math.log(0.50), 6),
        round(math.log(0.25), 6),
    ]
    assert va.top_logprobs[1] is not None and va.top_logprobs[1][0][0] == 2
    assert vb.logprobs == [None]


def test_penalties_count_the_drafts_before_each_position() -> None:
    """A presence penalty at position j sees drafts 1..j as output: with drafts [2, 2]
    and a large penalty, position 1 may not repeat 2, so draft 2 is rejected there."""
    sampler = Sampler(V)
    flat = torch.zeros(3, V)
    flat[:, 2] = 1.0  # token 2 is the argmax everywhere, unpenalized
    row = SamplingRow(SamplingParams(temperature=0.0, presence_penalty=2.0), [0], [])
    (v,) = verify_drafts(sampler, flat, [row], [[2, 2]])
    # position 0: no output yet -> 2 (draft 1 kept); position 1: 2 is in the output,
    # 1.0 - 2.0 < 0.0 -> token 0 (draft 2 rejected)
    assert v.tokens == [2, 0]
    # Every combination of drafts over a flat target: greedy keeps them while they are 0.
    for draft in itertools.product(range(2), repeat=2):
        (w,) = verify_drafts(
            sampler,
            torch.zeros(3, V),
            [SamplingRow(SamplingParams(temperature=0.0), [0], [])],
            [list(draft)],
        )
        kept = 0
        while kept < 2 and draft[kept] == 0:
            kept += 1
        assert w.accepted == kept


def test_plain_greedy_rows_take_every_positions_argmax_at_once() -> None:
    """No sampling row per position: the draws are the argmax of each position's logits
    over the vocabulary (padding columns past it never win), as the per-position path
    gives them."""
    sampler = Sampler(V)
    logits = torch.tensor(
        [  # row a: drafts [3, 1, 4] (4 positions); row b: draft [2] (2 positions)
            [0.1, 0.0, 0.2, 0.9, 0.0, 9.0],
            [0.0, 0.8, 0.1, 0.0, 0.0, 9.0],
            [0.0, 0.0, 0.0, 0.1, 0.7, 9.0],
            [0.6, 0.0, 0.0, 0.0, 0.1, 9.0],
            [0.0, 0.0, 0.3, 0.0, 0.5, 9.0],
            [0.2, 0.1, 0.0, 0.0, 0.0, 9.0],
        ]
    )  # V + 1 columns: the last is the LM head's padding
    greedy = SamplingRow(SamplingParams(temperature=0.0), [0], [])
    drawn = draw_drafts(sampler, logits, [greedy, greedy], [[3, 1, 4], [2]])
    assert drawn.draws.token_ids.tolist() == [3, 1, 4, 0, 4, 0]
    va, vb = drawn.outcomes()
    assert (va.tokens, va.accepted, vb.tokens, vb.accepted) == ([3, 1, 4, 0], 3, [4], 0)
    assert va.logprobs == [None] * 4 and vb.top_logprobs == [None]
    per_position = sampler.draw(logits, [greedy] * 6)
    assert per_position.token_ids.tolist() == [3, 1, 4, 0, 4, 0]


def test_a_min_new_tokens_ban_in_force_is_applied_at_each_position() -> None:
    """Not plain greedy while the ban holds: stop id 0 is the argmax everywhere; with one
    output token and min_new_tokens 3 it is banned at positions 0 and 1 (1 and 2 output
    tokens before them), allowed at position 2 (3 before it)."""
    sampler = Sampler(V)
    logits = torch.tensor([[5.0, 1.0, 0.0, 0.0, 0.0]] * 3)
    params = SamplingParams(temperature=0.0, min_new_tokens=3)
    row = SamplingRow(params, [4], [2], stop_ids=frozenset({0}))
    (v,) = verify_drafts(sampler, logits, [row], [[1, 1]])
    assert v.tokens == [1, 1, 0] and v.accepted == 2
