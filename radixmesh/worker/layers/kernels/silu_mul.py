"""SiLU-gated product over a fused [gate | up] projection: silu(gate) * up, one kernel.

silu(g) = g / (1 + exp(-g)) is computed in float32 and rounded to the input dtype, then
multiplied by up in float32 and rounded again: the two roundings of PyTorch's
`F.silu(gate) * up`. Only exp differs from PyTorch's (the GPU's fast exp2-based one, a few
float32 ulps off at large |g|), so a bfloat16 silu may round the other way now and then.
One program per (token, block of BLOCK output columns).

`silu_and_mul_fp8` writes the product as e4m3 with one float32 scale per row instead (its
consumer, the down projection, is an FP8 linear on the `_scaled_mm` path): one program
per row makes two passes over its column blocks, the first for the largest |product|,
the second to compute the products again and store them quantized (the second read of
[gate | up] mostly from L2), as `fp8_quant.py` reads its input twice. Each product is
rounded to the input dtype first, as the 16-bit output is, so the e4m3 values and scales
are bit for bit those of `silu_and_mul` followed by the quantization kernel. Unlike
RMSNorm's sum, nothing here depends on the register layout that the e4m3 store may give
the product (each value is computed alone, and a maximum is the same in any order); at
the default launch both kernels hold 8 values a thread anyway (test_fused_fp8_layouts.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixmesh.worker.layers.kernels.fp8_quant import quantize_e4m3, token_scale

BLOCK = 1024
# The quantizing kernel's column block and warps (a program loops over a row's blocks).
FP8_BLOCK, FP8_WARPS = 1024, 4
FP8 = torch.float8_e4m3fn


@triton.jit
def _silu_mul(Row, offs, mask, d):
    """silu(gate) * up at columns `offs` of one [gate | up] row, rounded to its dtype (0
    where masked)."""
    dtype = Row.dtype.element_ty
    gate = tl.load(Row + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(Row + d + offs, mask=mask, other=0.0)
    silu = tl.math.div_rn(gate, 1.0 + tl.exp(-gate)).to(dtype)  # IEEE division, as torch
    return (silu.to(tl.float32) * up.to(tl.float32)).to(dtype)


@triton.jit
def _silu_and_mul_kernel(GateUp, Out, d, stride_in, stride_out, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < d
    tl.store(
        Out + t * stride_out + offs, _silu_mul(GateUp + t * stride_in, offs, mask, d), mask=mask
    )


@triton.jit
def _silu_and_mul_fp8_kernel(GateUp, Q, Scale, d, stride_in, stride_q, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    row = GateUp + t * stride_in
    offs = tl.arange(0, BLOCK)
    peak = tl.zeros([BLOCK], tl.float32)
    for c0 in range(0, d, BLOCK):
        y = _silu_mul(row, c0 + offs, c0 + offs < d, d).to(tl.float32)
        peak = tl.maximum(peak, tl.abs(y))
    scale = token_scale(tl.max(peak, 0))
    tl.store(Scale + t, scale)
    for c0 in range(0, d, BLOCK):
        mask = c0 + offs < d
        q = quantize_e4m3(_silu_mul(row, c0 + offs, mask, d).to(tl.float32), scale)
        tl.store(Q + t * stride_q + c0 + offs, q.to(Q.dtype.element_ty), mask=mask)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [..., 2d] (unit column stride) -> silu(gate) * up [..., d], a new tensor."""
    d = gate_up.shape[-1] // 2
    assert gate_up.shape[-1] == 2 * d, gate_up.shape
    rows = gate_up.reshape(-1, 2 * d)  # a view for the contiguous rows the model passes
    assert rows.stride(-1) == 1
    out = torch.empty((rows.shape[0], d), dtype=gate_up.dtype, device=gate_up.device)
    if rows.shape[0] > 0 and d > 0:
        _silu_and_mul_kernel[(rows.shape[0], triton.cdiv(d, BLOCK))](
            rows,
            out,
            d,
            rows.stride(0),
            out.stride(0),
            BLOCK=BLOCK,
            num_warps=4,
            enable_fp_fusion=False,
        )
    return out.view(*gate_up.shape[:-1], d)


def silu_and_mul_fp8(
    gate_up: torch.Tensor, *, block: int = FP8_BLOCK, num_warps: int = FP8_WARPS
) -> tuple[torch.Tensor, torch.Tensor]:
    """gate_up [..., 2d] (unit column stride) -> silu(gate) * up quantized per row:
    (e4m3 [rows, d], float32 scales [rows]), equal to `quantize_rows(silu_and_mul(gate_up))`
    bit for bit. `block` and `num_warps`: the launch (bench.fused_ops compares a few)."""
    d = gate_up.shape[-1] // 2
    assert gate_up.shape[-1] == 2 * d, gate_up.shape
    rows = gate_up.reshape(-1, 2 * d)
    assert rows.stride(-1) == 1
    q = torch.empty((rows.shape[0], d), dtype=FP8, device=gate_up.device)
    scale = torch.empty((rows.shape[0],), dtype=torch.float32, device=gate_up.device)
    if rows.shape[0] > 0 and d > 0:
        _silu_and_mul_fp8_kernel[(rows.shape[0],)](
            rows,
            q,
            scale,
            d,
            rows.stride(0),
            q.stride(0),
            BLOCK=min(block, triton.next_power_of_2(d)),
            num_warps=num_warps,
            enable_fp_fusion=False,
        )
    return q, scale
