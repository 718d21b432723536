"""The inputs of one forward step, flattened over a ragged batch.

Every step computes some new tokens for each of B sequences: a chunk of the prompt
(extend) or one token (decode) — the same thing with different lengths. T is the total
number of new tokens. Sequence b's new tokens are `input_ids[cu[b]:cu[b+1]]` where
`cu = [0, *cumsum(extend_lens)]`; they sit at positions `prefix_lens[b] ..
seq_lens[b] - 1` and attend to every earlier token of the sequence plus themselves
(causal). The KV of sequence b's token i lives in slot `req_to_token[req_rows[b], i]`.

Tensors are on the model's device; the `*_cpu` lists mirror them for host-side logic
(loop bounds, padding) so nobody syncs with the device to read a length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`. On CUDA through pinned memory, without waiting: a plain
    copy synchronizes with the stream, i.e. waits for a step still running there, which
    would serialize the overlap scheduler's host work with the GPU (overlap.py)."""
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    out_cache_loc: torch.Tensor  # [T] int64: the KV slot each new token is written to
    req_rows: torch.Tensor  # [B] int64: each sequence's row in the req->token table
    seq_lens: torch.Tensor  # [B] int64: KV length after this step (prefix + new)
    prefix_lens: torch.Tensor  # [B] int64: tokens already in the KV cache
    extend_lens: torch.Tensor  # [B] int64: new tokens this step (1 for decode)
    req_to_token: torch.Tensor  # [max_requests, max_context] int: slot of every token
    seq_lens_cpu: list[int]
    prefix_lens_cpu: list[int]
    extend_lens_cpu: list[int]
    # Filled by AttentionBackend.prepare(): backend-specific per-step metadata
    # (gather indices, masks, kernel launch tables), computed once, used by every layer.
    attn_metadata: Any = field(default=None)
    # The req->token table's host mirror (numpy, kvcache/req_table.py), where the runner
    # has one: what a backend may read on the host without waiting for the device (the
    # flashinfer backend finds shared prefixes in it). None: not available.
    req_to_token_host: Any = field(default=None)
    req_rows_cpu: list[int] | None = None  # mirrors req_rows where built from host lists

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def is_decode_only(self) -> bool:
        return all(n == 1 for n in self.extend_lens_cpu)

    @classmethod
    def build(
        cls,
        *,
        input_ids: list[int],
        out_cache_loc: torch.Tensor,
        req_rows: list[int],
        prefix_lens: list[int],
        extend_lens: list[int],
        req_to_token: torch.Tensor,
    ) -> ForwardBatch:
        """Build from host lists; positions and seq_lens are derived.

        The lists travel to the device as one packed tensor (one pinned copy, sliced
        there): a copy each was five host-to-device transfers a step on the launch path,
        ~10-20 us of host time apiece on CUDA (pin, then queue the copy)."""
        device = req_to_token.device
        t, b = len(input_ids), len(prefix_lens)
        decode_only = t == b  # each new token at its prefix end: positions are prefix_lens
        positions = (
            []
            if decode_only
            else [p + i for p, e in zip(prefix_lens, extend_lens, strict=True) for i in range(e)]
        )
        packed = torch.tensor(
            [*input_ids, *req_rows, *prefix_lens, *extend_lens, *positions], dtype=torch.int64
        )
        on_device = to_device(packed, device)  # [T | B | B | B | T or nothing]
        prefix = on_device[t + b : t + 2 * b]
        extend = on_device[t + 2 * b : t + 3 * b]
        seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
        return cls(
            input_ids=on_device[:t],
            positions=prefix if decode_only else on_device[t + 3 * b :],
            out_cache_loc=out_cache_loc.to(device=device, dtype=torch.int64),
            req_rows=on_device[t : t + b],
            seq_lens=prefix + extend,
            prefix_lens=prefix,
            extend_lens=extend,
            req_to_token=req_to_token,
            seq_lens_cpu=seq_lens,
            prefix_lens_cpu=list(prefix_lens),
            extend_lens_cpu=list(extend_lens),
            req_rows_cpu=list(req_rows),
        )
