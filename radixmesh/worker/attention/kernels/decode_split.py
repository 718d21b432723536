"""Flash-decoding's split of a sequence's keys, shared by the decode kernels' stage 1
(decode_attention.py, decode_fp8_mma.py): one program per (sequence, KV head, split)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def key_range(start, end, split, num_splits, BLOCK_N):
    """Split `split` of keys [start, end) cut into num_splits ranges of whole BLOCK_N
    tiles: its [lo, hi) (empty, lo >= hi, past the keys' end)."""
    split_len = tl.cdiv(tl.cdiv(end - start, num_splits), BLOCK_N) * BLOCK_N
    lo = start + split * split_len
    return lo, tl.minimum(lo + split_len, end)


@triton.jit
def split_range(req_to_token, req_rows, seq_lens, stride_table, num_splits, BLOCK_N):
    """The program's sequence (axis 0) and split (axis 2): its slot-table row and its key
    range [lo, hi), the sequence cut into num_splits whole tiles of BLOCK_N keys."""
    b = tl.program_id(0)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens + b)
    table_row = req_to_token + tl.load(req_rows + b).to(tl.int64) * stride_table
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    lo = split * split_len
    return table_row, lo, tl.minimum(lo + split_len, seq_len)
