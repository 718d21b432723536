"""KV store: write the new tokens' k/v [T, Hkv, D] into slots `loc` [T] of a layer's pool.

One program per token copies its Hkv x D keys and values (one row of the pool each: a
slot's heads are contiguous), casting to the pool's dtype on the way. Into an FP8 pool
it quantizes each head's vector with its power-of-two scale and stores the exponent
(kvcache/fp8_kv.py: same bits as `quantize_kv`).

`write_back` (FP8 pool, bfloat16 or float32 k/v): the kernel also overwrites the given
k/v with what the pool now holds, dequantized (e4m3 value times 2^e). That is exact in
those dtypes (an e4m3 value has 4 significant bits, and their exponent range is
float32's; only a head whose largest value is under ~1e-33, e < -117, would reach their
subnormals), so the extend kernel can read this forward's new tokens from the contiguous
fresh rows and get the numbers, and the bits, of reading them back through the slot table
(extend_attention.py). Not for float16: 2^e can take a small head's values into its
subnormals, where the product is no longer exact.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixmesh.worker.kvcache.fp8_kv import quantize_kv
from radixmesh.worker.layers.kernels.fp8_quant import round_to_e4m3


@triton.jit
def ceil_log2(x):
    """float32 x >= 0 -> int32 ceil(log2 x) from its bits, exactly, clamped to [-126, 127]
    (0 and subnormals: -126)."""
    bits = x.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32)
    return tl.minimum(tl.maximum(e, -126), 127)


@triton.jit
def floor_log2(x):
    """float32 x >= 0 -> int32 floor(log2 x) from its bits, clamped to [-126, 127] (0 and
    subnormals: -126)."""
    e = ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    return tl.minimum(tl.maximum(e, -126), 127)


@triton.jit
def _fp8_scale_exponent(x):
    """x [H, D] float32 -> int32 e [H] = ceil(log2(max|x| / 448)) in [-126, 127], exactly."""
    return ceil_log2(tl.math.div_rn(tl.max(tl.abs(x), 1), 448.0))  # IEEE division, as torch


@triton.jit
def pow2(e):
    """int32 e in [-126, 127] -> float32 2^e, built from its bits (exact)."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _store_fp8(Buf, Scale, dst, scale_dst, x, mask, h_mask):
    """Quantize x [H, D] float32 into the pool; returns its dequantized values (exact)."""
    e = _fp8_scale_exponent(x)  # [H]
    q = round_to_e4m3(tl.minimum(tl.maximum(x * pow2(-e)[:, None], -448.0), 448.0))
    tl.store(Buf + dst, q.to(Buf.dtype.element_ty), mask=mask)
    tl.store(Scale + scale_dst, e.to(tl.int8), mask=h_mask)
    return q * pow2(e)[:, None]


@triton.jit
def _kv_store_kernel(
    K,
    V,
    K_buf,
    V_buf,
    K_scale,
    V_scale,
    loc,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_buf_slot,
    stride_buf_head,
    stride_scale_slot,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    KV_FP8: tl.constexpr,
    WRITE_BACK: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(loc + t).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < NUM_HEADS) & (offs_d[None, :] < HEAD_DIM)
    t64 = t.to(tl.int64)
    k_ptrs = K + t64 * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :]
    v_ptrs = V + t64 * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :]
    k = tl.load(k_ptrs, mask=mask, other=0.0)  # padding lanes 0: the FP8 path's max|x|
    v = tl.load(v_ptrs, mask=mask, other=0.0)
    dst = slot * stride_buf_slot + offs_h[:, None] * stride_buf_head + offs_d[None, :]
    if KV_FP8:
        scale_dst = slot * stride_scale_slot + offs_h
        h_mask = offs_h < NUM_HEADS
        k_held = _store_fp8(K_buf, K_scale, dst, scale_dst, k.to(tl.float32), mask, h_mask)
        v_held = _store_fp8(V_buf, V_scale, dst, scale_dst, v.to(tl.float32), mask, h_mask)
        if WRITE_BACK:
            tl.store(k_ptrs, k_held.to(K.dtype.element_ty), mask=mask)
            tl.store(v_ptrs, v_held.to(V.dtype.element_ty), mask=mask)
    else:
        tl.store(K_buf + dst, k.to(K_buf.dtype.element_ty), mask=mask)
        tl.store(V_buf + dst, v.to(V_buf.dtype.element_ty), mask=mask)


def kv_store(
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    *,
    write_back: bool = False,
) -> None:
    """k_buf/v_buf [num_slots, Hkv, D]; loc [T] int; k/v [T, Hkv, D] (any row strides);
    `scales`: an FP8 pool's (k, v) exponents [num_slots, Hkv] int8, else None.
    `write_back`: k/v overwritten with the FP8 pool's dequantized values (see above)."""
    t, hkv, d = k.shape
    if write_back and (scales is None or not writes_back_exactly(k.dtype)):
        raise ValueError(f"write_back needs an FP8 pool and bfloat16 or float32 k/v, got {k.dtype}")
    if t == 0:
        return
    assert v.shape == k.shape and loc.shape == (t,), (k.shape, v.shape, loc.shape)
    assert k_buf.shape[1:] == (hkv, d) and v_buf.stride() == k_buf.stride()
    assert k.stride(2) == v.stride(2) == k_buf.stride(2) == 1
    k_scale, v_scale = scales if scales is not None else (k_buf, v_buf)  # unused if not FP8
    assert scales is None or (k_scale.stride() == v_scale.stride() and k_scale.stride(1) == 1)
    _kv_store_kernel[(t,)](
        k,
        v,
        k_buf,
        v_buf,
        k_scale,
        v_scale,
        loc,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_buf.stride(0),
        k_buf.stride(1),
        k_scale.stride(0),
        NUM_HEADS=hkv,
        HEAD_DIM=d,
        BLOCK_H=triton.next_power_of_2(hkv),
        BLOCK_D=triton.next_power_of_2(d),
        KV_FP8=scales is not None,
        WRITE_BACK=write_back,
    )


def writes_back_exactly(dtype: torch.dtype) -> bool:
    """Whether an FP8 pool's dequantized values are exact in `dtype` (`write_back`)."""
    return dtype in (torch.bfloat16, torch.float32)


def kv_store_ref(
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    if scales is None:
        k_buf[loc] = k.to(k_buf.dtype)
        v_buf[loc] = v.to(v_buf.dtype)
        return
    for buf, scale, x in ((k_buf, scales[0], k), (v_buf, scales[1], v)):
        q, e = quantize_kv(x)
        buf[loc] = q
        scale[loc] = e
