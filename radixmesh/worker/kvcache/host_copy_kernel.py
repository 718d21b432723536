"""The Triton kernel behind host_copy.py on CUDA: rows between the device pool's per-layer
buffers (found through a table of their addresses) and the token-major pinned host pool."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_TL_INT = {torch.uint8: tl.uint8, torch.int8: tl.int8, torch.int16: tl.int16, torch.int32: tl.int32}


@triton.jit
def _copy_rows_kernel(
    table_ptr,  # [NUM_BUFS] int64: each device buffer's address ([num_slots, ROW] each)
    host_ptr,  # [host_slots, NUM_BUFS, ROW], pinned
    dev_idx_ptr,  # [n] int64 device slots
    host_idx_ptr,  # [n] int64 host slots
    NUM_BUFS: tl.constexpr,
    ROW: tl.constexpr,
    BLOCK: tl.constexpr,
    TO_HOST: tl.constexpr,
    ELEM: tl.constexpr,
):
    t = tl.program_id(0)
    b = tl.program_id(1)
    d = tl.load(dev_idx_ptr + t)
    h = tl.load(host_idx_ptr + t)
    base = tl.load(table_ptr + b).to(tl.pointer_type(ELEM))
    dev_row = base + d * ROW
    host_row = host_ptr + (h * NUM_BUFS + b) * ROW
    for start in tl.static_range(0, ROW, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < ROW
        if TO_HOST:
            tl.store(host_row + offs, tl.load(dev_row + offs, mask=mask), mask=mask)
        else:
            tl.store(dev_row + offs, tl.load(host_row + offs, mask=mask), mask=mask)


def copy_rows(
    table: torch.Tensor,
    host: torch.Tensor,
    dev_idx: torch.Tensor,
    host_idx: torch.Tensor,
    num_bufs: int,
    row: int,
    to_host: bool,
    dtype: torch.dtype,
) -> None:
    """Move row b of device slot dev_idx[t] <-> host row (host_idx[t], b) for every t, b."""
    n = dev_idx.numel()
    block = min(triton.next_power_of_2(row), 2048)
    _copy_rows_kernel[(n, num_bufs)](
        table,
        host,
        dev_idx,
        host_idx,
        NUM_BUFS=num_bufs,
        ROW=row,
        BLOCK=block,
        TO_HOST=to_host,
        ELEM=_TL_INT[dtype],
        num_warps=4,
    )
