"""Flatten the slot table into a paged attention library's index list (page size 1).

Libraries such as FlashInfer read a batch's KV through CSR arrays: sequence b's keys are
the slots `indices[indptr[b]:indptr[b+1]]`. Here those are the first `seq_lens[b]`
entries of row `req_rows[b]` of the req->token table (or, with `starts`, the entries from
column `starts[b]` to `seq_lens[b]`: a suffix, for a cascade's per-row level). One program
per sequence copies them, in BLOCK-sized chunks, as int32: one launch a step, on the
device, no host sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 512


@triton.jit
def _kv_indices_kernel(
    Table,
    Rows,
    SeqLens,
    Indptr,
    Starts,
    Out,
    stride_table,
    HAS_STARTS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    row = tl.load(Rows + b).to(tl.int64)
    first = tl.load(Starts + b) if HAS_STARTS else 0
    n = tl.load(SeqLens + b) - first
    start = tl.load(Indptr + b).to(tl.int64)
    src = Table + row * stride_table + first
    for i in range(0, n, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        mask = offs < n
        slots = tl.load(src + offs, mask=mask)
        tl.store(Out + start + offs, slots.to(tl.int32), mask=mask)


def build_kv_indices(
    req_to_token: torch.Tensor,
    req_rows: torch.Tensor,
    seq_lens: torch.Tensor,
    indptr: torch.Tensor,
    out: torch.Tensor,
    starts: torch.Tensor | None = None,
) -> torch.Tensor:
    """Write each sequence's slots into `out` [>= indptr[-1]] int32 at `indptr` [B + 1] (on
    the device) and return `out`. `req_rows`, `seq_lens`, `starts` [B] (`starts`: the
    first column of each; None: 0); `req_to_token` row-major."""
    b = req_rows.shape[0]
    if b:
        _kv_indices_kernel[(b,)](
            req_to_token,
            req_rows,
            seq_lens,
            indptr,
            req_rows if starts is None else starts,  # not read without starts
            out,
            req_to_token.stride(0),
            HAS_STARTS=starts is not None,
            BLOCK=BLOCK,
        )
    return out


def build_kv_indices_ref(
    req_to_token: torch.Tensor,
    req_rows: list[int],
    seq_lens: list[int],
    starts: list[int] | None = None,
) -> torch.Tensor:
    """The same list in plain PyTorch (int32)."""
    starts = starts or [0] * len(req_rows)
    parts = [req_to_token[r, s:n] for r, s, n in zip(req_rows, starts, seq_lens, strict=True)]
    if not parts:
        return torch.empty(0, dtype=torch.int32, device=req_to_token.device)
    return torch.cat(parts).to(torch.int32)
