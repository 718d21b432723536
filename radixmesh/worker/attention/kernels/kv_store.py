"""KV store: write the new tokens' k/v [T, Hkv, D] into slots `loc` [T] of a layer's pool.

One program per token copies its Hkv x D keys and values (one row of the pool each: a
slot's heads are contiguous), casting to the pool's dtype on the way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _kv_store_kernel(
    K,
    V,
    K_buf,
    V_buf,
    loc,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_buf_slot,
    stride_buf_head,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(loc + t).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < NUM_HEADS) & (offs_d[None, :] < HEAD_DIM)
    t64 = t.to(tl.int64)
    k = tl.load(K + t64 * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(V + t64 * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    dst = slot * stride_buf_slot + offs_h[:, None] * stride_buf_head + offs_d[None, :]
    tl.store(K_buf + dst, k.to(K_buf.dtype.element_ty), mask=mask)
    tl.store(V_buf + dst, v.to(V_buf.dtype.element_ty), mask=mask)


def kv_store(
    k_buf: torch.Tensor, v_buf: torch.Tensor, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """k_buf/v_buf [num_slots, Hkv, D]; loc [T] int; k/v [T, Hkv, D] (any row strides)."""
    t, hkv, d = k.shape
    if t == 0:
        return
    assert v.shape == k.shape and loc.shape == (t,), (k.shape, v.shape, loc.shape)
    assert k_buf.shape[1:] == (hkv, d) and v_buf.stride() == k_buf.stride()
    assert k.stride(2) == v.stride(2) == k_buf.stride(2) == 1
    _kv_store_kernel[(t,)](
        k,
        v,
        k_buf,
        v_buf,
        loc,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_buf.stride(0),
        k_buf.stride(1),
        NUM_HEADS=hkv,
        HEAD_DIM=d,
        BLOCK_H=triton.next_power_of_2(hkv),
        BLOCK_D=triton.next_power_of_2(d),
    )


def kv_store_ref(
    k_buf: torch.Tensor, v_buf: torch.Tensor, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    k_buf[loc] = k.to(k_buf.dtype)
    v_buf[loc] = v.to(v_buf.dtype)
