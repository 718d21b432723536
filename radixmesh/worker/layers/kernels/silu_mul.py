"""SiLU-gated product over a fused [gate | up] projection: silu(gate) * up, one kernel.

silu(g) = g / (1 + exp(-g)) is computed in float32 and rounded to the input dtype, then
multiplied by up in float32 and rounded again: the two roundings of PyTorch's
`F.silu(gate) * up`. Only exp differs from PyTorch's (the GPU's fast exp2-based one, a few
float32 ulps off at large |g|), so a bfloat16 silu may round the other way now and then.
One program per (token, block of BLOCK output columns).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(GateUp, Out, d, stride_in, stride_out, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < d
    gate = tl.load(GateUp + t * stride_in + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(GateUp + t * stride_in + d + offs, mask=mask, other=0.0)
    dtype = Out.dtype.element_ty
    silu = tl.math.div_rn(gate, 1.0 + tl.exp(-gate)).to(dtype)  # IEEE division, as torch
    tl.store(
        Out + t * stride_out + offs, (silu.to(tl.float32) * up.to(tl.float32)).to(dtype), mask=mask
    )


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
