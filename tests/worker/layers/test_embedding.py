"""Vocabulary sharding of the embedding and LM head, ranks simulated in one process."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixmesh.worker.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from radixmesh.worker.layers.parallel import TPGroup
from radixmesh.worker.layers.weights import get_weight_loader

VOCAB, DIM = 10, 4


@pytest.mark.parametrize("size", [2, 3, 4])
def test_shards_cover_the_vocabulary_once_with_zero_padding(size: int) -> None:
    table = torch.randn(VOCAB, DIM)
    shards = []
    for rank in range(size):
        emb = VocabParallelEmbedding(VOCAB, DIM, tp=TPGroup(rank, size))
        get_weight_loader(emb.weight)(emb.weight, table, None)
        shards.append(emb.weight.data)
    padded = torch.cat(shards)  # [shard * size, DIM]
    assert padded.shape[0] == -(-VOCAB // size) * size
    assert torch.equal(padded[:VOCAB], table) and not padded[VOCAB:].any()


@pytest.mark.parametrize("size", [2, 3])
def test_lookup_and_logits_combine_to_the_full_result(size: int) -> None:
    table, ids, hidden = torch.randn(VOCAB, DIM), torch.tensor([0, 9, 3, 4, 7]), torch.randn(2, DIM)
    lookups, logits = [], []
    for rank in range(size):
        head = ParallelLMHead(VOCAB, DIM, tp=TPGroup(rank, size))
        get_weight_loader(head.weight)(head.weight, table, None)
        # What forward computes before its collective (all-reduce / all-gather).
        mine = (ids >= head.vocab_start) & (ids < head.vocab_end)
        local = F.embedding(torch.where(mine, ids - head.vocab_start, 0), head.weight)
        lookups.append(local * mine[:, None])
        logits.append(F.linear(hidden, head.weight))
    assert torch.equal(sum(lookups, torch.zeros_like(lookups[0])), table[ids])
    torch.testing.assert_close(torch.cat(logits, -1)[:, :VOCAB], hidden @ table.T)


def test_single_rank_forward() -> None:
    table, ids, hidden = torch.randn(VOCAB, DIM), torch.tensor([1, 8]), torch.randn(3, DIM)
    emb, head = VocabParallelEmbedding(VOCAB, DIM), ParallelLMHead(VOCAB, DIM)
    for layer in (emb, head):
        get_weight_loader(layer.weight)(layer.weight, table, None)
    assert torch.equal(emb(ids), table[ids])
    torch.testing.assert_close(head(hidden), hidden @ table.T)


def test_wrong_shape_is_rejected() -> None:
    emb = VocabParallelEmbedding(VOCAB, DIM)
    with pytest.raises(ValueError, match=r"shape mismatch: expected \(10, 4\)"):
        get_weight_loader(emb.weight)(emb.weight, torch.randn(11, DIM), None)
