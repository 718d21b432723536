"""The scales of a tensor-wise FP8 GEMM, applied after it in one pass.

An FP8 linear's product needs each row's activation scale a[t] (per token) and each
output channel's weight scale s[n]. `torch._scaled_mm` applies both inside the GEMM with
row-wise scaling, or takes one scale per operand (tensor-wise). The two are different
kernels: on the H200 (2026-12-04) cuBLAS's tensor-wise FP8 GEMM ran at 1.66x bf16's speed
on down (4,096 x 14,336) at 256 rows, where the row-wise one with its activation
quantization took 1.03x bf16's time (bench/results/fp8_gemm-h200.json, and a probe of the
tensor-wise GEMM on the same machine that day). So the tensor-wise path runs the GEMM
with unit scales into float32 and this kernel then writes y[t, n] = acc[t, n] * a[t] *
s[n] (+ bias[n]) in the output dtype, rounded once, as the row-wise epilogue does. Which
of the two a layer's calls take, per shape and row count, is measured at load
(quantization/fp8_gemm_choice.py): the extra pass over float32 [T, N] pays where N is
small (o, down) and not where it is large.

No FMA contraction (`enable_fp_fusion=False`): the result is the float32 expression above
in that order, bit for bit `scale_rows_cols_ref`'s.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_M = 16
BLOCK_N = 256


@triton.jit
def _scale_rows_cols_kernel(
    Acc,
    A,
    S,
    Bias,
    Out,
    M,
    N,
    stride_acc,
    stride_out,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < M
    col_mask = cols < N
    mask = row_mask[:, None] & col_mask[None, :]
    rows64 = rows.to(tl.int64)
    acc = tl.load(Acc + rows64[:, None] * stride_acc + cols[None, :], mask=mask, other=0.0)
    a = tl.load(A + rows, mask=row_mask, other=0.0)
    s = tl.load(S + cols, mask=col_mask, other=0.0)
    y = acc * a[:, None] * s[None, :]
    if HAS_BIAS:
        y = y + tl.load(Bias + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(
        Out + rows64[:, None] * stride_out + cols[None, :], y.to(Out.dtype.element_ty), mask=mask
    )


def scale_rows_cols(
    acc: torch.Tensor,
    a: torch.Tensor,
    s: torch.Tensor,
    bias: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """acc [M, N] float32 (unit column stride) -> acc * a[:, None] * s[None, :] (+ bias)
    in `dtype`, a new [M, N] tensor; a [M] and s [N] float32."""
    m, n = acc.shape
    if acc.dtype != torch.float32 or acc.stride(1) != 1:
        raise ValueError(f"acc must be float32 with unit column stride, got {acc.dtype}")
    if a.shape != (m,) or s.shape != (n,) or {a.dtype, s.dtype} != {torch.float32}:
        raise ValueError(f"scales must be float32 [{m}] and [{n}], got {a.shape} {s.shape}")
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"bias must be [{n}], got {tuple(bias.shape)}")
    out = torch.empty((m, n), dtype=dtype, device=acc.device)
    if m == 0 or n == 0:
        return out
    grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))
    _scale_rows_cols_kernel[grid](
        acc,
        a.contiguous(),
        s.contiguous(),
        acc if bias is None else bias.contiguous(),  # not read without HAS_BIAS
        out,
        m,
        n,
        acc.stride(0),
        out.stride(0),
        HAS_BIAS=bias is not None,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        num_warps=4,
        enable_fp_fusion=False,
    )
    return out


def scale_rows_cols_ref(
    acc: torch.Tensor,
    a: torch.Tensor,
    s: torch.Tensor,
    bias: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """`scale_rows_cols` in PyTorch: the same float32 operations in the same order."""
    y = acc * a[:, None] * s[None, :]
    if bias is not None:
        y = y + bias.float()[None, :]
    return y.to(dtype)
