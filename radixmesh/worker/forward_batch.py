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

import numpy as np
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
    # A decode-only batch built with its slots on the host: [5, B] rows out_cache_loc,
    # input_ids, positions, req_rows, seq_lens (the fields above are its rows), one
    # copy for a CUDA graph's inputs. None otherwise.
    decode_inputs: torch.Tensor | None = None
    # `build`'s `carry` on the device (the req->token table's staged writes), or None.
    carried: torch.Tensor | None = None

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
        carry: np.ndarray | None = None,
        pack_slots: bool | None = None,
    ) -> ForwardBatch:
        """Build from host lists; positions and seq_lens are derived.

        Everything travels to the device as one packed int64 array (one pinned copy,
        sliced there): a copy each was a host-to-device transfer apiece on the launch
        path, ~10-20 us of host time each on CUDA (pin, then queue the copy). So do
        `carry` (other ints of the step: the req->token table's staged writes), which
        comes back on the device as `carried`, and `out_cache_loc` with `pack_slots`
        (default: it is on the host and the device is not). seq_lens are summed on the
        host, not by a kernel. With packed slots a decode-only batch's slots, ids,
        positions, rows and seq_lens are one [5, B] block on the device
        (`decode_inputs`), which a CUDA graph's replay copies in one go.

        Layout: [slots T if packed | ids T | positions T | rows B | seq_lens B | extend B |
        prefix B unless decode-only (there positions are the prefixes) | carry]."""
        device = req_to_token.device
        t, b = len(input_ids), len(prefix_lens)
        decode_only = t == b  # each new token at its prefix end: positions are prefix_lens
        seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
        if decode_only:
            ints = [*input_ids, *prefix_lens, *req_rows, *seq_lens, *extend_lens]
        else:
            positions = [
                p + i for p, e in zip(prefix_lens, extend_lens, strict=True) for i in range(e)
            ]
            ints = [*input_ids, *positions, *req_rows, *seq_lens, *extend_lens, *prefix_lens]
        host = np.array(ints, dtype=np.int64)
        if pack_slots is None:
            pack_slots = out_cache_loc.device.type == "cpu" and device.type != "cpu"
        if pack_slots or carry is not None:
            slots = [_int64(out_cache_loc).numpy()] if pack_slots else []
            host = np.concatenate([*slots, host, *([] if carry is None else [carry])])
        on_device = to_device(torch.from_numpy(host), device)
        at = t if pack_slots else 0
        ids = on_device[at : at + t]
        positions_dev = on_device[at + t : at + 2 * t]
        at += 2 * t
        rows = on_device[at : at + b]
        seq = on_device[at + b : at + 2 * b]
        extend = on_device[at + 2 * b : at + 3 * b]
        at += 3 * b
        if decode_only:
            prefix = positions_dev
        else:
            prefix = on_device[at : at + b]
            at += b
        return cls(
            input_ids=ids,
            positions=positions_dev,
            out_cache_loc=on_device[:t] if pack_slots else _int64(out_cache_loc).to(device),
            req_rows=rows,
            seq_lens=seq,
            prefix_lens=prefix,
            extend_lens=extend,
            req_to_token=req_to_token,
            seq_lens_cpu=seq_lens,
            prefix_lens_cpu=list(prefix_lens),
            extend_lens_cpu=list(extend_lens),
            req_rows_cpu=list(req_rows),
            decode_inputs=on_device[: 5 * b].view(5, b) if decode_only and pack_slots else None,
            carried=on_device[at:] if carry is not None else None,
        )


def _int64(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int64 else t.to(torch.int64)
