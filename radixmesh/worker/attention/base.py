"""The attention backend interface.

A backend owns nothing but a reference to the KV pool. Per step the model runner calls
`prepare(batch)` once; then every attention layer calls `forward(q, k, v, layer_id,
batch)`, which (1) writes the new tokens' k/v into their slots `batch.out_cache_loc` of
layer `layer_id` and (2) returns attention of q over each sequence's whole KV
(`req_to_token[req_rows[b], :seq_lens[b]]`), causal within the new tokens.

Shapes: q [T, num_heads, head_dim]; k, v [T, num_kv_heads, head_dim]; output
[T, num_heads, head_dim]. num_heads is a multiple of num_kv_heads (GQA).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from radixmesh.worker.forward_batch import ForwardBatch
from radixmesh.worker.kvcache.pool import KVPool


class AttentionBackend(ABC):
    # Whether decode steps can be captured in CUDA graphs (cuda_graph.py): the backend
    # then implements `graph_metadata`, and `before_replay` / `graph_can_run` if it must.
    supports_cuda_graphs = False

    def __init__(self, kv_pool: KVPool, scale: float) -> None:
        self.kv_pool = kv_pool
        self.scale = scale
        # Batch-invariant sums (worker/deterministic.py); set before the first step.
        self.deterministic = False

    def enable_deterministic(self, max_context_len: int) -> None:
        """Batch-invariant sums from now on (worker/deterministic.py), for sequences of up
        to `max_context_len` tokens. Called before the first step and any graph capture."""
        self.deterministic = True

    @abstractmethod
    def prepare(self, batch: ForwardBatch) -> None:
        """Compute per-step metadata once and store it in `batch.attn_metadata`."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_id: int,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        """Store k/v for the new tokens, then attend. Returns [T, num_heads, head_dim].
        k/v are the caller's no more: a backend may overwrite them (the triton backend
        writes an FP8 pool's dequantized values back into them for its extend kernel)."""

    def graph_metadata(
        self, batch_size: int, max_context_len: int, num_heads: int, variant: int = 0
    ) -> Any:
        """`attn_metadata` for a captured decode step of `batch_size` rows, valid for every
        batch of at most that many rows and contexts of up to `max_context_len` tokens;
        `variant` one of `graph_variants(batch_size)`."""
        raise NotImplementedError(f"{type(self).__name__} does not capture CUDA graphs")

    def graph_variants(self, batch_size: int) -> int:
        """Graphs to capture at this batch size, one per metadata variant (0 the default):
        a backend whose steps take different launches (the triton backend's shared-prefix
        decode) captures each."""
        return 1

    def graph_can_run(self, batch: ForwardBatch, graph_batch_size: int) -> bool:
        """Whether this decode batch should replay a graph of that size (else eagerly)."""
        return True

    def graph_variant(self, batch: ForwardBatch, graph_batch_size: int) -> int:
        """Which of the size's variants replays this batch (once `graph_can_run`)."""
        return 0

    def before_replay(self, static: ForwardBatch, batch: ForwardBatch, padding: int) -> None:
        """Called before each replay, `batch`'s inputs already in the graph's buffers
        (`static`), then `padding` rows of one token. The default does nothing: metadata
        fixed at capture stays valid."""
        return None
