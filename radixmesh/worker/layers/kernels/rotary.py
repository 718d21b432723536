"""Rotary embedding in place: q and k heads [T, H, D] rotated by cos/sin [T, 1, D].

The tables are RotaryEmbedding's full-width ones (sin carries the rotation's sign), so
with x = [x1 | x2] the result is [x1 * cos1 + x2 * sin1 | x2 * cos2 + x1 * sin2], the
halves of `apply_rotary`'s x * cos + [x2 | x1] * sin. Each product and the sum are
rounded to x's dtype, as the three PyTorch ops round them, and the kernel is compiled
without mul-add fusion, so the result equals `apply_rotary` bit for bit.

`norm_rotary_` first norms each head's row (Qwen3's q and k norms: RMSNorm over the head
size, one weight for the q heads and one for the k heads), rounding it to x's dtype as
the norm kernel does, then rotates it: one kernel for what was two norms, their copies and
the rotary.

One program per (token, block of heads) loads its rows completely before it stores
them, so rotating in place is safe. x may be a view with any token and head strides
(q and k inside the fused qkv output); its head dim must be contiguous.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _mul_add(a, cos, b, sin, DTYPE: tl.constexpr):
    """a * cos + b * sin, each product and the sum rounded to DTYPE."""
    ac = (a.to(tl.float32) * cos.to(tl.float32)).to(DTYPE)
    bs = (b.to(tl.float32) * sin.to(tl.float32)).to(DTYPE)
    return (ac.to(tl.float32) + bs.to(tl.float32)).to(DTYPE)


@triton.jit
def _rotary_kernel(
    X,
    Cos,
    Sin,
    WeightQ,
    WeightK,
    num_heads,
    num_q_heads,
    stride_xt,
    stride_xh,
    stride_cos,
    stride_sin,
    eps,
    NORM: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask_d = offs_d < HALF
    mask = (offs_h[:, None] < num_heads) & mask_d[None, :]
    cos = Cos + t * stride_cos + offs_d
    sin = Sin + t * stride_sin + offs_d
    cos1 = tl.load(cos, mask=mask_d, other=0.0)[None, :]
    cos2 = tl.load(cos + HALF, mask=mask_d, other=0.0)[None, :]
    sin1 = tl.load(sin, mask=mask_d, other=0.0)[None, :]
    sin2 = tl.load(sin + HALF, mask=mask_d, other=0.0)[None, :]
    x1_ptr = X + t * stride_xt + offs_h[:, None] * stride_xh + offs_d[None, :]
    x1 = tl.load(x1_ptr, mask=mask, other=0.0)  # [BLOCK_H, BLOCK_HALF]
    x2 = tl.load(x1_ptr + HALF, mask=mask, other=0.0)
    dtype = X.dtype.element_ty
    if NORM:
        # RMSNorm of each head's row (both halves), float32 statistics, the weight
        # multiply in float32 and one rounding: layers/kernels/rms_norm.py's formula.
        x1f, x2f = x1.to(tl.float32), x2.to(tl.float32)
        sum_sq = tl.sum(x1f * x1f, axis=1) + tl.sum(x2f * x2f, axis=1)
        rstd = tl.math.rsqrt(tl.math.div_rn(sum_sq, 2 * HALF) + eps)[:, None]
        is_q = (offs_h < num_q_heads)[:, None]
        wq1 = tl.load(WeightQ + offs_d, mask=mask_d, other=0.0).to(tl.float32)[None, :]
        wq2 = tl.load(WeightQ + HALF + offs_d, mask=mask_d, other=0.0).to(tl.float32)[None, :]
        wk1 = tl.load(WeightK + offs_d, mask=mask_d, other=0.0).to(tl.float32)[None, :]
        wk2 = tl.load(WeightK + HALF + offs_d, mask=mask_d, other=0.0).to(tl.float32)[None, :]
        x1 = (x1f * rstd * tl.where(is_q, wq1, wk1)).to(dtype)
        x2 = (x2f * rstd * tl.where(is_q, wq2, wk2)).to(dtype)
    tl.store(x1_ptr, _mul_add(x1, cos1, x2, sin1, dtype), mask=mask)
    tl.store(x1_ptr + HALF, _mul_add(x2, cos2, x1, sin2, dtype), mask=mask)


def rotary_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate x [T, H, D] in place by cos/sin [T, 1, D] (RotaryEmbedding's tables)."""
    _launch(x, cos, sin, None)


def norm_rotary_(
    x: torch.Tensor,
    num_q_heads: int,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> None:
    """Qwen3's per-head RMSNorm, then rotary, in place: x [T, Hq + Hkv, D] (q heads first,
    any token/head strides, the head dim contiguous), each q head normed with q_weight [D]
    and each k head with k_weight [D], then rotated by cos/sin [T, 1, D]."""
    d = x.shape[2]
    assert q_weight.shape == k_weight.shape == (d,) and 0 <= num_q_heads <= x.shape[1]
    _launch(x, cos, sin, (num_q_heads, q_weight, k_weight, eps))


def _launch(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    norm: tuple[int, torch.Tensor, torch.Tensor, float] | None,
) -> None:
    """The kernel over x [T, H, D]; `norm`: (q heads, q weight, k weight, eps) to norm
    each head first."""
    t, h, d = x.shape
    assert d % 2 == 0 and cos.shape == sin.shape == (t, 1, d), (x.shape, cos.shape, sin.shape)
    assert cos.dtype == sin.dtype == x.dtype, (x.dtype, cos.dtype, sin.dtype)
    assert x.stride(2) == cos.stride(2) == sin.stride(2) == 1
    if t == 0 or h == 0:
        return
    num_q_heads, q_weight, k_weight, eps = norm if norm is not None else (0, x, x, 0.0)
    half = d // 2
    block_half = triton.next_power_of_2(half)
    # About 2K elements per program: a decode step's 40 heads of 128 dims are 3 programs.
    block_h = min(triton.next_power_of_2(h), max(1, 1024 // block_half))
    _rotary_kernel[(t, triton.cdiv(h, block_h))](
        x,
        cos,
        sin,
        q_weight,
        k_weight,
        h,
        num_q_heads,
        x.stride(0),
        x.stride(1),
        cos.stride(0),
        sin.stride(0),
        eps,
        NORM=norm is not None,
        HALF=half,
        BLOCK_H=block_h,
        BLOCK_HALF=block_half,
        num_warps=4,
        enable_fp_fusion=False,
    )
