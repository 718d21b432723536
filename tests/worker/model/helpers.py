"""Drive a model through ragged forward steps without the scheduler (for model tests).

`RaggedRunner` owns a KV pool, a req->token table and a shuffled free list of slots (so
every sequence's KV is scattered over non-contiguous slots, as after evictions).
`step([(row, new_token_ids), ...])` runs one mixed batch — prompt chunks and decode
tokens of several sequences together — and returns each item's logits.
"""

from __future__ import annotations

import torch

from radixmesh.worker.attention.registry import create_attention_backend
from radixmesh.worker.forward_batch import ForwardBatch
from radixmesh.worker.kvcache.pool import KVPool
from radixmesh.worker.model.llama import LlamaForCausalLM


class RaggedRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        *,
        num_slots: int = 2048,
        max_requests: int = 8,
        max_context: int = 512,
        seed: int = 0,
        backend: str = "torch",
    ) -> None:
        arch = model.arch
        param = next(model.parameters())
        self.model = model
        self.pool = KVPool(
            num_slots=num_slots,
            num_layers=arch.num_hidden_layers,
            num_kv_heads=model.num_kv_heads,
            head_dim=arch.head_size,
            dtype=param.dtype,
            device=param.device,
        )
        self.req_to_token = torch.zeros(
            max_requests, max_context, dtype=torch.int64, device=param.device
        )
        gen = torch.Generator().manual_seed(seed)
        self.free_slots = (torch.randperm(num_slots - 1, generator=gen) + 1).tolist()  # not 0
        self.cached = [0] * max_requests  # tokens in the KV cache per row
        self.attn = create_attention_backend(backend, self.pool, arch.head_size**-0.5)

    def _allocate(self, row: int, n: int) -> torch.Tensor:
        slots = torch.tensor(self.free_slots[:n], dtype=torch.int64)
        del self.free_slots[:n]
        start = self.cached[row]
        self.req_to_token[row, start : start + n] = slots
        self.cached[row] += n
        return slots

    def make_batch(self, items: list[tuple[int, list[int]]]) -> ForwardBatch:
        prefix_lens = [self.cached[row] for row, _ in items]
        out_cache_loc = torch.cat([self._allocate(row, len(ids)) for row, ids in items])
        return ForwardBatch.build(
            input_ids=[t for _, ids in items for t in ids],
            out_cache_loc=out_cache_loc,
            req_rows=[row for row, _ in items],
            prefix_lens=prefix_lens,
            extend_lens=[len(ids) for _, ids in items],
            req_to_token=self.req_to_token,
        )

    @torch.inference_mode()
    def step(self, items: list[tuple[int, list[int]]]) -> list[torch.Tensor]:
        """One forward step over (req row, new token ids) items; logits [n_i, vocab] each."""
        batch = self.make_batch(items)
        self.attn.prepare(batch)
        logits = self.model.compute_logits(self.model(batch, self.attn))  # [T, vocab]
        return list(logits.split([len(ids) for _, ids in items]))
