"""RMSNorm of each row, alone or fused with the residual add before it.

One program per row holds the whole row in one block (BLOCK = next power of two of the
hidden size, at most MAX_NORM_HIDDEN): the row is read once and written once, with no
second pass. `fused_add_rms_norm` first forms s = x + residual rounded to the input
dtype (as PyTorch's `residual + x` rounds it), stores s into `residual` in place, then
normalizes s; the normed rows always go to a new tensor, so `x` is left as it was.
Statistics and the weight multiply are in float32: (s * rsqrt(mean(s^2) + eps)) * w,
rounded once to x's dtype, as `F.rms_norm` computes it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixmesh.worker.layers.kernels import MAX_NORM_HIDDEN


@triton.jit
def _rms_norm_kernel(
    X,
    Residual,
    Weight,
    Out,
    stride_x,
    stride_r,
    stride_out,
    eps,
    HIDDEN: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < HIDDEN
    x = tl.load(X + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(Residual + row * stride_r + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
        tl.store(Residual + row * stride_r + offs, x, mask=mask)
    xf = x.to(tl.float32)
    mean_sq = tl.math.div_rn(tl.sum(xf * xf, axis=0), HIDDEN)  # IEEE division, as torch
    rstd = tl.math.rsqrt(mean_sq + eps)
    w = tl.load(Weight + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Out + row * stride_out + offs, (xf * rstd * w).to(Out.dtype.element_ty), mask=mask)


def _launch(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    hidden = x.shape[-1]
    if hidden > MAX_NORM_HIDDEN:
        raise ValueError(f"hidden size {hidden} > {MAX_NORM_HIDDEN}: use the PyTorch path")
    assert weight.shape == (hidden,), (weight.shape, hidden)
    x2 = x.reshape(-1, hidden)  # a view for the contiguous rows the model passes
    r2 = x2 if residual is None else residual.view(-1, hidden)  # in place: must be a view
    assert x2.stride(-1) == r2.stride(-1) == 1 and r2.shape == x2.shape and r2.dtype == x.dtype
    out = torch.empty_like(x2, memory_format=torch.contiguous_format)
    if x2.shape[0] == 0:
        return out.view(x.shape)
    block = triton.next_power_of_2(hidden)
    _rms_norm_kernel[(x2.shape[0],)](
        x2,
        r2,
        weight,
        out,
        x2.stride(0),
        r2.stride(0),
        out.stride(0),
        eps,
        HIDDEN=hidden,
        HAS_RESIDUAL=residual is not None,
        BLOCK=block,
        num_warps=min(max(block // 512, 1), 16),
        enable_fp_fusion=False,
    )
    return out.view(x.shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x [..., hidden] (rows with unit stride) times weight [hidden]; a new tensor."""
    return _launch(x, None, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """residual += x in place (rounded to the dtype), then RMSNorm of it into a new tensor."""
    return _launch(x, residual, weight, eps)
