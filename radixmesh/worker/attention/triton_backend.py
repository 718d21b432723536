"""Attention backend on Triton kernels over the paged KV pool (GPU; CPU via TRITON_INTERPRET).

Per step `prepare` picks the kernel: a decode-only batch (one new token per sequence) runs
flash-decoding with a split count sized to fill the GPU; any other batch runs the extend
kernel over every row (decode rows are extends of one token). Per layer `forward` stores
the new k/v with the store kernel, then attends. Metadata holds device tensors only, built
once per step, so every layer's launches need no host-device sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixmesh.worker.attention.base import AttentionBackend
from radixmesh.worker.attention.kernels.decode_attention import decode_attention, decode_workspace
from radixmesh.worker.attention.kernels.extend_attention import extend_attention
from radixmesh.worker.attention.kernels.kv_store import kv_store
from radixmesh.worker.forward_batch import ForwardBatch
from radixmesh.worker.kvcache.pool import KVPool

MIN_KEYS_PER_SPLIT = 256
MAX_SPLITS = 32
WAVES = 16


@dataclass
class DecodeMeta:
    num_splits: int
    # [B, Hq, S, D], [B, Hq, S] float32; allocated by the first layer (it knows Hq), reused
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None


@dataclass
class ExtendMeta:
    q_start: torch.Tensor  # [B] first row of each sequence's new tokens
    max_extend: int


def choose_num_splits(batch_size: int, num_kv_heads: int, max_seq_len: int, num_sms: int) -> int:
    """Enough (sequence, KV head, split) programs for WAVES waves over the SMs, but no split
    shorter than MIN_KEYS_PER_SPLIT keys (each split costs a partial write and a merge).

    Many waves pay even when one would fill the GPU: on the H200 at batch 256, context 4k,
    8 KV heads (2048 programs, 15.5 waves) one split read KV at 87% of copy bandwidth and
    two splits at 95% (bench/results/attention-kernels-20261130.json)."""
    programs = batch_size * num_kv_heads
    for_waves = -(-WAVES * num_sms // programs)
    for_length = -(-max_seq_len // MIN_KEYS_PER_SPLIT)
    return max(1, min(for_waves, for_length, MAX_SPLITS))


class TritonAttentionBackend(AttentionBackend):
    def __init__(self, kv_pool: KVPool, scale: float) -> None:
        super().__init__(kv_pool, scale)
        device = kv_pool.device
        if device.type == "cuda":
            self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count
        else:
            self.num_sms = 4  # the interpreter: few programs, few splits

    def prepare(self, batch: ForwardBatch) -> None:
        if batch.is_decode_only:
            s = choose_num_splits(
                batch.batch_size, self.kv_pool.num_kv_heads, max(batch.seq_lens_cpu), self.num_sms
            )
            batch.attn_metadata = DecodeMeta(s)
            return
        starts = [0]
        for n in batch.extend_lens_cpu[:-1]:
            starts.append(starts[-1] + n)
        q_start = torch.tensor(starts, dtype=torch.int64, device=batch.req_to_token.device)
        batch.attn_metadata = ExtendMeta(q_start, max(batch.extend_lens_cpu))

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_id: int,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        k_buf = self.kv_pool.k_buffers[layer_id]  # [num_slots, Hkv, D]
        v_buf = self.kv_pool.v_buffers[layer_id]
        kv_store(k_buf, v_buf, batch.out_cache_loc, k, v)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # [T, Hq, D]
        meta = batch.attn_metadata
        if isinstance(meta, DecodeMeta):
            if meta.workspace is None:
                t, hq, d = q.shape
                meta.workspace = decode_workspace(t, hq, d, meta.num_splits, q.device)
            return decode_attention(
                q,
                k_buf,
                v_buf,
                out,
                batch.req_to_token,
                batch.req_rows,
                batch.seq_lens,
                self.scale,
                meta.num_splits,
                meta.workspace,
            )
        assert isinstance(meta, ExtendMeta), type(meta)
        return extend_attention(
            q,
            k_buf,
            v_buf,
            out,
            batch.req_to_token,
            batch.req_rows,
            batch.prefix_lens,
            batch.extend_lens,
            meta.q_start,
            meta.max_extend,
            self.scale,
        )
