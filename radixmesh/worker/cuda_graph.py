"""CUDA graphs for decode steps, captured at a ladder of batch sizes.

A decode step launches about fifteen kernels per layer; at small and medium batches the
launches, not the math, bound the step. At start-up we capture `model(batch)` once per
ladder size over static input buffers; a decode step then copies its inputs into the
buffers, pads to the next ladder size and replays the graph.

Padded rows compute garbage that is never read: token 0 at position 0, KV written to the
reserved slot 0, table row 0 with seq_len 1 (they read one slot of whatever row 0 holds).
The attention metadata of each graph comes from the backend (`graph_metadata`): the
triton backend's is fixed (a split count for the full context and a workspace allocated
once); with its shared-prefix decode on it asks for a second graph per size with those
launches (`graph_variants`), replayed for the steps whose rows share prefixes
(`graph_variant`), whose chunk lists it packs for each batch (`before_replay`, outside
the graph, before the replay); the flashinfer backend's is re-planned for each batch the
same way. Backends that capture set `supports_cuda_graphs` (the torch
backend does not: its `prepare` builds per-step shapes).
"""

from __future__ import annotations

from typing import Any

import torch

from radixmesh.worker.attention.base import AttentionBackend
from radixmesh.worker.forward_batch import ForwardBatch
from radixmesh.worker.layers.kernels.graph_capture import capture
from radixmesh.worker.model.llama import LlamaForCausalLM


def batch_size_ladder(max_batch_size: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16, ending with max_batch_size itself."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size: must be >= 1, got {max_batch_size}")
    sizes = [n for n in (1, 2, 4, 8) if n < max_batch_size]
    sizes += range(16, max_batch_size, 16)
    return [*sizes, max_batch_size]


class DecodeCudaGraphs:
    """Captured decode steps; `run(batch)` when `can_run(batch)`, else run eagerly."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        attn: AttentionBackend,
        req_to_token: torch.Tensor,
        *,
        max_batch_size: int,
        num_heads: int,
        max_context_len: int,
    ) -> None:
        if not attn.supports_cuda_graphs:
            raise ValueError(f"{type(attn).__name__} does not capture CUDA graphs")
        self.ladder = batch_size_ladder(max_batch_size)
        self.attn = attn
        self.req_to_token = req_to_token
        n, device = self.ladder[-1], req_to_token.device
        with torch.inference_mode():
            # The static inputs, rows of one block in ForwardBatch.decode_inputs' order
            # (out_cache_loc, input_ids, positions, req_rows, seq_lens), and what pads them.
            width = -(-n // 16) * 16  # each row 128-byte aligned, as a tensor of its own
            self.inputs = torch.zeros(5, width, dtype=torch.int64, device=device)
            self.padding = torch.zeros(5, width, dtype=torch.int64, device=device)
            self.padding[4] = 1  # a padded row's seq_len
            self.out_cache_loc, self.input_ids = self.inputs[0], self.inputs[1]
            self.positions, self.req_rows, self.seq_lens = (self.inputs[i] for i in (2, 3, 4))
            self.seq_lens.fill_(1)
            self.ones = torch.ones(n, dtype=torch.int64, device=device)
            self.zeros = torch.zeros(n, dtype=torch.int64, device=device)
        # Keyed by (batch size, the backend's metadata variant).
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.num_replays = 0
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}  # [bs, hidden], per replay
        # The graphs hold raw pointers into each batch's metadata (the decode workspace):
        # keep the batches alive as long as the graphs.
        self.batches: dict[tuple[int, int], ForwardBatch] = {}
        pool = None
        for bs in reversed(self.ladder):  # largest first: smaller graphs reuse its memory
            for variant in range(attn.graph_variants(bs)):
                key = (bs, variant)
                fb = self._static_batch(bs)
                fb.attn_metadata = attn.graph_metadata(bs, max_context_len, num_heads, variant)
                self.batches[key] = fb
                self.graphs[key], self.outputs[key] = _capture(model, attn, fb, pool)
                pool = self.graphs[key].pool()

    def can_run(self, batch: ForwardBatch) -> bool:
        if not batch.is_decode_only or batch.batch_size > self.ladder[-1]:
            return False
        bs = next(n for n in self.ladder if n >= batch.batch_size)
        return self.attn.graph_can_run(batch, bs)

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """Hidden states [B, hidden] of a decode batch (a view, valid until the next run)."""
        b = batch.batch_size
        bs = next(n for n in self.ladder if n >= b)
        key = (bs, self.attn.graph_variant(batch, bs))
        fill_static_inputs(self.inputs, self.padding, batch, bs)
        self.attn.before_replay(self.batches[key], batch, bs - b)
        self.graphs[key].replay()
        self.num_replays += 1
        return self.outputs[key][:b]

    def _static_batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            req_rows=self.req_rows[:bs],
            seq_lens=self.seq_lens[:bs],
            prefix_lens=self.zeros[:bs],
            extend_lens=self.ones[:bs],
            req_to_token=self.req_to_token,
            seq_lens_cpu=[1] * bs,
            prefix_lens_cpu=[0] * bs,
            extend_lens_cpu=[1] * bs,
        )


def fill_static_inputs(
    static: torch.Tensor, padding: torch.Tensor, batch: ForwardBatch, bs: int
) -> None:
    """A decode batch's inputs into the first `bs` columns of the [5, N] `static` block
    (rows: out_cache_loc, input_ids, positions, req_rows, seq_lens), the columns past
    its B rows from `padding`. Two copies when the batch came as one block
    (`decode_inputs`), else one a field; the padding, one copy."""
    b = batch.batch_size
    if batch.decode_inputs is not None:
        static[:, :b].copy_(batch.decode_inputs)
    else:
        fields = (batch.out_cache_loc, batch.input_ids, batch.positions, batch.req_rows)
        for row, value in zip(static, (*fields, batch.seq_lens), strict=True):
            row[:b].copy_(value)
    if bs > b:
        static[:, b:bs].copy_(padding[:, b:bs])


@torch.inference_mode()
def _capture(
    model: LlamaForCausalLM,
    attn: AttentionBackend,
    batch: ForwardBatch,
    pool: Any,  # the first graph's memory pool handle, shared by the later ones
) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    # Warm up on a side stream (compiles kernels, settles the allocator), as capture wants.
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            model(batch, attn)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    # thread_local: under tensor parallelism the captured forward holds NCCL all-reduces,
    # and c10d's watchdog thread queries earlier collectives' events meanwhile; in the
    # default global mode such a call from another thread invalidates the capture.
    # With the cyclic collector off inside (graph_capture.py says why).
    with capture(graph, pool=pool, capture_error_mode="thread_local"):
        out = model(batch, attn)  # [bs, hidden]
    return graph, out
