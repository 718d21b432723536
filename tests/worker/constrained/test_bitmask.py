from __future__ import annotations

import math

import torch

from radixmesh.sampling_params import SamplingParams
from radixmesh.worker.constrained.bitmask import TokenBitmask, allocate_bitmask, unpack_bitmask
from radixmesh.worker.sampler import Sampler, SamplingRow


def pack(allowed: list[list[int]], vocab: int) -> torch.Tensor:
    bits = torch.zeros(len(allowed), (vocab + 31) // 32, dtype=torch.int64)
    for r, toks in enumerate(allowed):
        for t in toks:
            bits[r, t // 32] |= 1 << (t % 32)
    return torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)  # two's complement


def test_unpack_matches_bit_positions() -> None:
    vocab = 70  # not a multiple of 32: the last word is partly padding
    allowed = [[0, 31, 32, 63, 69], [5], []]
    got = unpack_bitmask(pack(allowed, vocab), vocab)
    assert got.shape == (3, 70)
    for r, toks in enumerate(allowed):
        assert torch.nonzero(got[r]).view(-1).tolist() == toks


def test_allocate_allows_everything() -> None:
    bits = allocate_bitmask(2, 40)
    assert bits.shape == (2, 2) and bits.dtype == torch.int32
    assert bool(unpack_bitmask(bits, 40).all())


def test_apply_touches_only_listed_rows() -> None:
    logits = torch.arange(4 * 70, dtype=torch.float32).view(4, 70)
    before = logits.clone()
    TokenBitmask(pack([[3, 40], [69]], 70), rows=[1, 3]).apply_(logits)
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    assert torch.isfinite(logits[1]).nonzero().view(-1).tolist() == [3, 40]
    assert torch.isfinite(logits[3]).nonzero().view(-1).tolist() == [69]
    assert logits[1, 0] == -math.inf


def test_sampler_masks_after_penalties_and_leaves_free_rows() -> None:
    vocab = 64
    logits = torch.zeros(2, vocab)
    logits[:, 10] = 5.0  # the argmax of both rows
    logits[:, 20] = 4.0
    logits[:, 30] = 1.0
    greedy = SamplingParams(temperature=0.0)
    penal = SamplingParams(temperature=0.0, repetition_penalty=100.0)
    rows = [
        SamplingRow(params=penal, prompt_ids=[20], output_ids=[]),
        SamplingRow(params=greedy, prompt_ids=[1], output_ids=[]),
    ]
    # Row 0 may only say 20 or 30; its penalty on 20 (4 / 100) makes 30 win.
    out = Sampler(vocab).sample(logits, rows, allowed=TokenBitmask(pack([[20, 30]], vocab), [0]))
    assert out.token_ids == [30, 10]
