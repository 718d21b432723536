"""Token embedding and LM head with the vocabulary split across a tensor-parallel group.

The vocabulary is padded to a multiple of the TP size; rank r owns rows
[r * shard, (r + 1) * shard) of the padded table (padding rows are zero and their logits
are cut off). Embedding lookups for ids outside a rank's rows contribute zeros and an
all-reduce assembles the rows; the LM head computes its rows' logits and all-gathers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixmesh.worker.layers.dense import PackableLinear, dense
from radixmesh.worker.layers.parallel import SINGLE, TPGroup
from radixmesh.worker.layers.weights import Loaded, ShardId, new_parameter, set_weight_loader


class VocabParallelEmbedding(nn.Module):
    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        tp: TPGroup | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.tp = tp or SINGLE
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.shard_size = -(-num_embeddings // self.tp.size)  # ceil
        self.vocab_start = min(self.tp.rank * self.shard_size, num_embeddings)
        self.vocab_end = min(self.vocab_start + self.shard_size, num_embeddings)
        self.weight = new_parameter(self.shard_size, embedding_dim, dtype=dtype, device=device)
        set_weight_loader(self.weight, self.weight_loader)

    def weight_loader(self, param: nn.Parameter, loaded: Loaded, shard_id: ShardId) -> None:
        if shard_id is not None:
            raise ValueError(f"unsharded parameter got shard {shard_id!r}")
        expected = (self.num_embeddings, self.embedding_dim)
        if tuple(loaded.shape) != expected:
            raise ValueError(f"shape mismatch: expected {expected}, got {tuple(loaded.shape)}")
        n = self.vocab_end - self.vocab_start
        param.data[:n].copy_(loaded.narrow(0, self.vocab_start, n))
        param.data[n:].zero_()  # padding rows: zero embeddings, zero logits (then cut off)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(input_ids, self.weight)  # [T, dim]
        mine = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)  # [T]
        local_ids = torch.where(mine, input_ids - self.vocab_start, 0)
        out = F.embedding(local_ids, self.weight).masked_fill_(~mine[:, None], 0)  # [T, dim]
        return self.tp.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding, PackableLinear):
    """hidden -> logits over the full vocabulary; the weight may be the embedding's (tied)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = dense(hidden, self.weight, None, self.packed_weight)  # [N, shard_size]
        logits = self.tp.all_gather(logits, dim=-1)  # [N, shard_size * tp]
        return logits[:, : self.num_embeddings]  # [N, vocab]
