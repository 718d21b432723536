"""The Triton kernel behind host_copy.py on CUDA: rows between the device pool's per-layer
buffers (found through a table of their addresses) and the token-major pinned host pool.

A fixed number of programs loops over the (token, buffer) rows rather than one program
per row: a copy over PCIe is bound by the link, not by the SMs, and a grid of one
program per row (65k for 1,000 Llama-3-8B tokens) would take every SM while it waits
on the link, beside the forwards it runs next to (a reload runs on its own stream).
Consecutive rows are the same token's buffers, so each program's host accesses walk
one token's contiguous run (`PROGRAMS` in host_copy.py: measured in bench/host_kv.py).
"""

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
    num_rows,  # n * NUM_BUFS
    NUM_BUFS: tl.constexpr,
    ROW: tl.constexpr,
    BLOCK: tl.constexpr,
    TO_HOST: tl.constexpr,
    ELEM: tl.constexpr,
):
    for r in range(tl.program_id(0), num_rows, tl.num_programs(0)):
        t = r // NUM_BUFS
        b = r % NUM_BUFS
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
    programs: int = 0,
) -> None:
    """Move row b of device slot dev_idx[t] <-> host row (host_idx[t], b) for every t, b,
    with `programs` programs (0: one per row)."""
    num_rows = dev_idx.numel() * num_bufs
    if num_rows == 0:
        return
    grid = num_rows if programs <= 0 else min(programs, num_rows)
    block = min(triton.next_power_of_2(row), 2048)
    _copy_rows_kernel[(grid,)](
        table,
        host,
        dev_idx,
        host_idx,
        num_rows,
        NUM_BUFS=num_bufs,
        ROW=row,
        BLOCK=block,
        TO_HOST=to_host,
        ELEM=_TL_INT[dtype],
        num_warps=4,
    )
