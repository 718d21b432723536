"""FP8 weights times a few rows of activations: the decode-time FP8 GEMM, weight-only.

At decode a batch has a handful of rows and the GEMM is bound by reading the weights, so
FP8 should halve its time. `torch._scaled_mm` does not get there at such shapes: its
kernels are tiled for large M, and each call first quantizes the activations (a kernel
of its own). This kernel reads the e4m3 weights once, converts them in registers to the
activations' dtype and multiplies with the activations as they are (no activation
quantization: w8a16), accumulating in float32, then applies the per-output-channel scale
and the bias:

    out[m, n] = (sum_k x[m, k] * q[n, k]) * scale[n] + bias[n]

One program per block of BLOCK_N output columns; the rows (at most BLOCK_M) share each
weight tile, so the weights are read once whatever the row count. `tl.dot` needs 16 rows;
missing rows are masked to zero.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Rows this kernel serves: a decode batch up to this size takes it, larger ones the GEMM.
MAX_ROWS = 16
BLOCK_N = 32
BLOCK_K = 256


@triton.jit
def _fp8_small_m_kernel(
    X,
    W,
    Scale,
    Bias,
    Out,
    m,
    n,
    k,
    stride_x,
    stride_w,
    stride_out,
    HAS_BIAS: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    row_ok = offs_m < m
    col_ok = offs_n < n
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k, BLOCK_K):
        kk = k0 + offs_k
        k_ok = kk < k
        x = tl.load(
            X + offs_m[:, None] * stride_x + kk[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        w = tl.load(
            W + offs_n.to(tl.int64)[:, None] * stride_w + kk[None, :],
            mask=col_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        if IEEE:  # float32 activations: exact float32 products, not tf32
            acc += tl.dot(x, tl.trans(w.to(x.dtype)), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w.to(x.dtype)))
    scale = tl.load(Scale + offs_n, mask=col_ok, other=0.0)
    acc = acc * scale[None, :]
    if HAS_BIAS:
        acc += tl.load(Bias + offs_n, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    out = Out + offs_m[:, None] * stride_out + offs_n[None, :]
    tl.store(out, acc.to(Out.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def fp8_small_m_linear(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [T, in] (T <= MAX_ROWS, unit column stride) times e4m3 q [out, in] with float32
    per-row scales [out] (+ bias [out]) -> [T, out] in x's dtype."""
    t, k = x.shape
    n = q.shape[0]
    assert t <= MAX_ROWS and x.stride(1) == 1 and q.stride(1) == 1, (x.shape, x.stride())
    out = torch.empty((t, n), dtype=x.dtype, device=x.device)
    if t == 0 or n == 0:
        return out
    _fp8_small_m_kernel[(triton.cdiv(n, BLOCK_N),)](
        x,
        q,
        scale,
        bias if bias is not None else scale,  # unused without HAS_BIAS
        out,
        t,
        n,
        k,
        x.stride(0),
        q.stride(0),
        out.stride(0),
        HAS_BIAS=bias is not None,
        IEEE=x.dtype == torch.float32,
        BLOCK_M=MAX_ROWS,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
        num_warps=4,
        num_stages=4,
    )
    return out
