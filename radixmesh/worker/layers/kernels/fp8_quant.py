"""Per-token FP8 quantization of activations in one kernel, for the FP8 GEMM's input.

Row t of x [T, K] becomes q[t] = x[t] / a[t] in e4m3 with a[t] = max|x[t]| / 448 (at
least 1e-12), float32: `quantization/fp8.py`'s `quantize_rows`, bit for bit (IEEE
division, rounding to nearest even). One program per row reads it twice, once for the
maximum and once to quantize (the second read mostly from L2), instead of PyTorch's
six passes with float32 temporaries (cast, abs, max, divide, clamp, cast).

`token_scale` and `quantize_e4m3` are the same steps for the kernels that produce a
linear layer's input and quantize it on the way out (RMSNorm, SiLU-and-mul: their
`*_fp8` entry points), so those give this kernel's bits.

`static_fp8` quantizes with one scale given on the device (a checkpoint's static
activation scale, quantization/fp8_static.py): one read, no float32 temporary of the
rows (PyTorch's four passes would make one of T x K x 4 bytes: 470 MB for an 8,192-token
prefill into down_proj's 14,336 columns).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024
FP8 = torch.float8_e4m3fn


@triton.jit
def round_to_e4m3(x):
    """float32 x, |x| <= 448 -> the nearest e4m3 value (ties to even), still float32.

    Rounded here so that the cast to e4m3 is exact: triton's interpreter rounds that
    cast wrongly (ties away, and a carry out of the mantissa is lost: 31.5 -> 16), and
    the GPU's cast rounds to nearest even anyway, so both give torch's bits."""
    bits = x.to(tl.int32, bitcast=True)
    # Normal range: round the 23-bit mantissa to 3 bits; a carry moves into the exponent.
    normal = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000
    # Below 2^-6 (e4m3's subnormals, a fixed step of 2^-9): adding 1.5 * 2^14 leaves
    # float32 exactly that step, so the add rounds to it (to nearest even); the sign goes
    # back on by its bit (a value rounding to zero stays -0.0, as torch's cast keeps it).
    magnitude = ((tl.abs(x) + 24576.0) - 24576.0).to(tl.int32, bitcast=True)
    sub = magnitude | (bits & -2147483648)
    return tl.where(tl.abs(x) < 0.015625, sub, normal).to(tl.float32, bitcast=True)


@triton.jit
def token_scale(peak):
    """A row's scale from its largest |value| (float32): max(peak / 448, 1e-12), IEEE
    division, as `quantize_rows` computes it."""
    return tl.maximum(tl.math.div_rn(peak, 448.0), 1e-12)


@triton.jit
def quantize_e4m3(x, scale):
    """float32 x over its row's scale, clamped to +-448 and rounded to e4m3 (as float32:
    cast it to the e4m3 pointer's type to store it)."""
    return round_to_e4m3(tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -448.0), 448.0))


@triton.jit
def _per_token_fp8_kernel(X, Q, Scale, k, stride_x, stride_q, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    peak = tl.zeros([BLOCK], tl.float32)
    for k0 in range(0, k, BLOCK):
        mask = k0 + offs < k
        x = tl.load(X + row * stride_x + k0 + offs, mask=mask, other=0.0).to(tl.float32)
        peak = tl.maximum(peak, tl.abs(x))
    scale = token_scale(tl.max(peak, 0))
    tl.store(Scale + row, scale)
    for k0 in range(0, k, BLOCK):
        mask = k0 + offs < k
        x = tl.load(X + row * stride_x + k0 + offs, mask=mask, other=0.0).to(tl.float32)
        q = quantize_e4m3(x, scale)
        tl.store(Q + row * stride_q + k0 + offs, q.to(Q.dtype.element_ty), mask=mask)


def per_token_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] (unit column stride) -> (e4m3 [T, K], float32 scales [T])."""
    t, k = x.shape
    assert x.stride(1) == 1, x.stride()
    q = torch.empty((t, k), dtype=FP8, device=x.device)
    scale = torch.empty((t,), dtype=torch.float32, device=x.device)
    if t > 0 and k > 0:
        block = min(BLOCK, triton.next_power_of_2(k))
        _per_token_fp8_kernel[(t,)](
            x, q, scale, k, x.stride(0), q.stride(0), BLOCK=block, enable_fp_fusion=False
        )
    return q, scale


@triton.jit
def _static_fp8_kernel(X, Q, Scale, k, stride_x, stride_q, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    k0 = tl.program_id(1) * BLOCK
    offs = k0 + tl.arange(0, BLOCK)
    mask = offs < k
    scale = tl.load(Scale)
    x = tl.load(X + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Q + row * stride_q + offs, quantize_e4m3(x, scale).to(Q.dtype.element_ty), mask=mask)


def static_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [T, K] (unit column stride) over one float32 scale [] on x's device -> e4m3
    [T, K]: clamp(x / scale, -448, 448) rounded to nearest even, IEEE division, as
    fp8_static.py's `quantize_static` computes it in PyTorch. The scale is read on the
    device, so a CUDA graph replays with whatever it holds."""
    t, k = x.shape
    assert x.stride(1) == 1, x.stride()
    assert scale.numel() == 1 and scale.dtype == torch.float32, (scale.dtype, scale.shape)
    q = torch.empty((t, k), dtype=FP8, device=x.device)
    if t > 0 and k > 0:
        block = min(BLOCK, triton.next_power_of_2(k))
        _static_fp8_kernel[(t, triton.cdiv(k, block))](
            x, q, scale, k, x.stride(0), q.stride(0), BLOCK=block, enable_fp_fusion=False
        )
    return q
